"""Unit tests for raymtl.models: shapes, parameter naming, splits and validation."""

from __future__ import annotations

import pytest
import torch

from raymtl.models import MODELS, FedModel, build_model, num_params, register_model

INPUT_SHAPES = [(1, 8, 8), (1, 28, 28), (3, 32, 32)]
NUM_CLASSES = 10
# ResNet-18 at 28x28 adds nothing the other two shapes don't cover and is the slowest case;
# the official Sheaf-FMTL CNN (two unpadded 3x3 convs) needs at least 10x10.
TOO_SMALL = {("resnet18", (1, 28, 28)), ("cnn_sheaf", (1, 8, 8))}
# A model of token ids reads (1, 1, L) windows of ids, not images.
TOKEN_SHAPE = (1, 1, 80)
CASES = [
    (name, shape)
    for name in sorted(MODELS)
    for shape in (INPUT_SHAPES if "images" in MODELS[name].inputs else [TOKEN_SHAPE])
    if (name, shape) not in TOO_SMALL
]


def batch_for(name: str, input_shape: tuple[int, int, int]) -> torch.Tensor:
    """Two samples of what model `name` reads: random pixels, or random token ids."""
    if "images" in MODELS[name].inputs:
        return torch.randn(2, *input_shape)
    return torch.randint(0, 10, (2, *input_shape)).float()


@pytest.mark.parametrize(
    ("name", "input_shape"),
    CASES,
    ids=[f"{name}-{'x'.join(map(str, shape))}" for name, shape in CASES],
)
def test_output_and_feature_shapes(name: str, input_shape: tuple[int, int, int]) -> None:
    model = build_model(name, input_shape, NUM_CLASSES)
    batch = batch_for(name, input_shape)
    assert isinstance(model, FedModel)
    assert model(batch).shape == (2, NUM_CLASSES)
    assert model.features(batch).shape == (2, model.feature_dim)
    assert model.head(model.backbone(batch)).shape == (2, NUM_CLASSES)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parameter_names_and_common_prefixes(name: str) -> None:
    model = build_model(name, (1, 8, 8) if name != "cnn_sheaf" else (1, 28, 28), NUM_CLASSES)
    names = [param_name for param_name, _ in model.named_parameters()]
    assert all(param_name.startswith(("backbone.", "head.")) for param_name in names)
    assert any(param_name.startswith("head.") for param_name in names)
    for prefix in model.common_prefixes():
        assert any(param_name.startswith(prefix + ".") for param_name in names), prefix


def test_cnn_shares_convolutions_but_not_fc() -> None:
    model = build_model("cnn_mnist", (1, 28, 28), NUM_CLASSES)
    assert model.common_prefixes() == ("backbone.features",)
    assert model.backbone.fc.in_features == 64 * 7 * 7
    assert build_model("cnn_mnist", (1, 8, 8), NUM_CLASSES).backbone.fc.in_features == 64 * 2 * 2


def test_mlp_hidden_parameter() -> None:
    model = build_model("mlp", (1, 28, 28), NUM_CLASSES, hidden=16)
    assert model.feature_dim == 16
    assert num_params(model) == 784 * 16 + 16 + 16 * NUM_CLASSES + NUM_CLASSES
    assert MODELS["mlp"].params == {"hidden": 32}


def test_logreg_num_params_hand_computed() -> None:
    model = build_model("logreg", (1, 8, 8), NUM_CLASSES)
    assert num_params(model) == 64 * 10 + 10
    assert model.common_prefixes() == ()
    assert model.feature_dim == 64


