"""recipes/imagenet/model.py: the facts of spec sections 3 and 4 about the ImageNet network.

ResNet-50 v1.5's parameter count and stride placement, DX's bn0 and fc init, FF's BlurPool
(where it goes, what the blur computes, that it adds no parameters), output shapes at the
recipes' square and rectangular sizes, and the three weight-decay rules (FI all, DX BN
modules, FF "bn" in the name) on the bare model, on a real DDP wrapper and on fp32 masters.
Expected counts are worked out by hand from the architecture, not from the code under test.
"""
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
sys.path.insert(0, str(RECIPES))
from common.training import MasterWeights  # noqa: E402
from conftest import import_recipe_file  # noqa: E402


model = import_recipe_file("imagenet", "model.py", "imagenet_model")

# The strided convs with >= 16 input channels: the first block of layer2-4 has its stride on
# conv2 (Bottleneck, v1.5) or conv1 (BasicBlock), and on its 1x1 downsample conv.
BLURRED_50 = {f"layer{i}.0.{c}" for i in (2, 3, 4) for c in ("conv2", "downsample.0")}
BLURRED_18 = {f"layer{i}.0.{c}" for i in (2, 3, 4) for c in ("conv1", "downsample.0")}
# Their input channels: (layer2 conv2, layer2 downsample, layer3 ..., layer4 ...).
BLURRED_50_CHANNELS = (128, 256, 256, 512, 512, 1024)

# Parameter tensors, by hand. ResNet-50: stem conv + BN (1 + 2), 16 bottlenecks of 3 convs and
# 3 BNs (16 * 9), 4 downsamples of conv + BN (layer1 too: 64 -> 256 channels; 4 * 3), fc weight
# and bias (2). ResNet-18: stem (3), 8 basic blocks of 2 convs and 2 BNs (8 * 6), 3 downsamples
# (layer2-4; 3 * 3), fc (2).
TENSORS = {"resnet50": 3 + 16 * 9 + 4 * 3 + 2, "resnet18": 3 + 8 * 6 + 3 * 3 + 2}  # 161, 62
BN_TENSORS = {"resnet50": 2 + 16 * 3 * 2 + 4 * 2, "resnet18": 2 + 8 * 2 * 2 + 3 * 2}  # 106, 40
BN_NAMED = {"resnet50": 2 + 16 * 3 * 2, "resnet18": 2 + 8 * 2 * 2}  # 98, 34: not downsample.1


@pytest.fixture(scope="module")
def resnet50():
    torch.manual_seed(0)
    return model.build_model("resnet50")


@pytest.fixture(scope="module")
def resnet50_diu_ffcv():
    """bn0, fc N(0, 0.01) and BlurPool together: every change the recipes make, at once."""
    torch.manual_seed(0)
    return model.build_model("resnet50", bn0=True, fc_init_std=0.01, blurpool=True)


def _buffer_elements(m: nn.Module) -> int:
    return sum(b.numel() for b in m.buffers())


# ---------------------------------------------------------------------------------------------
# The network


def test_resnet50_has_25_557_032_parameters_with_or_without_blurpool(resnet50, resnet50_diu_ffcv):
    """The spec's 25.56 M exactly; BlurPool adds only buffers: 6 filters of c_in x 9 values."""
    assert model.count_params(resnet50) == 25_557_032
    assert model.count_params(resnet50_diu_ffcv) == 25_557_032
    extra = _buffer_elements(resnet50_diu_ffcv) - _buffer_elements(resnet50)
    assert extra == 9 * sum(BLURRED_50_CHANNELS) == 24_192
    assert len(list(resnet50_diu_ffcv.buffers())) - len(list(resnet50.buffers())) == 6


def test_resnet18_smoke_model_has_11_689_512_parameters():
    assert model.count_params(model.build_model("resnet18")) == 11_689_512


def test_resnet50_is_v1_5_with_the_stride_on_the_3x3_conv(resnet50):
    for i in (2, 3, 4):
        first = getattr(resnet50, f"layer{i}")[0]
        assert first.conv1.stride == (1, 1) and first.conv1.kernel_size == (1, 1)
        assert first.conv2.stride == (2, 2) and first.conv2.kernel_size == (3, 3)
        assert first.downsample[0].stride == (2, 2)
    assert resnet50.layer1[0].conv2.stride == (1, 1)  # layer1 keeps the 56x56 of the stem
    assert resnet50.conv1.stride == (2, 2) and resnet50.conv1.in_channels == 3


