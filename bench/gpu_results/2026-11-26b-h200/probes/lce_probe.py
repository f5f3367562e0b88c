import cProfile, pstats, time, sys
import numpy as np
from numba import cuda
import dispatch
rng = np.random.default_rng(0)
x = cuda.to_device(rng.standard_normal((512, 768)).astype(np.float32))
w = cuda.to_device((rng.standard_normal((50257, 768)) * 0.02).astype(np.float32))
t = cuda.to_device(rng.integers(0, 50257, 512))
def tm(label, fn, n=1):
    fn(); cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        r = fn()
    cuda.synchronize()
    print(f"{label:50s} {(time.perf_counter() - t0) / n * 1e3:10.2f} ms", flush=True)
    return r
tm("lce (no grad)", lambda: dispatch.linear_cross_entropy(x, w, t), 3)
logits = tm("linear 166x768 @ 50257", lambda: dispatch.linear(x[:166], w), 3)
tm("cross_entropy_with_grad(grad_out=logits)", lambda: dispatch.cross_entropy_with_grad(logits, t[:166], reduction="sum", grad_out=logits), 3)
g = logits
tm("matmul g @ W (166x50257 @ 50257x768)", lambda: dispatch.matmul(g, w), 3)
part = cuda.device_array((4096, 768), np.float32)
tm("matmul g[:, :4096].T @ x (strided)", lambda: dispatch.matmul(g[:, :4096].T, x[:166], out=part), 3)
tm("lce_with_grad", lambda: dispatch.linear_cross_entropy_with_grad(x, w, t), 1)
pr = cProfile.Profile(); pr.enable()
dispatch.linear_cross_entropy_with_grad(x, w, t); cuda.synchronize()
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