@pytest.mark.parametrize(
    ("split", "backbone_stage", "head_stages"),
    [
        ("BL-0", "layer4", ["fc"]),
        ("BL-1", "layer3", ["layer4", "fc"]),
        ("BL-2", "layer2", ["layer3", "layer4", "fc"]),
    ],
)
def test_resnet_split_places_stages(split: str, backbone_stage: str, head_stages: list[str]):
    model = build_model("resnet18", (3, 32, 32), NUM_CLASSES, split=split)
    names = [param_name for param_name, _ in model.named_parameters()]
    assert any(param_name.startswith(f"backbone.{backbone_stage}.") for param_name in names)
    for stage in head_stages:
        assert any(param_name.startswith(f"head.{stage}.") for param_name in names)
        assert not any(param_name.startswith(f"backbone.{stage}.") for param_name in names)
    assert "backbone.conv1" in model.common_prefixes()
    assert not any(prefix.startswith("head.") for prefix in model.common_prefixes())


def test_resnet_stem_and_feature_dims() -> None:
    model = build_model("resnet18", (1, 32, 32), NUM_CLASSES, split="BL-1")
    assert model.backbone.conv1.in_channels == 1
    assert model.backbone.conv1.kernel_size == (3, 3)
    assert model.feature_dim == 256 * 8 * 8  # layer3 output map, flattened
    assert build_model("resnet18", (3, 32, 32), NUM_CLASSES, split="BL-0").feature_dim == 512


@pytest.mark.parametrize(
    ("args", "params", "message"),
    [
        (("foo", (1, 8, 8), 10), {}, "model.name: 'foo' is not one of"),
        (("resnet18", (3, 32, 32), 10), {"split": "BL-3"}, "model.params.split:"),
        (("mlp", (1, 8, 8), 10), {"hidden": 0}, "model.params.hidden:"),
        (("cnn_mnist", (1, 8, 8), 10), {"hidden": 8}, "model.params.hidden: not a parameter"),
        (("cnn_cifar", (3, 4, 4), 10), {}, "input_shape:"),
        (("logreg", (8, 8), 10), {}, "input_shape:"),
        (("logreg", (1, 8, 8), 0), {}, "num_classes:"),
    ],
)
def test_bad_input_raises_one_line_value_error(args: tuple, params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        build_model(*args, **params)
    assert "\n" not in str(error.value)


class _Flat(FedModel):
    def __init__(self, input_shape, num_classes, width: int = 3):
        size = input_shape[0] * input_shape[1] * input_shape[2]
        backbone = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(size, width))
        super().__init__(backbone, torch.nn.Linear(width, num_classes), width)


@pytest.fixture
def registered_models():
    before = dict(MODELS)
    yield
    MODELS.clear()
    MODELS.update(before)


def test_register_model_records_params_and_accepts_the_same_class_again(registered_models):
    flat = type("Flat", (_Flat,), {"name": "flat_test", "description": "a test model"})
    assert register_model(flat) is flat and register_model(flat) is flat
    assert flat.params == {"width": 3}
    model = build_model("flat_test", (1, 4, 4), 5, width=7)
    assert model(torch.zeros(2, 1, 4, 4)).shape == (2, 5) and model.feature_dim == 7
    other = type("Other", (_Flat,), {"name": "flat_test"})
    with pytest.raises(ValueError, match="model.name: 'flat_test' is registered twice"):
        register_model(other)


def test_a_model_that_breaks_the_contract_is_refused(registered_models):
    class Nameless(_Flat):
        pass

    class NoDefault(FedModel):
        name = "no_default"

        def __init__(self, input_shape, num_classes, width):
            super().__init__(torch.nn.Flatten(), torch.nn.Identity(), width)

    class Backwards(FedModel):
        name = "backwards"

        def __init__(self, num_classes, input_shape):
            super().__init__(torch.nn.Flatten(), torch.nn.Identity(), 1)

    problems = {
        Nameless: "declares no `name`",
        NoDefault: "parameter 'width' needs a default",
        Backwards: "__init__ must take (self, input_shape, num_classes, **params)",
        torch.nn.Linear: "is not a subclass of raymtl's FedModel",
    }
    for cls, problem in problems.items():
        with pytest.raises(ValueError) as error:
            register_model(cls)
        assert problem in str(error.value) and "\n" not in str(error.value)
