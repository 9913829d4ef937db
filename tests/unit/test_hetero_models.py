"""Unit tests for the Sheaf-FMTL heterogeneous CNNs (small_cnn, medium_cnn, large_cnn)."""

from __future__ import annotations

import pytest
import torch

from raymtl.models import MODELS, FedModel, build_model, num_params

NAMES = ["small_cnn", "medium_cnn", "large_cnn"]  # in increasing size
INPUT_SHAPES = [(1, 28, 28), (3, 32, 32)]
NUM_CLASSES = 10

# Hand count on 3x32x32, 10 classes (conv = in*out*5*5 + out; linear = in*out + out;
# 'same' convs keep the side, each 2x2 pool halves it: 32 -> 16 -> 8):
#   small:  conv 3*16*25+16 = 1216; head 16*16*16*10+10 = 40970          -> 42186
#   medium: conv 3*24*25+24 = 1824; conv 24*48*25+48 = 28848;
#           head 48*8*8*10+10 = 30730                                     -> 61402
#   large:  conv 3*32*25+32 = 2432; conv 32*64*25+64 = 51264;
#           fc 64*8*8*120+120 = 491640; head 120*10+10 = 1210             -> 546546
CIFAR_COUNTS = {"small_cnn": 42186, "medium_cnn": 61402, "large_cnn": 546546}


@pytest.mark.parametrize("input_shape", INPUT_SHAPES, ids=["1x28x28", "3x32x32"])
@pytest.mark.parametrize("name", NAMES)
def test_output_and_feature_shapes(name: str, input_shape: tuple[int, int, int]) -> None:
    model = build_model(name, input_shape, NUM_CLASSES)
    batch = torch.randn(4, *input_shape)
    assert isinstance(model, FedModel)
    assert model(batch).shape == (4, NUM_CLASSES)
    assert model.features(batch).shape == (4, model.feature_dim)
    assert model.head.in_features == model.feature_dim


@pytest.mark.parametrize("input_shape", INPUT_SHAPES, ids=["1x28x28", "3x32x32"])
def test_sizes_strictly_increase(input_shape: tuple[int, int, int]) -> None:
    counts = [num_params(build_model(name, input_shape, NUM_CLASSES)) for name in NAMES]
    assert counts[0] < counts[1] < counts[2]


@pytest.mark.parametrize("name", NAMES)
def test_cifar_param_counts_hand_computed(name: str) -> None:
    assert num_params(build_model(name, (3, 32, 32), NUM_CLASSES)) == CIFAR_COUNTS[name]


@pytest.mark.parametrize("name", NAMES)
def test_keys_are_backbone_or_head(name: str) -> None:
    model = build_model(name, (3, 32, 32), NUM_CLASSES)
    keys = list(model.state_dict())
    assert all(key.startswith(("backbone.", "head.")) for key in keys)
    assert {key for key in keys if key.startswith("head.")} == {"head.weight", "head.bias"}
    assert model.common_prefixes() == ("backbone.features",)


def test_large_cnn_keeps_fc120_in_backbone() -> None:
    model = build_model("large_cnn", (1, 28, 28), NUM_CLASSES)
    assert model.feature_dim == 120
    assert model.backbone.fc.out_features == 120
    assert model.backbone.fc.in_features == 64 * 7 * 7


@pytest.mark.parametrize(
    ("name", "input_shape"),
    [("small_cnn", (1, 1, 5)), ("medium_cnn", (3, 3, 32)), ("large_cnn", (1, 28, 3))],
)
def test_too_small_input_is_refused(name: str, input_shape: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError, match=r"^input_shape: .* too small for " + name):
        build_model(name, input_shape, NUM_CLASSES)


@pytest.mark.parametrize(
    ("name", "input_shape"), [("small_cnn", (1, 2, 2)), ("medium_cnn", (3, 4, 4))]
)
def test_smallest_accepted_inputs(name: str, input_shape: tuple[int, int, int]) -> None:
    model = build_model(name, input_shape, NUM_CLASSES)
    assert model(torch.randn(1, *input_shape)).shape == (1, NUM_CLASSES)


def test_registered_without_parameters() -> None:
    for name in NAMES:
        assert MODELS[name].name == name
        assert MODELS[name].params == {}
        assert MODELS[name].description
    model = build_model("small_cnn", (1, 28, 28), NUM_CLASSES)
    assert model.feature_dim == 16 * 14 * 14
    with pytest.raises(ValueError, match=r"^model.params.hidden: not a parameter of small_cnn"):
        build_model("small_cnn", (1, 28, 28), NUM_CLASSES, hidden=8)


def test_the_official_rotated_mnist_cnn_has_34826_parameters():
    from raymtl.models import num_params

    # conv 32·9+32 = 320, conv 64·32·9+64 = 18,496, linear 1600·10+10 = 16,010
    model = build_model("cnn_sheaf", (1, 28, 28), 10)
    assert num_params(model) == 320 + 18_496 + 16_010 == 34_826
    assert model.feature_dim == 1600
