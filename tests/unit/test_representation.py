"""Unit tests for FedModel's representation branch (FedMuscle, docs/ALGORITHMS.md §14), resnet8."""

from __future__ import annotations

import pytest
import torch

from raymtl.models import MODELS, FedModel, build_model, num_params

SHAPE = (1, 28, 28)
NUM_CLASSES = 10
DIM = 256
# Every registered model of images except ResNet-18 (slow, and its BL-1 feature map is 16,384
# wide); FedMuscle, the one user of representations, refuses token ids.
NAMES = sorted(name for name in MODELS if name != "resnet18" and "images" in MODELS[name].inputs)


def built(name: str, seed: int = 0) -> FedModel:
    torch.manual_seed(seed)
    return build_model(name, SHAPE, NUM_CLASSES)


def with_branch(name: str, seed: int = 0) -> FedModel:
    model = built(name, seed)
    model.add_representation(DIM)
    return model


def test_every_expected_model_is_covered() -> None:
    assert {"mlp", "logreg", "small_cnn", "cnn_mnist", "cnn_sheaf", "resnet8"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_represent_gives_unit_rows_of_dim(name: str) -> None:
    model = with_branch(name)
    z = model.represent(torch.randn(4, *SHAPE))
    assert z.shape == (4, DIM)
    torch.testing.assert_close(z.norm(dim=1), torch.ones(4))
    assert model.projection.in_features == model.feature_dim
    assert model(torch.randn(2, *SHAPE)).shape == (2, NUM_CLASSES)  # forward unchanged


@pytest.mark.parametrize("name", NAMES)
def test_representation_parameters_are_backbone_and_projection(name: str) -> None:
    model = with_branch(name)
    chosen = {id(parameter) for parameter in model.representation_parameters()}
    named = dict(model.named_parameters())
    for param_name, parameter in named.items():
        expected = param_name.startswith(("backbone.", "projection."))
        assert (id(parameter) in chosen) == expected, param_name
        assert param_name.startswith(("backbone.", "head.", "projection."))
    assert len(chosen) == len(model.representation_parameters())  # no duplicates
    assert any(param_name.startswith("projection.") for param_name in named)


@pytest.mark.parametrize("name", NAMES)
def test_loss_on_representation_leaves_head_without_grad(name: str) -> None:
    model = with_branch(name)
    model.represent(torch.randn(3, *SHAPE)).sum().backward()
    for param_name, parameter in model.named_parameters():
        if param_name.startswith("head."):
            assert parameter.grad is None, param_name
    assert all(parameter.grad is not None for parameter in model.projection.parameters())


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_without_branch_is_backbone_and_head_only(name: str) -> None:
    model = built(name)
    assert model.projection is None
    assert "projection" not in dict(model.named_children())
    assert all(key.startswith(("backbone.", "head.")) for key in model.state_dict())
    before = list(model.state_dict())
    model.add_representation(DIM)
    after = list(model.state_dict())
    assert after[: len(before)] == before
    assert after[len(before) :] == ["projection.weight", "projection.bias"]


@pytest.mark.parametrize("name", ["mlp", "resnet8"])
def test_same_seed_same_projection_init(name: str) -> None:
    first, second, other = with_branch(name, 7), with_branch(name, 7), with_branch(name, 8)
    for key, value in first.state_dict().items():
        torch.testing.assert_close(value, second.state_dict()[key])
    assert not torch.equal(first.projection.weight, other.projection.weight)


def test_projection_follows_model_dtype() -> None:
    model = built("mlp").double()
    model.add_representation(8)
    assert model.projection.weight.dtype == torch.float64
    assert model.represent(torch.randn(2, *SHAPE, dtype=torch.float64)).dtype == torch.float64


def test_add_representation_replaces_existing_branch() -> None:
    model = with_branch("mlp")
    model.add_representation(16)
    assert model.represent(torch.randn(2, *SHAPE)).shape == (2, 16)
    assert [key for key in model.state_dict() if key.startswith("projection.")] == [
        "projection.weight",
        "projection.bias",
    ]


def test_represent_without_branch_raises() -> None:
    model = built("mlp")
    with pytest.raises(RuntimeError, match="add_representation"):
        model.represent(torch.randn(2, *SHAPE))
    with pytest.raises(RuntimeError, match="add_representation"):
        model.representation_parameters()


@pytest.mark.parametrize("dim", [0, -3, 2.5, True, "256", None])
def test_bad_dim_raises_one_line_value_error(dim: object) -> None:
    model = built("mlp")
    with pytest.raises(ValueError, match="model.representation_dim:") as error:
        model.add_representation(dim)  # type: ignore[arg-type]
    assert "\n" not in str(error.value)
    assert model.projection is None


@pytest.mark.parametrize(
    ("input_shape", "count"), [((1, 28, 28), 77_754), ((3, 32, 32), 77_754 + 2 * 9 * 16)]
)
def test_resnet8_shapes_and_parameter_count(input_shape: tuple, count: int) -> None:
    model = build_model("resnet8", input_shape, NUM_CLASSES)
    batch = torch.randn(2, *input_shape)
    assert model(batch).shape == (2, NUM_CLASSES)
    assert model.features(batch).shape == (2, 64)
    assert model.feature_dim == 64
    assert num_params(model) == count
    assert num_params(model.head) == 64 * NUM_CLASSES + NUM_CLASSES


def test_resnet8_structure() -> None:
    from torchvision.models.resnet import BasicBlock

    model = build_model("resnet8", SHAPE, NUM_CLASSES)
    blocks = [model.backbone.layer1, model.backbone.layer2, model.backbone.layer3]
    assert all(isinstance(block, BasicBlock) for block in blocks)
    assert [block.conv2.out_channels for block in blocks] == [16, 32, 64]
    assert [block.conv1.stride for block in blocks] == [(1, 1), (2, 2), (2, 2)]
    assert model.backbone.layer1.downsample is None
    assert model.backbone.layer2.downsample[0].kernel_size == (1, 1)
    assert model.backbone.conv1.kernel_size == (3, 3)
    assert model.common_prefixes() == (
        "backbone.conv1",
        "backbone.bn1",
        "backbone.layer1",
        "backbone.layer2",
        "backbone.layer3",
    )


@pytest.mark.parametrize(("split", "feature_dim"), [("BL-0", 512), ("BL-1", 256 * 8 * 8)])
def test_resnet18_represents_its_flattened_feature_map(split: str, feature_dim: int) -> None:
    model = build_model("resnet18", (3, 32, 32), NUM_CLASSES, split=split)
    model.add_representation(DIM)
    assert model.projection.in_features == feature_dim
    z = model.represent(torch.randn(2, 3, 32, 32))
    assert z.shape == (2, DIM)
    torch.testing.assert_close(z.norm(dim=1), torch.ones(2))
