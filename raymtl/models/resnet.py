"""Residual networks for small images, split into backbone and head.

``resnet8``: the CIFAR-style ResNet of He et al. (2016, §4.2) with one torchvision
``BasicBlock`` per stage (widths 16, 32, 64; strides 1, 2, 2): 3x3 conv(16) - BN - ReLU stem,
global average pool, flatten -> 64 features (the backbone); head = Linear(64, num_classes).
77,754 parameters on 1x28x28 with 10 classes.

``resnet18``: torchvision's ResNet-18 adapted to small (32x32) images.

The split follows the "BL-k" convention (k = number of residual stages in the head):

* ``BL-0`` -- every residual stage in the backbone; head = fc only.
* ``BL-1`` -- layer4 + avgpool + fc form the head (task-specific layers).
* ``BL-2`` -- layer3 joins the head too.

For BL-1 and BL-2 the backbone outputs a feature map (B, C, h, w); ``feature_dim`` is its
flattened size C*h*w (so ``features(x)`` is (B, feature_dim) for every model), and the head
takes the map itself.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from raymtl.models.registry import FedModel, check_input_shape, flat_output_size, register_model

# First stage of the head for each split; everything before it is the backbone.
HEAD_STARTS = {"BL-0": "fc", "BL-1": "layer4", "BL-2": "layer3"}
# ResNet-8: (width, stride) of each stage's single BasicBlock.
RESNET8_STAGES = ((16, 1), (32, 2), (64, 2))


def small_image_resnet18_stages(in_channels: int, num_classes: int) -> list[tuple[str, nn.Module]]:
    """ResNet-18 stages in forward order, with the CIFAR-style stem (3x3 conv, no max pool)."""
    from torchvision.models import resnet18  # lazy: torchvision costs seconds to import

    net = resnet18(weights=None, num_classes=num_classes)
    # 32x32 inputs: a 7x7 stride-2 stem plus max pool would shrink them to 8x8 before layer1.
    net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    net.maxpool = nn.Identity()
    stages = [(name, getattr(net, name)) for name in ("conv1", "bn1", "relu", "maxpool")]
    stages += [(f"layer{index}", getattr(net, f"layer{index}")) for index in range(1, 5)]
    stages += [("avgpool", net.avgpool), ("flatten", nn.Flatten()), ("fc", net.fc)]
    return stages


@register_model
class ResNet18(FedModel):
    """ResNet-18 (random init) with a 3x3 stem; `split` chooses which stages form the head."""

    name = "resnet18"
    description = "ResNet-18 with a 3x3 stem for 32x32 images; split BL-0/BL-1/BL-2 = head stages"

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int, split: str = "BL-1"):
        input_shape = check_input_shape(input_shape)
        if split not in HEAD_STARTS:
            allowed = ", ".join(HEAD_STARTS)
            raise ValueError(f"model.params.split: {split!r} is not one of {allowed}")
        stages = small_image_resnet18_stages(input_shape[0], num_classes)
        head_start = [name for name, _ in stages].index(HEAD_STARTS[split])
        backbone = nn.Sequential(OrderedDict(stages[:head_start]))
        head = nn.Sequential(OrderedDict(stages[head_start:]))
        super().__init__(backbone, head, flat_output_size(backbone, input_shape))
        self.split = split

    def common_prefixes(self) -> tuple[str, ...]:
        return parameterised_stages(self.backbone)


def parameterised_stages(backbone: nn.Module) -> tuple[str, ...]:
    """``backbone.<stage>`` for every stage that holds parameters (the whole backbone is shared)."""
    return tuple(
        f"backbone.{name}"
        for name, stage in backbone.named_children()
        if any(True for _ in stage.parameters())
    )


def resnet8_backbone(in_channels: int) -> nn.Sequential:
    """Stem + one BasicBlock per stage (16, 32, 64; strides 1, 2, 2) + average pool + flatten."""
    from torchvision.models.resnet import BasicBlock  # lazy: torchvision costs seconds to import

    stages: list[tuple[str, nn.Module]] = [
        ("conv1", nn.Conv2d(in_channels, 16, kernel_size=3, stride=1, padding=1, bias=False)),
        ("bn1", nn.BatchNorm2d(16)),
        ("relu", nn.ReLU(inplace=True)),
    ]
    in_width = 16
    for index, (width, stride) in enumerate(RESNET8_STAGES, start=1):
        downsample = None
        if stride != 1 or in_width != width:  # 1x1 conv + BN projection shortcut
            downsample = nn.Sequential(
                nn.Conv2d(in_width, width, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(width),
            )
        stages.append((f"layer{index}", BasicBlock(in_width, width, stride, downsample)))
        in_width = width
    stages += [("avgpool", nn.AdaptiveAvgPool2d(1)), ("flatten", nn.Flatten())]
    backbone = nn.Sequential(OrderedDict(stages))
    for module in backbone.modules():  # He init, as torchvision's ResNet does
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
    return backbone


@register_model
class ResNet8(FedModel):
    """CIFAR-style ResNet-8 (He et al. 2016 §4.2, one BasicBlock per stage); linear head."""

    name = "resnet8"
    description = (
        "CIFAR-style ResNet-8: 3x3 stem, 1 BasicBlock per stage (16, 32, 64), avgpool, linear head"
    )

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        input_shape = check_input_shape(input_shape)
        feature_dim = RESNET8_STAGES[-1][0]
        backbone = resnet8_backbone(input_shape[0])
        super().__init__(backbone, nn.Linear(feature_dim, num_classes), feature_dim)

    def common_prefixes(self) -> tuple[str, ...]:
        return parameterised_stages(self.backbone)