def _last_bns(m: nn.Module) -> set:
    """Qualified names of each residual block's last BN, from the block's own structure: the
    BN of the block's last conv (conv3 of a Bottleneck, conv2 of a BasicBlock)."""
    names = set()
    for name, block in m.named_modules():
        if name.startswith("layer") and name.count(".") == 1:
            last = "bn3" if hasattr(block, "conv3") else "bn2"
            names.add(f"{name}.{last}")
    return names


@pytest.mark.parametrize("arch, blocks", [("resnet50", 16), ("resnet18", 8)])
def test_bn0_zeroes_the_last_bn_weight_of_every_block_and_only_those(arch, blocks):
    m = model.build_model(arch, bn0=True)
    last = _last_bns(m)
    assert len(last) == blocks
    bns = dict((n, b) for n, b in m.named_modules() if isinstance(b, nn.BatchNorm2d))
    assert last <= set(bns)
    for name, bn in bns.items():
        assert torch.equal(bn.weight, torch.full_like(bn.weight, 0.0 if name in last else 1.0)), name
        assert torch.equal(bn.bias, torch.zeros_like(bn.bias)), name
    plain = model.build_model(arch)
    assert all(torch.equal(b.weight, torch.ones_like(b.weight))
               for b in plain.modules() if isinstance(b, nn.BatchNorm2d))


def test_bn0_blocks_start_as_the_identity_plus_relu():
    """The point of bn0: with the last BN at 0, a block without downsample returns relu(x)."""
    m = model.build_model("resnet18", bn0=True).eval()
    block = m.layer1[1]
    x = torch.randn(2, 64, 8, 8)
    with torch.no_grad():
        assert torch.equal(block(x), F.relu(x))


def test_fc_init_std_draws_fc_weight_from_normal_0_std():
    """512,000 draws: the sample std of N(0, 0.01) is within 2e-5 of 0.01 (its standard error is
    0.01 / sqrt(2n) = 1e-5); PyTorch's default Linear init has std 1/sqrt(3 * 512) = 0.0255."""
    torch.manual_seed(1)
    w = model.build_model("resnet18", fc_init_std=0.01).fc.weight.detach()
    assert abs(w.std().item() - 0.01) < 2e-5
    assert abs(w.mean().item()) < 5e-5
    assert (w.abs() > 0.01 * 5.5).sum().item() <= 1  # tails: P(|z| > 5.5) * 512,000 = 0.02
    default = model.build_model("resnet18").fc.weight.detach()
    assert abs(default.std().item() - 1 / (3 * 512) ** 0.5) < 1e-4
    assert default.abs().max().item() <= 1 / 512 ** 0.5  # uniform, bound 1/sqrt(fan_in)


def test_blurpool_wraps_exactly_the_strided_convs_with_16_or_more_input_channels(
        resnet50_diu_ffcv):
    m = resnet50_diu_ffcv
    wrapped = {n: b for n, b in m.named_modules() if isinstance(b, model.BlurPoolConv2d)}
    assert set(wrapped) == BLURRED_50
    assert tuple(wrapped[n].conv.in_channels for n in sorted(wrapped)) == BLURRED_50_CHANNELS
    assert type(m.conv1) is nn.Conv2d  # the stem: stride 2 but 3 input channels
    kernel = torch.tensor([[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]]) / 16
    for b in wrapped.values():
        assert b.blur_filter.shape == (b.conv.in_channels, 1, 3, 3)
        assert torch.equal(b.blur_filter, kernel.expand_as(b.blur_filter))
        assert "blur_filter" in dict(b.named_buffers()) and len(list(b.parameters())) == 1
    m18 = model.build_model("resnet18", blurpool=True)
    assert {n for n, b in m18.named_modules() if isinstance(b, model.BlurPoolConv2d)} == BLURRED_18


def _blur_only(channels: int) -> nn.Module:
    """A BlurPoolConv2d around an identity 1x1 conv, stride 1: its output is the blur alone."""
    conv = nn.Conv2d(channels, channels, 1, bias=False)
    with torch.no_grad():
        conv.weight.copy_(torch.eye(channels).view(channels, channels, 1, 1))
    return model.BlurPoolConv2d(conv)


