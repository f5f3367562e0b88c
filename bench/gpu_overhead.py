"""Where a small CUDA op's time goes on the host: the per-call cost of each layer, measured.

    python -m bench.gpu_overhead [--calls N] [--profile]
    python -m bench.gpu_overhead --stub [--calls N]     (no GPU: our own layers only)

bench.gpu found every op at 160-250 us per call on an H200 (2026-11-26), relu of 128x3072
included, where PyTorch takes 5-10 us: a host-side floor.  This times, per call (host wall
clock over N back-to-back calls, then one synchronize; median of 5 rounds), for relu
(128x3072 float32), softmax (12x128x128) and matmul (128x768 @ 768x768):

    torch          the PyTorch CUDA op (reference floor)
    launch         the numba kernel launched directly, output preallocated
    device_array   numba-cuda's cuda.device_array of the output's size (and its release)
    describe       the op's validation alone (Op.describe, no kernel)
    dispatch_out   dispatch.<op>(..., out=preallocated)
    dispatch       dispatch.<op>(...) as a user calls it (its result from the CUDA result
                   pool, dispatch/cuda_impls/_pool.py), and with the pool off

each with numba-cuda's low-occupancy warning check on (its default) and off.  --profile
adds cProfile's top functions for dispatch.<op> calls, with and without out=, and the CUDA
driver calls each makes: every driver function numba-cuda has looked up (its
``driver.cu*`` wrappers) and cuda.core's launch, wrapped to count calls and their time.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import ctypes
import importlib
import io
import pstats
import time

import numpy as np


def per_call(fn, sync, calls, rounds=5, around=None):
    """Median over rounds of host seconds per call for `calls` back-to-back calls + one sync;
    around: a context-manager factory entered once around each round's calls."""
    fn()
    sync()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        if around is None:
            for _ in range(calls):
                fn()
        else:
            with around():
                for _ in range(calls):
                    fn()
        sync()
        out.append((time.perf_counter() - t0) / calls)
    return float(np.median(out))


class DriverCalls:
    """Count and time numba-cuda's driver calls: wraps every cu* function numba-cuda's driver
    object has looked up so far (run the code once first) and the cuda.core launch its
    dispatcher calls.  Use as a context manager; .table(calls) -> lines per call."""

    def __init__(self):
        self.stats = {}
        self._undo = []

    def _wrap(self, owner, name, fn):
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                st = self.stats.setdefault(name, [0, 0.0])
                st[0] += 1
                st[1] += time.perf_counter() - t0

        setattr(owner, name, timed)
        self._undo.append((owner, name, fn))

    def __enter__(self):
        from numba.cuda import dispatcher as D
        from numba.cuda.cudadrv import driver as drv

        for name, fn in list(vars(drv.driver).items()):
            if name.startswith("cu") and callable(fn):
                self._wrap(drv.driver, name, fn)
        if hasattr(D, "launch"):
            self._wrap(D, "launch", D.launch)
        return self

    def __exit__(self, *exc):
        for owner, name, fn in reversed(self._undo):
            setattr(owner, name, fn)
        self._undo.clear()

    def table(self, calls):
        return [f"    {name:28s} {n / calls:5.2f} calls/call {t / calls * 1e6:8.1f} us/call"
                for name, (n, t) in sorted(self.stats.items(), key=lambda kv: -kv[1][1])]


def _profile(fn, calls, sync, label):
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    sync()
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(18)
    print(f"  cProfile, {label}:")
    print("\n".join(line[:160] for line in buf.getvalue().splitlines()[:45] if line.strip()), flush=True)
    try:
        dc = DriverCalls()
    except Exception:  # noqa: BLE001
        return
    with dc:
        for _ in range(calls):
            fn()
        sync()
    print(f"  driver calls, {label}:")
    print("\n".join(dc.table(calls)) or "    (none seen: the simulator has no driver)", flush=True)


def _type_args(*args):
    """What a launch does with its arguments before anything reaches the GPU: numba types
    each one (a new device array object is typed from scratch)."""
    from numba.core.typing.typeof import Purpose, typeof

    for a in args:
        typeof(a, Purpose.argument)


class _Launcher:
    """Stands for any kernels_cuda kernel (or kernel factory): indexing gives a launch that
    only types its arguments, as numba does first."""

    def __getitem__(self, config):
        return _type_args

    def __call__(self, *args, **kw):
        return self


class _StubKernels:
    """A kernels_cuda module whose every kernel launch does nothing (--stub)."""

    def __getattr__(self, name):
        return _Launcher()


