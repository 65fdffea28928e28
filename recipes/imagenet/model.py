"""The ImageNet recipes' network and its weight-decay groups: torchvision's ResNet-50 with the
three recipes' changes to it (spec sections 3A, 3B, 3C and 4).

FI is fastai/imagenet-fast (3A), DX the fast.ai + DIU "ImageNet in 18 minutes" code (3B), FF
FFCV's ImageNet example (3C).

The network. All three trained ResNet-50 "v1.5": the stride of a downsampling bottleneck sits on
its 3x3 conv (conv2), not on the first 1x1, as torchvision has always built it (FI used
torchvision at pytorch/vision 9889de1, FF torchvision, DX its own copy of the same design).
torchvision's init is the recipes' init: convs kaiming-normal (fan_out, ReLU gain; the 2018
normal(0, sqrt(2 / (k*k*c_out))) is the same distribution), BatchNorm 1 and 0, fc PyTorch's
default. 25,557,032 parameters at 1000 classes (spec: 25.56 M). resnet18 is here for CPU
smoke runs only.

Where this file had to choose
  * bn0 (DX --init-bn0) is torchvision's zero_init_residual: the last BN's weight of every
    residual block (bn3 of a Bottleneck, bn2 of a BasicBlock) starts at 0, so each block starts
    as the identity. DX also drew fc.weight from N(0, 0.01) under that flag; here that is a
    separate argument, fc_init_std, which the recipe passes with bn0. fc.bias keeps
    PyTorch's default init in both (DX did not touch it).
  * blurpool (FF use_blurpool=1): every nn.Conv2d with a stride above 1 and at least 16 input
    channels gets a fixed 3x3 binomial blur, depthwise, stride 1, zero padding 1, in front of
    it (`BlurPoolConv2d`). In ResNet-50 that is the conv2 and the downsample conv of the first
    block of layer2, layer3 and layer4; the stem conv (3 input channels) is left alone. The
    filter is a buffer, so the parameter count does not change; the wrapped conv's
    parameters are renamed (`...conv2.conv.weight`), which matters to checkpoints, not to
    the weight-decay rules below.
  * Weight decay. The three recipes decayed different parameters, and `param_groups` names
    each rule: "all" (FI: wd 1e-4 on every parameter), "bn_modules" (DX --no-bn-wd: every
    parameter of a BatchNorm module is exempt, the downsample BNs included), "bn_names" (FF:
    parameters whose name contains "bn" are exempt: bn1, bn2, bn3, but not `downsample.1`,
    the downsample BN, which FF therefore decays). Biases are decayed under every rule (a
    torchvision ResNet's only non-BN bias is fc.bias). The groups are always [no_wd, wd],
    so an optimiser's state_dict has the same layout whatever the rule.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from common import training

ARCHS = ("resnet50", "resnet18")
WD_RULES = ("all", "bn_modules", "bn_names")
BLUR_KERNEL = ((1.0, 2.0, 1.0), (2.0, 4.0, 2.0), (1.0, 2.0, 1.0))  # / 16: binomial, sums to 1


class BlurPoolConv2d(nn.Module):
    """A fixed depthwise 3x3 binomial blur (stride 1, zero padding 1), then `conv`: FF's
    anti-aliasing in front of a strided conv. The filter is a buffer (no parameters); it
    follows the model through .to(), .half() and channels_last."""

    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        self.conv = conv
        kernel = torch.tensor(BLUR_KERNEL) / 16.0
        self.register_buffer("blur_filter", kernel.expand(conv.in_channels, 1, 3, 3).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blurred = F.conv2d(x, self.blur_filter, stride=1, padding=1, groups=self.conv.in_channels)
        return self.conv(blurred)


def add_blurpool(module: nn.Module) -> list[str]:
    """Wrap, in place, every Conv2d under `module` with stride > 1 and in_channels >= 16 in a
    BlurPoolConv2d; returns the wrapped convs' qualified names (before wrapping)."""
    wrapped = []
    for name, child in list(module.named_modules()):
        for attr, conv in list(child.named_children()):
            if isinstance(conv, nn.Conv2d) and max(conv.stride) > 1 and conv.in_channels >= 16:
                setattr(child, attr, BlurPoolConv2d(conv))
                wrapped.append(f"{name}.{attr}" if name else attr)
    return wrapped


def build_model(arch: str = "resnet50", *, bn0: bool = False, fc_init_std: float | None = None,
                blurpool: bool = False, num_classes: int = 1000) -> nn.Module:
    """torchvision.models.<arch>(weights=None, num_classes=...) with the recipe's changes:
    bn0 (every residual block's last BN weight starts at 0), fc_init_std (fc.weight drawn from
    N(0, std)), blurpool (a blur in front of the strided convs with >= 16 input channels).
    Draws from torch's global RNG: seed it first for identical weights."""
    if arch not in ARCHS:
        raise SystemExit(f"imagenet: arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    if num_classes < 1:
        raise SystemExit(f"imagenet: num_classes must be at least 1, got {num_classes}")
    if fc_init_std is not None and not fc_init_std > 0:
        raise SystemExit(f"imagenet: fc_init_std must be positive, got {fc_init_std}")
    model = getattr(torchvision.models, arch)(weights=None, num_classes=num_classes,
                                              zero_init_residual=bn0)
    if fc_init_std is not None:
        with torch.no_grad():
            model.fc.weight.normal_(0.0, fc_init_std)
    if blurpool:
        add_blurpool(model)
    return model


def param_groups(model: nn.Module, weight_decay: float, rule: str,
                 masters: list | None = None) -> list[dict]:
    """SGD parameter groups [{"params": exempt, "weight_decay": 0.0, "name": "no_wd"},
    {"params": decayed, "weight_decay": weight_decay, "name": "wd"}] under `rule` (see the
    header: "all", "bn_modules" or "bn_names"). Every parameter lands in exactly one group, in
    model.parameters() order. A DDP wrapper works too (its names start with "module.").
    `masters`: fp32 master copies in model.parameters() order (common.training.MasterWeights
    .params): the groups then hold those, split by the model's parameters, as DX did."""
    if rule not in WD_RULES:
        raise SystemExit(f"imagenet: weight-decay rule must be one of {', '.join(WD_RULES)}, "
                         f"got {rule!r}")
    named = list(model.named_parameters())
    if masters is not None and len(masters) != len(named):
        raise SystemExit(f"imagenet: {len(masters)} master parameters for a model with "
                         f"{len(named)}")
    if rule == "all":
        exempt = set()
    elif rule == "bn_modules":
        exempt = {id(p) for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
                  for p in m.parameters()}
    else:
        exempt = {id(p) for name, p in named if "bn" in name}
    chosen = masters if masters is not None else [p for _, p in named]
    no_wd = [c for (_, p), c in zip(named, chosen) if id(p) in exempt]
    wd = [c for (_, p), c in zip(named, chosen) if id(p) not in exempt]
    return [{"params": no_wd, "weight_decay": 0.0, "name": "no_wd"},
            {"params": wd, "weight_decay": weight_decay, "name": "wd"}]


def count_params(model: nn.Module) -> int:
    """All parameters (buffers such as BN statistics and the blur filters not counted)."""
    return training.count_params(model)[0]
