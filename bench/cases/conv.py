"""Benchmark cases of conv2d (model-derived shapes; see bench/cases/__init__.py).

ResNet-50 and MobileNetV2 at 224x224, batch 1, as exported for inference: each batch norm
folded into its convolution's weight and bias, the ReLU (ReLU6 ~ ReLU here) fused.  Stable
Diffusion v1.5 U-Net: the 3x3 convolution of a ResBlock at the 64x64 latent, 320 channels
(its GroupNorm + SiLU runs before it, bench/cases/channel_norm.py)."""
from . import case as _c

CASES = [
    _c("conv2d", "resnet50 stem 7x7 s2", "ResNet-50",
       {"x": (1, 3, 224, 224), "weight": (64, 3, 7, 7), "bias": (64,)}, quick=True,
       stride=2, padding=3, activation="relu"),
    _c("conv2d", "resnet50 3x3 64ch 56x56", "ResNet-50",
       {"x": (1, 64, 56, 56), "weight": (64, 64, 3, 3), "bias": (64,)}, quick=True, padding=1, activation="relu"),
    _c("conv2d", "resnet50 1x1 256->64 56x56", "ResNet-50",
       {"x": (1, 256, 56, 56), "weight": (64, 256, 1, 1), "bias": (64,)}, activation="relu"),
    _c("conv2d", "mobilenetv2 dw 3x3 144ch 56x56", "MobileNetV2",
       {"x": (1, 144, 56, 56), "weight": (144, 1, 3, 3), "bias": (144,)}, quick=True,
       padding=1, groups=144, activation="relu"),
    _c("conv2d", "mobilenetv2 dw 3x3 384ch 14x14", "MobileNetV2",
       {"x": (1, 384, 14, 14), "weight": (384, 1, 3, 3), "bias": (384,)}, padding=1, groups=384, activation="relu"),
    _c("conv2d", "sd-unet resblock 3x3 320ch 64x64", "SD-1.5 U-Net",
       {"x": (1, 320, 64, 64), "weight": (320, 320, 3, 3), "bias": (320,)}, padding=1),
    # 16-bit activations and weights (PyTorch's float16 / bfloat16 conv2d on the CPU)
    *(_c("conv2d", f"resnet50 3x3 64ch 56x56 {fmt}", "ResNet-50",
         {"x": (1, 64, 56, 56), "weight": (64, 64, 3, 3), "bias": (64,)}, padding=1, activation="relu",
         activations=fmt) for fmt in ("float16", "bfloat16")),
]
