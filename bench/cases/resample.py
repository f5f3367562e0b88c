"""Benchmark cases of interpolate (model-derived shapes; see bench/cases/__init__.py).

  SD U-Net    Stable Diffusion 1.x U-Net decoder: nearest 2x upsample before the conv of each
              up block (320 channels at 64x64 latents, 1280 at 16x16)
  FPN         feature-pyramid / segmentation heads: bilinear 2x, align_corners=False
  DeepLab     DeepLabV3 on PASCAL VOC (21 classes): logits at output stride 8 upsampled to
              the 512x512 image
"""
from . import case as _c

CASES = [
    _c("interpolate", "sd-unet up 320x64x64 nearest 2x", "SD U-Net", {"x": (1, 320, 64, 64)}, quick=True,
       scale_factor=2.0, mode="nearest"),
    _c("interpolate", "sd-unet up 1280x16x16 nearest 2x", "SD U-Net", {"x": (1, 1280, 16, 16)},
       scale_factor=2.0, mode="nearest"),
    _c("interpolate", "fpn 256x32x32 bilinear 2x", "FPN", {"x": (1, 256, 32, 32)},
       scale_factor=2.0, mode="bilinear", align_corners=False),
    _c("interpolate", "deeplab logits 21x64x64 to 512", "DeepLabV3", {"x": (1, 21, 64, 64)},
       size=(512, 512), mode="bilinear", align_corners=False),
]