def test_blur_of_a_constant_image_is_the_constant_inside_and_zero_padded_at_the_border():
    out = _blur_only(16)(torch.full((1, 16, 6, 5), 3.0)).detach()
    assert torch.equal(out[:, :, 1:-1, 1:-1], torch.full((1, 16, 4, 3), 3.0))
    assert out[0, 0, 0, 0].item() == 3.0 * 9 / 16   # corner: 1+2+2+4 of 16 inside the image
    assert out[0, 0, 0, 2].item() == 3.0 * 12 / 16  # edge: 1+2+1+2+4+2
    assert out[0, 15, -1, -1].item() == 3.0 * 9 / 16


def test_blur_is_depthwise_an_impulse_in_one_channel_stays_in_that_channel():
    x = torch.zeros(1, 16, 5, 5)
    x[0, 7, 2, 2] = 16.0
    out = _blur_only(16)(x).detach()
    expected = torch.zeros(1, 16, 5, 5)
    expected[0, 7, 1:4, 1:4] = torch.tensor([[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]])
    assert torch.equal(out, expected)


def test_blurpool_keeps_the_wrapped_convs_output_size_and_follows_the_models_dtype():
    conv = nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False)
    x = torch.randn(2, 16, 15, 14)
    wrapped = model.BlurPoolConv2d(conv)
    assert wrapped(x).shape == conv(x).shape == (2, 32, 8, 7)
    wrapped.to(torch.bfloat16)
    assert wrapped.blur_filter.dtype == torch.bfloat16
    assert wrapped(x.to(torch.bfloat16)).dtype == torch.bfloat16


@pytest.mark.parametrize("size", [(64, 64), (128, 128), (64, 96)])
def test_resnet50_gives_logits_2_by_1000_at_square_and_rectangular_sizes(resnet50_diu_ffcv, size):
    """128 px (the first phase) and a 64x96 rectangle (rect validation feeds non-square
    batches); 64 px stands in for the smoke sizes."""
    m = resnet50_diu_ffcv.eval()
    with torch.no_grad():
        out = m(torch.randn(2, 3, *size))
    assert out.shape == (2, 1000) and out.dtype == torch.float32
    assert torch.isfinite(out).all()


def test_resnet18_trains_with_channels_last_and_a_non_square_batch():
    torch.manual_seed(0)
    m = model.build_model("resnet18", blurpool=True, num_classes=10).to(
        memory_format=torch.channels_last)
    x = torch.randn(4, 3, 48, 80).to(memory_format=torch.channels_last)
    loss = F.cross_entropy(m(x), torch.arange(4))
    loss.backward()
    assert m.fc.weight.grad.shape == (10, 512) and m.conv1.weight.grad.abs().sum() > 0


def test_bad_arch_and_init_are_one_line_errors():
    with pytest.raises(SystemExit, match=r"^imagenet: arch must be one of resnet50, resnet18, "
                                         r"got 'resnet34'$"):
        model.build_model("resnet34")
    with pytest.raises(SystemExit, match=r"^imagenet: fc_init_std must be positive, got 0.0$"):
        model.build_model("resnet18", fc_init_std=0.0)
    with pytest.raises(SystemExit, match=r"^imagenet: num_classes must be at least 1, got 0$"):
        model.build_model("resnet18", num_classes=0)


# ---------------------------------------------------------------------------------------------
# Weight-decay groups


def _check_layout(groups, wd):
    assert [g["name"] for g in groups] == ["no_wd", "wd"]
    assert [g["weight_decay"] for g in groups] == [0.0, wd]
    assert [sorted(g) for g in groups] == [["name", "params", "weight_decay"]] * 2


def _ids(tensors) -> list:
    return [id(t) for t in tensors]


@pytest.mark.parametrize("arch", ["resnet50", "resnet18"])
@pytest.mark.parametrize("rule, exempt", [("all", {}), ("bn_modules", BN_TENSORS),
                                          ("bn_names", BN_NAMED)])
def test_each_rule_exempts_the_hand_counted_tensors_and_covers_every_parameter_once(
        arch, rule, exempt):
    m = model.build_model(arch, blurpool=True)
    groups = model.param_groups(m, 1e-4, rule)
    _check_layout(groups, 1e-4)
    n_exempt = exempt.get(arch, 0)
    assert [len(g["params"]) for g in groups] == [n_exempt, TENSORS[arch] - n_exempt]
    together = _ids(groups[0]["params"]) + _ids(groups[1]["params"])
    assert sorted(together) == sorted(_ids(m.parameters()))  # each exactly once
    assert len(set(together)) == len(together) == TENSORS[arch]
    # within each group, model.parameters() order (an optimiser state_dict's layout)
    order = {id(p): i for i, p in enumerate(m.parameters())}
    for g in groups:
        assert [order[id(p)] for p in g["params"]] == sorted(order[id(p)] for p in g["params"])


