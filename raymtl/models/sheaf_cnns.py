"""Sheaf-FMTL's CNNs: the rotated-MNIST model of its official code (`cnn_sheaf`) and the
three of its heterogeneous-model experiment (Sec. 4.3 and Table 2).

cnn_sheaf (docs/ALGORITHMS.md, Sheaf-FMTL; the official code's): conv3x3(32) - ReLU - maxpool2 -
conv3x3(64) - ReLU - maxpool2 (no padding) | Linear(64·5·5 = 1600 -> 10): 34,826 parameters
on 1x28x28, so γ = 0.01 gives d_ij = 348.

Table 2 (R-MNIST and H-CIFAR-10 alike): small = 1 conv layer (16 filters) + 1 FC layer;
medium = 2 conv layers (24, 48) + 1 FC layer; large = 2 conv layers (32, 64) + 2 FC layers
(120 hidden units). The paper names no kernel size or pooling, so every conv layer is the
package's ``conv_relu_pool`` with a 5x5 kernel: 5x5 'same' conv - ReLU - 2x2 max pool.

Convolutions live under ``backbone.features`` (the default common part in hierarchical FL),
the large model's FC 120 under ``backbone.fc``, the last Linear(-> num_classes) is the head.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import ClassVar

from torch import nn

from raymtl.models.cnn import conv_backbone, conv_relu_pool
from raymtl.models.registry import (
    FedModel,
    check_input_shape,
    check_min_side,
    flat_output_size,
    register_model,
)

_KERNEL_SIZE = 5


class _SheafCNN(FedModel):
    """[conv5x5(width) - ReLU - maxpool2] per width, optional FC - ReLU; linear head."""

    widths: ClassVar[tuple[int, ...]] = ()
    fc_units: ClassVar[int] = 0  # width of the FC layer before the head (0: none)

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        input_shape = check_input_shape(input_shape)
        check_min_side(self.name, input_shape, 2 ** len(self.widths))  # one 2x2 pool per conv
        layers: list[nn.Module] = []
        in_channels = input_shape[0]
        for width in self.widths:
            layers += conv_relu_pool(in_channels, width, _KERNEL_SIZE)
            in_channels = width
        features = nn.Sequential(*layers)
        if self.fc_units:
            backbone = conv_backbone(features, input_shape, self.fc_units)
            feature_dim = self.fc_units
        else:
            backbone = nn.Sequential(OrderedDict(features=features, flatten=nn.Flatten()))
            feature_dim = flat_output_size(features, input_shape)
        super().__init__(backbone, nn.Linear(feature_dim, num_classes), feature_dim)

    def common_prefixes(self) -> tuple[str, ...]:
        return ("backbone.features",)


@register_model
class SmallCNN(_SheafCNN):
    """Small CNN of Sheaf-FMTL (Table 2): 1 conv layer (16 filters), 1 FC layer.

    backbone: conv5x5(16) - ReLU - maxpool2 - flatten; head: Linear(-> num_classes).
    """

    name = "small_cnn"
    description = "Sheaf-FMTL small CNN: conv5x5 (16) + maxpool, linear head"
    widths = (16,)


@register_model
class MediumCNN(_SheafCNN):
    """Medium CNN of Sheaf-FMTL (Table 2): 2 conv layers (24, 48 filters), 1 FC layer.

    backbone: [conv5x5(24), conv5x5(48)], each - ReLU - maxpool2, flatten;
    head: Linear(-> num_classes).
    """

    name = "medium_cnn"
    description = "Sheaf-FMTL medium CNN: 2x conv5x5 (24, 48) + maxpool, linear head"
    widths = (24, 48)


@register_model
class LargeCNN(_SheafCNN):
    """Large CNN of Sheaf-FMTL (Table 2): 2 conv layers (32, 64 filters), 2 FC layers (120).

    backbone: [conv5x5(32), conv5x5(64)], each - ReLU - maxpool2, flatten, Linear(-> 120) - ReLU;
    head: Linear(120 -> num_classes).
    """

    name = "large_cnn"
    description = "Sheaf-FMTL large CNN: 2x conv5x5 (32, 64) + maxpool, FC 120, linear head"
    widths = (32, 64)
    fc_units = 120


@register_model
class SheafMnistCNN(FedModel):
    """The official Sheaf-FMTL rotated-MNIST CNN (see the module docstring)."""

    name = "cnn_sheaf"
    description = "Sheaf-FMTL's rotated-MNIST CNN: 2x conv3x3 (32, 64) + maxpool, linear head"

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        input_shape = check_input_shape(input_shape)
        check_min_side(self.name, input_shape, 10)  # two unpadded 3x3 convs and two pools
        features = nn.Sequential(
            nn.Conv2d(input_shape[0], 32, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        backbone = nn.Sequential(OrderedDict(features=features, flatten=nn.Flatten()))
        feature_dim = flat_output_size(features, input_shape)
        super().__init__(backbone, nn.Linear(feature_dim, num_classes), feature_dim)

    def common_prefixes(self) -> tuple[str, ...]:
        return ("backbone.features",)
