"""The small models of the papers: two CNNs, an MLP and multinomial logistic regression,
and `cnn_bn` (cnn_mnist with batch norm, for FedBN).

Convolutions live under ``backbone.features`` and the fully connected layer under
``backbone.fc`` so that hierarchical FL can share the convolutional part by prefix.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from raymtl.models.registry import (
    FedModel,
    check_input_shape,
    check_min_side,
    flat_output_size,
    register_model,
)

_CNN_FEATURE_DIM = 512
_HEAD_DROPOUT = 0.5


def conv_relu_pool(in_channels: int, out_channels: int, kernel_size: int) -> list[nn.Module]:
    """Conv ('same' padding) - ReLU - 2x2 max pool."""
    return [
        nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2),
        nn.ReLU(),
        nn.MaxPool2d(2),
    ]


def conv_backbone(
    features: nn.Sequential, input_shape: tuple[int, int, int], feature_dim: int
) -> nn.Sequential:
    """features - flatten - Linear(-> feature_dim) - ReLU; the flatten size is measured."""
    flat_size = flat_output_size(features, input_shape)
    return nn.Sequential(
        OrderedDict(
            features=features,
            flatten=nn.Flatten(),
            fc=nn.Linear(flat_size, feature_dim),
            relu=nn.ReLU(),
        )
    )


def dropout_head(feature_dim: int, num_classes: int) -> nn.Sequential:
    """Dropout(0.5) + Linear(feature_dim, num_classes)."""
    return nn.Sequential(
        OrderedDict(dropout=nn.Dropout(_HEAD_DROPOUT), fc=nn.Linear(feature_dim, num_classes))
    )


@register_model
class CNNMnist(FedModel):
    """Two 5x5 conv layers (32, 64) with max pooling, FC 512, dropout head."""

    name = "cnn_mnist"
    description = "2x conv5x5 (32, 64) + maxpool, FC 512, dropout 0.5 + linear head (MNIST)"

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        input_shape = check_input_shape(input_shape)
        check_min_side(self.name, input_shape, 4)  # two 2x2 poolings
        features = nn.Sequential(*conv_relu_pool(input_shape[0], 32, 5), *conv_relu_pool(32, 64, 5))
        backbone = conv_backbone(features, input_shape, _CNN_FEATURE_DIM)
        super().__init__(backbone, dropout_head(_CNN_FEATURE_DIM, num_classes), _CNN_FEATURE_DIM)

    def common_prefixes(self) -> tuple[str, ...]:
        return ("backbone.features",)


def conv_bn_relu_pool(in_channels: int, out_channels: int, kernel_size: int) -> list[nn.Module]:
    """Conv ('same' padding) - BatchNorm - ReLU - 2x2 max pool."""
    conv, *rest = conv_relu_pool(in_channels, out_channels, kernel_size)
    return [conv, nn.BatchNorm2d(out_channels), *rest]


@register_model
class CNNBatchNorm(FedModel):
    """cnn_mnist with a BatchNorm2d after each conv: a model for FedBN (local batch norm)."""

    name = "cnn_bn"
    description = "cnn_mnist with batch norm after each conv (FedBN's kind of model)"

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        input_shape = check_input_shape(input_shape)
        check_min_side(self.name, input_shape, 4)  # two 2x2 poolings
        features = nn.Sequential(
            *conv_bn_relu_pool(input_shape[0], 32, 5), *conv_bn_relu_pool(32, 64, 5)
        )
        backbone = conv_backbone(features, input_shape, _CNN_FEATURE_DIM)
        super().__init__(backbone, dropout_head(_CNN_FEATURE_DIM, num_classes), _CNN_FEATURE_DIM)

    def common_prefixes(self) -> tuple[str, ...]:
        return ("backbone.features",)


@register_model
class CNNCifar(FedModel):
    """Three 3x3 conv layers (32, 64, 128) with max pooling, FC 512, dropout head."""

    name = "cnn_cifar"
    description = "3x conv3x3 (32, 64, 128) + maxpool, FC 512, dropout 0.5 + linear head (CIFAR)"

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        input_shape = check_input_shape(input_shape)
        check_min_side(self.name, input_shape, 8)  # three 2x2 poolings
        features = nn.Sequential(
            *conv_relu_pool(input_shape[0], 32, 3),
            *conv_relu_pool(32, 64, 3),
            *conv_relu_pool(64, 128, 3),
        )
        backbone = conv_backbone(features, input_shape, _CNN_FEATURE_DIM)
        super().__init__(backbone, dropout_head(_CNN_FEATURE_DIM, num_classes), _CNN_FEATURE_DIM)

    def common_prefixes(self) -> tuple[str, ...]:
        return ("backbone.features",)


@register_model
class MLP(FedModel):
    """flatten - Linear(in, hidden) - ReLU backbone, Linear(hidden, C) head."""

    name = "mlp"
    description = "flatten - linear(hidden) - ReLU, linear head (the papers' 784-32-10 MLP)"

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int, hidden: int = 32):
        input_shape = check_input_shape(input_shape)
        if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 1:
            raise ValueError(f"model.params.hidden: {hidden!r} is not a positive integer")
        in_features = input_shape[0] * input_shape[1] * input_shape[2]
        backbone = nn.Sequential(
            OrderedDict(flatten=nn.Flatten(), fc1=nn.Linear(in_features, hidden), relu=nn.ReLU())
        )
        super().__init__(backbone, nn.Linear(hidden, num_classes), hidden)

    def common_prefixes(self) -> tuple[str, ...]:
        return ("backbone.fc1",)


@register_model
class LogReg(FedModel):
    """Multinomial logistic regression: parameter-free flatten backbone, linear head."""

    name = "logreg"
    description = "multinomial logistic regression (flatten, one linear layer)"

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        input_shape = check_input_shape(input_shape)
        in_features = input_shape[0] * input_shape[1] * input_shape[2]
        super().__init__(nn.Flatten(), nn.Linear(in_features, num_classes), in_features)
