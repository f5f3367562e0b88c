"""Activation codes (the runtime argument of the elementwise kernels and of the fused GEMM
epilogue on both sides), the public names that map to them, and their work model."""

ACT_NONE, ACT_RELU, ACT_GELU, ACT_GELU_TANH, ACT_SILU = 0, 1, 2, 3, 4

# The `activation=` names of matmul / linear.
ACTIVATION_CODES = {None: ACT_NONE, "relu": ACT_RELU, "gelu": ACT_GELU,
                    "gelu_tanh": ACT_GELU_TANH, "silu": ACT_SILU}

# FLOPs per element of each activation, counted as the formula's arithmetic (exp / erf /
# tanh counted as one): the roofline's "work" for the activations, gated units and the
# GEMM epilogue alike.
FLOPS_PER_ELEMENT = {ACT_NONE: 0, ACT_RELU: 1, ACT_SILU: 4, ACT_GELU: 8, ACT_GELU_TANH: 9}

SQRT_2_OVER_PI = 0.7978845608028654
GELU_TANH_C = 0.044715
INV_SQRT2 = 0.7071067811865476