def test_which_bn_is_exempt_differs_between_dx_and_ff_at_the_downsample(resnet50):
    """DX exempts BN modules, the downsample BN (downsample.1) included; FF exempts names with
    "bn" in them, so it decays downsample.1.weight and .bias, 4 x 2 tensors of 3,840 values."""
    names = {id(p): n for n, p in resnet50.named_parameters()}
    by_module = model.param_groups(resnet50, 1e-4, "bn_modules")
    by_name = model.param_groups(resnet50, 1e-4, "bn_names")
    ds_bn = {n for n in names.values() if ".downsample.1." in n}
    assert len(ds_bn) == 8
    assert ds_bn <= {names[id(p)] for p in by_module[0]["params"]}
    assert ds_bn <= {names[id(p)] for p in by_name[1]["params"]}
    assert sum(p.numel() for p in by_module[0]["params"]) \
        - sum(p.numel() for p in by_name[0]["params"]) == 2 * (256 + 512 + 1024 + 2048) == 7_680
    assert sum(p.numel() for p in by_module[0]["params"]) == 53_120
    decayed = {names[id(p)] for p in by_name[1]["params"]}
    assert "fc.bias" in decayed and "conv1.weight" in decayed and "bn1.weight" not in decayed


def test_sgd_decays_only_the_wd_group():
    """The groups drive torch.optim.SGD as they are: with zero gradients, lr 1 and wd 0.5, a
    decayed parameter halves and an exempt one keeps its value."""
    torch.manual_seed(0)
    m = model.build_model("resnet18", num_classes=10)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    opt = torch.optim.SGD(model.param_groups(m, 0.5, "bn_names"), lr=1.0, momentum=0.9)
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in m.named_parameters():
        factor = 1.0 if "bn" in n else 0.5
        assert torch.equal(p.detach(), before[n] * factor), n


@pytest.fixture
def ddp_world_of_one(tmp_path):
    """A real gloo process group of one rank (DDP needs one), torn down afterwards."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}",
                            rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("rule", ["all", "bn_modules", "bn_names"])
def test_a_ddp_wrapped_model_gives_the_same_groups_as_the_bare_one(ddp_world_of_one, rule):
    bare = model.build_model("resnet18", bn0=True, blurpool=True)
    ddp = nn.parallel.DistributedDataParallel(bare)
    assert all(n.startswith("module.") for n, _ in ddp.named_parameters())
    wrapped, plain = model.param_groups(ddp, 1e-4, rule), model.param_groups(bare, 1e-4, rule)
    _check_layout(wrapped, 1e-4)
    assert [_ids(g["params"]) for g in wrapped] == [_ids(g["params"]) for g in plain]


def test_groups_over_master_weights_split_the_masters_by_the_models_parameters():
    """DX built its no-BN-wd groups from the fp32 masters, matched to the model by position."""
    m = model.build_model("resnet18").to(torch.bfloat16)
    master = MasterWeights(m)
    groups = model.param_groups(m, 1e-4, "bn_modules", masters=master.params)
    by_model = model.param_groups(m, 1e-4, "bn_modules")
    index = {id(p): i for i, p in enumerate(m.parameters())}
    for g, ref in zip(groups, by_model):
        assert _ids(g["params"]) == [id(master.params[index[id(p)]]) for p in ref["params"]]
        assert all(p.dtype == torch.float32 for p in g["params"])
    assert [len(g["params"]) for g in groups] == [40, 22]


def test_bad_rule_or_master_count_is_a_one_line_error(resnet50):
    with pytest.raises(SystemExit, match=r"^imagenet: weight-decay rule must be one of all, "
                                         r"bn_modules, bn_names, got 'bn'$"):
        model.param_groups(resnet50, 1e-4, "bn")
    with pytest.raises(SystemExit, match=r"^imagenet: 3 master parameters for a model with 161$"):
        model.param_groups(resnet50, 1e-4, "all", masters=[torch.zeros(1)] * 3)
