"""Low-precision facts shared by the CPU and CUDA kernels and the dispatcher (no numba).

Quantized integer types (ONNX QuantizeLinear / DequantizeLinear):
    q = saturate(round_half_to_even(x / scale) + zero_point),   x' = (q - zero_point) * scale
with saturation at the type's limits below.  Symmetric quantization (zero_point 0) uses the
type's range without its most negative value for int8, [-127, 127] (onnxruntime's quantizer
does the same for symmetric int8), so that negation is exact and no product reaches
-128 * -128.

Weight formats of the weight-only low-precision `linear` (the weight's storage; x and the
accumulation stay float32): bfloat16 is held as its 16 bit pattern (numpy has no bfloat16;
ml_dtypes.bfloat16 arrays are viewed as uint16 without a copy): the float32 with those bits
as its upper half.
"""
import numpy as np

# name -> (numpy dtype, lowest, highest)
QTYPES = {"int8": (np.dtype(np.int8), -128, 127), "uint8": (np.dtype(np.uint8), 0, 255)}
SYMMETRIC_INT8_MAX = 127

WEIGHT_DENSE, WEIGHT_F16, WEIGHT_BF16, WEIGHT_INT8 = 0, 1, 2, 3
WEIGHT_FORMAT_NAMES = {WEIGHT_DENSE: "dense", WEIGHT_F16: "float16", WEIGHT_BF16: "bfloat16",
                       WEIGHT_INT8: "int8 per-channel"}


def qrange(dtype) -> tuple:
    """(lowest, highest) of a quantized integer dtype."""
    for _, (dt, lo, hi) in QTYPES.items():
        if dt == np.dtype(dtype):
            return lo, hi
    raise ValueError(f"not a quantized dtype: {np.dtype(dtype)} (expected one of {sorted(QTYPES)})")