class _FakeMemory:
    """Host bytes posing as a numba device allocation: DeviceNDArray views and the
    dispatcher's checks read its pointer; nothing on a GPU is touched."""

    def __init__(self, nbytes, at=None):
        """nbytes of new host memory, or (at) the host address of memory someone else owns."""
        self._buf = np.empty(max(1, nbytes), np.uint8) if at is None else None
        self._ptr = self._buf.ctypes.data if at is None else int(at)

    @property
    def device_ctypes_pointer(self):  # as numba-cuda's MemoryPointer: c_size_t(int(pointer))
        return ctypes.c_size_t(self._ptr)

    @property
    def device_pointer(self):
        return self._ptr

    def view(self, start, stop=None):
        return self


class _NoContext:
    """numba.cuda as far as the stubbed dispatch needs it: require_context does nothing."""

    @staticmethod
    def require_context(fn):
        return fn


_NO_CONTEXT = _NoContext()


def stubbed(calls, chip="sm_90"):
    """Host microseconds per call of the dispatcher's own layers for CUDA arrays, without a GPU:
    numba DeviceNDArrays over host memory, each kernels_cuda launch replaced by the typing of
    its arguments (numba's first step; the rest of a launch is numba-cuda's), the
    device properties of `chip` assumed, the impls' small cuda.to_device copies (dummies,
    index tables) made over host memory too.  Only the out= path (allocating would need the
    driver).  The part of the host floor that is ours to cut, measurable on any machine."""
    from numba.cuda.cudadrv import devicearray as DA

    import dispatch
    from dispatch import devices
    from dispatch.cuda_impls import _common as C

    from numba import cuda

    def fake(shape, dtype=np.float32):
        a = np.empty(shape, dtype)
        return DA.DeviceNDArray(a.shape, a.strides, a.dtype, gpu_data=_FakeMemory(a.nbytes))

    def fake_copy(a, *args, **kwargs):  # cuda.to_device of the impls' small constant tables and dummies
        a = np.asarray(a)
        return fake(a.shape, a.dtype)

    real_kernels, real_module = C.kernels, devices.cuda_module
    real_to_device = cuda.to_device
    layout = importlib.import_module("kernels_cuda.layout")
    impl_modules = [importlib.import_module(f"dispatch.cuda_impls.{m}")
                    for m in ("activation", "softmax", "norm", "attention")]
    stub = _StubKernels()

    def kernels(name):
        return layout if name == "layout" else stub

    saved = [(m, m.kernels) for m in impl_modules]
    rows = []
    try:
        C.kernels = kernels
        for m in impl_modules:
            m.kernels = kernels
        devices.cuda_module = lambda: _NO_CONTEXT  # no GPU check, no context to enter
        C._type_device_arrays_directly()  # as the first real kernels() call does
        cuda.to_device = fake_copy
        x, o, w, b = fake((128, 3072)), fake((128, 3072)), fake((3072,)), fake((3072,))
        s, so = fake((12, 128, 128)), fake((12, 128, 128))
        q, ao, pad = fake((1, 12, 128, 64)), fake((1, 12, 128, 64)), fake((1, 1, 1, 128), np.bool_)
        cases = {"relu": lambda: dispatch.relu(x, out=o), "softmax": lambda: dispatch.softmax(s, out=so),
                 "layer_norm": lambda: dispatch.layer_norm(x, w, b, out=o),
                 "attention": lambda: dispatch.attention(q, q, q, mask=pad, out=ao)}
        with devices.assume(devices.CHIPS[chip]):
            for name, fn in cases.items():
                t = per_call(fn, lambda: None, calls)
                rows.append((name, "dispatch_out (launches stubbed)", t))
                print(f"{name:10s} {'dispatch(out=), launches stubbed, no GPU':40s} {t * 1e6:9.1f} us/call", flush=True)
    finally:
        C.kernels, devices.cuda_module, cuda.to_device = real_kernels, real_module, real_to_device
        for m, k in saved:
            m.kernels = k
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_overhead", description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--ops", nargs="+", default=["relu", "softmax", "matmul"], choices=["relu", "softmax", "matmul"])
    ap.add_argument("--stub", action="store_true",
                    help="no GPU needed: the dispatcher's own host layers, kernel launches replaced by no-ops")
    args = ap.parse_args(argv)
    if args.stub:
        return stubbed(args.calls)

    from numba import cuda
    from numba.cuda.cudadrv import devicearray as DA
    from numba.cuda.cudadrv import devices as cdev

    import dispatch
    from dispatch import registry
    from dispatch.cuda_impls import _pool as pool

    try:
        import torch
        torch = torch if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001
        torch = None

    # under the simulator (a dry run of this script) tiny shapes: every GPU thread is a Python thread
    sim = cuda.is_available() and not hasattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT")
    r, m, n, s = (4, 8, 6, 5) if sim else (128, 768, 3072, 128)
    rng = np.random.default_rng(0)
    cases = {
        "relu": ({"x": rng.standard_normal((r, n)).astype(np.float32)}, (r, n)),
        "softmax": ({"x": rng.standard_normal((12, s, s)).astype(np.float32)}, (12, s, s)),
        "matmul": ({"a": rng.standard_normal((r, m)).astype(np.float32),
                    "b": rng.standard_normal((m, m)).astype(np.float32)}, (r, m)),
    }
    grid = (1, 32) if sim else (1056, 256)
    sync = cuda.synchronize
    # (the simulator has neither numba-cuda's context runtime nor raw allocations)
    one_ctx = getattr(getattr(cdev, "_runtime", None), "ensure_context", contextlib.nullcontext)
    ctx = cuda.current_context()
    rows = []
    for op_name, (inputs, out_shape) in ((k, v) for k, v in cases.items() if k in args.ops):
        op = registry.OPS[op_name]
        dev = {k: cuda.to_device(v) for k, v in inputs.items()}
        a, kw = op.signature(dev)
        fn = getattr(dispatch, op_name)
        o = cuda.device_array(out_shape, np.float32)
        fn(*a, **kw)
        sync()
        res = {}
        if torch is not None:
            t = {k: torch.as_tensor(v, device="cuda") for k, v in inputs.items()}
            tf = {"relu": lambda: torch.relu(t["x"]), "softmax": lambda: torch.softmax(t["x"], -1),
                  "matmul": lambda: t["a"] @ t["b"]}[op_name]
            res["torch"] = per_call(tf, torch.cuda.synchronize, args.calls)
        if op_name == "relu":
            from kernels_common.activation import ACT_RELU

            from kernels_cuda import activation as KA

            k = KA.kernel_for("unary", np.dtype(np.float32))
            n = inputs["x"].size
            xf, of = dev["x"].reshape(n), o.reshape(n)
            res["launch"] = per_call(lambda: k[grid](xf, of, ACT_RELU), sync, args.calls)
            res["launch (one context)"] = per_call(lambda: k[grid](xf, of, ACT_RELU), sync, args.calls, around=one_ctx)
        nbytes = int(np.prod(out_shape)) * 4
        res["device_array"] = per_call(lambda: cuda.device_array(out_shape, np.float32), sync, args.calls)
        res["device_array (one context)"] = per_call(lambda: cuda.device_array(out_shape, np.float32), sync,
                                                     args.calls, around=one_ctx)
        if hasattr(ctx, "memalloc") and hasattr(cdev, "_runtime"):
            res["memalloc (one context)"] = per_call(lambda: ctx.memalloc(nbytes), sync, args.calls,
                                                          around=one_ctx)
        if hasattr(DA, "DeviceNDArray"):
            res["DeviceNDArray over o's memory"] = per_call(
                lambda: DA.DeviceNDArray(out_shape, o.strides, o.dtype, gpu_data=o.gpu_data), sync, args.calls)
        res["current_context()"] = per_call(cuda.current_context, sync, args.calls)
        res["describe"] = per_call(lambda: op.describe(*a, **kw), sync, args.calls)
        res["dispatch_out"] = per_call(lambda: fn(*a, out=o, **kw), sync, args.calls)
        res["dispatch"] = per_call(lambda: fn(*a, **kw), sync, args.calls)
        if pool._on():  # the same with every result from cuda.device_array, as before the pool
            pool._STATE["on"] = False
            try:
                res["dispatch (result pool off)"] = per_call(lambda: fn(*a, **kw), sync, args.calls)
            finally:
                pool._STATE["on"] = True
        # the same calls inside one entered context (numba-cuda then skips its per-API
        # cuCtxGetCurrent/cuCtxGetDevice look-ups): what resolving it once per dispatch saves
        res["dispatch_out (one context)"] = per_call(lambda: fn(*a, out=o, **kw), sync, args.calls, around=one_ctx)
        res["dispatch (one context)"] = per_call(lambda: fn(*a, **kw), sync, args.calls, around=one_ctx)
        for what, s in res.items():
            rows.append((op_name, what, s))
            print(f"{op_name:8s} {what:40s} {s * 1e6:9.1f} us/call", flush=True)
        if args.profile:
            _profile(lambda: fn(*a, **kw), args.calls, sync, f"dispatch.{op_name}")
            _profile(lambda: fn(*a, out=o, **kw), args.calls, sync, f"dispatch.{op_name}(out=)")
    return rows


if __name__ == "__main__":
    main()
