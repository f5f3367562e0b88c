"""Work model of the activations' derivatives (the backward ops, and a later linear-backward
GEMM prologue that multiplies the incoming gradient by act'(pre-activation)).  The codes
are kernels_common.activation's ACT_*; imports no numba."""

from .activation import ACT_GELU, ACT_GELU_TANH, ACT_NONE, ACT_RELU, ACT_SILU

# FLOPs per element of act'(x), counted as the formula's arithmetic with exp / erfc counted as
# one (kernels_cpu/activation_grad.py has the formulas):
#   relu       1 (the compare)
#   silu       s = sigmoid(x) from e = exp(-|x|): exp, add, divide, multiply; s (1 + x (1 - s)): 3
#   gelu       Phi(x) = erfc(-x/sqrt2)/2: 3; x phi(x) = x exp(-x^2/2) / sqrt(2 pi): 5; add: 1
#   gelu_tanh  v = 2u: 4; sigmoid(v) as silu: 4; v' = c (1 + 3k x^2): 3; s (1 + x (1 - s) v'): 4
DERIVATIVE_FLOPS_PER_ELEMENT = {ACT_NONE: 0, ACT_RELU: 1, ACT_SILU: 7, ACT_GELU: 9, ACT_GELU_TANH: 15}

# |x| beyond which every derivative has reached its limit (0 or 1) in float32 and float64
# alike (silu: e^-1e4 underflows; gelu: exp(-x^2/2) too; tanh-gelu: the sigmoid saturates
# long before): the multiplicative factors clamp x there, so that x (1 - s) v'(x) stays
# finite (0 * inf would give NaN for finite x, as PyTorch's formula does for |x| > 1e12 in
# float32 tanh-gelu).
X_CLAMP = 1.0e4
