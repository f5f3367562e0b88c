import time, numpy as np
from numba import cuda
import dispatch
from dispatch.cuda_impls._common import as_input
rng = np.random.default_rng(0)
g = cuda.to_device(rng.standard_normal((166, 50257)).astype(np.float32))
x = cuda.to_device(rng.standard_normal((166, 768)).astype(np.float32))
def tm(label, fn, n=3):
    fn(); cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n): r = fn()
    cuda.synchronize(); print(f"{label:40s} {(time.perf_counter()-t0)/n*1e3:9.2f} ms", flush=True); return r
gt = tm("as_input(g[:, :4096].T)", lambda: as_input(g[:, :4096].T))
tm("matmul(contiguous gt, x)", lambda: dispatch.matmul(gt, x))
print(dispatch.explain(dispatch.matmul, gt, x))
tm("matmul(g[:, :4096].T, x)", lambda: dispatch.matmul(g[:, :4096].T, x))
