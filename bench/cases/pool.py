"""Benchmark cases of the pooling ops (model-derived shapes, batch 1; see bench/cases/__init__.py).

ResNet-50: the stem's 3x3 stride-2 max pool after the 7x7 convolution (64 x 112 x 112) and
the head's global average pool (2048 x 7 x 7); DenseNet-121: the first transition's 2x2
stride-2 average pool (256 x 56 x 56); VGG-16: the adaptive average pool to 7x7 before the
classifier, on a 224 x 224 input's 14 x 14 last feature map (512 channels; torchvision's
VGG applies it to whatever size reaches it).
"""
from . import case as _c

CASES = [
    _c("max_pool2d", "resnet-50 stem 3x3 s2", "ResNet-50", {"x": (1, 64, 112, 112)}, quick=True,
       kernel_size=3, stride=2, padding=1),
    _c("adaptive_avg_pool2d", "resnet-50 head global", "ResNet-50", {"x": (1, 2048, 7, 7)}, quick=True,
       output_size=(1, 1)),
    # quick as well: every op needs a quick case (the quick report and asv smoke)
    _c("avg_pool2d", "densenet-121 transition 2x2 s2", "DenseNet-121", {"x": (1, 256, 56, 56)}, quick=True,
       kernel_size=2, stride=2),
    _c("adaptive_avg_pool2d", "vgg-16 head 14->7", "VGG-16", {"x": (1, 512, 14, 14)}, output_size=(7, 7)),
]
