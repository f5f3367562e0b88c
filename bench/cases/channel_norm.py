"""Benchmark cases of the channel-norm ops (model-derived shapes; see bench/cases/__init__.py).

Stable Diffusion v1.5 U-Net: the GroupNorm(32) + SiLU at the start of a ResBlock, at the
64x64 latent with 320 channels (10 channels x 64 x 64 per group) and at 32x32 with 640.
ResNet-50 (224x224, batch 1) run without folding its batch norms into the convolutions:
BatchNorm + ReLU after the stem (64 x 112 x 112) and after a stage-1 bottleneck's 1x1
expansion (256 x 56 x 56)."""
from . import case as _c


def _bn(c):
    return {"running_mean": (c,), "running_var": (c,), "weight": (c,), "bias": (c,)}


CASES = [
    _c("group_norm", "sd-unet resblock 320ch 64x64 +silu", "SD-1.5 U-Net",
       {"x": (1, 320, 64, 64), "weight": (320,), "bias": (320,)}, quick=True, num_groups=32, activation="silu"),
    _c("group_norm", "sd-unet resblock 640ch 32x32 +silu", "SD-1.5 U-Net",
       {"x": (1, 640, 32, 32), "weight": (640,), "bias": (640,)}, num_groups=32, activation="silu"),
    _c("batch_norm", "resnet50 stem 64ch 112x112 +relu", "ResNet-50",
       {"x": (1, 64, 112, 112), **_bn(64)}, quick=True, activation="relu"),
    _c("batch_norm", "resnet50 stage1 256ch 56x56 +relu", "ResNet-50",
       {"x": (1, 256, 56, 56), **_bn(256)}, activation="relu"),
    # the U-Net's GroupNorm + SiLU with 16-bit activations (PyTorch's float16 / bfloat16 group_norm)
    *(_c("group_norm", f"sd-unet resblock 320ch 64x64 +silu {fmt}", "SD-1.5 U-Net",
         {"x": (1, 320, 64, 64), "weight": (320,), "bias": (320,)}, num_groups=32, activation="silu",
         activations=fmt) for fmt in ("float16", "bfloat16")),
]
