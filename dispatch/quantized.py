"""QuantizedArray: integer values with their scale(s) and zero point(s) (ONNX QuantizeLinear
semantics, kernels_common/quant.py).

    QuantizedArray(values, scale, zero_point=None, axis=None)
        values: int8 or uint8 array, numpy (CPU) or a CUDA device array, any shape.
        scale: float32, positive and finite: shape () for one scale for the whole tensor
            (axis None), or (values.shape[axis],) for one scale per slice along `axis`
            (per-channel: axis 0 of a (N, K) linear weight, axis 1 of a (K, N) matmul b,
            axis 0 of a (M, K) activation for per-row scales).
        zero_point: values' dtype, the same shape as scale; None means zeros (symmetric).
    The real value of element i is (values[i] - zero_point[c]) * scale[c], c its index
    along axis.  scale and zero_point are held as host numpy arrays whatever the device of
    values (they are small; a CUDA kernel gets a device copy made once per object).

The object is immutable: its fields are checked once here, and kernels may cache what they
derive from it (packed layouts, device copies) on it by identity.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from kernels_common.quant import QTYPES, qrange

from . import interop, validate as V
from .devices import device_kind


def _host(name, a):
    if device_kind(a) == "cuda":
        return np.asarray(a.copy_to_host() if hasattr(a, "copy_to_host") else a)
    if isinstance(a, (np.matrix, np.ma.MaskedArray)):
        raise TypeError(f"{name} must be a plain numpy array, got {type(a).__name__} (its semantics would be "
                        "dropped silently): pass np.asarray(...)")
    if isinstance(a, np.ndarray):
        return a
    if isinstance(a, (int, float, np.number)):
        return np.asarray(a)
    raise TypeError(f"{name} must be a numpy array or a number, got {type(a).__name__}")


_MISSING = object()


@dataclass(frozen=True, eq=False)
class QuantizedArray:
    values: object
    scale: np.ndarray
    zero_point: np.ndarray | None = None
    axis: int | None = None
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _lock: object = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    _keys: tuple = field(default=(), init=False, repr=False, compare=False)  # _cache's keys, in order

    def __post_init__(self):
        for part in ("values", "scale", "zero_point"):     # PyTorch CPU tensors: their numpy views
            object.__setattr__(self, part, interop.as_array(part, getattr(self, part)))
        values = self.values
        if not (isinstance(values, np.ndarray) or device_kind(values) == "cuda"):
            raise TypeError(f"values must be a numpy array or a CUDA device array, got {type(values).__name__}")
        if isinstance(values, (np.matrix, np.ma.MaskedArray)):
            raise TypeError(f"values must be a plain numpy array, got {type(values).__name__} (its semantics would "
                            "be dropped silently): pass np.asarray(...)")
        dt = V.dtype_of(values)
        if dt not in {d for d, _, _ in QTYPES.values()}:
            raise TypeError(f"values must be int8 or uint8, got {dt}")
        ndim = len(values.shape)
        axis = self.axis
        if axis is not None:
            axis = V.axis("axis", axis, ndim)
        want = () if axis is None else (int(values.shape[axis]),)
        scale = _host("scale", self.scale)
        if scale.dtype.kind != "f":
            raise TypeError(f"scale must be a float array, got {scale.dtype}")
        scale = np.ascontiguousarray(scale, dtype=np.float32)
        if axis is None and scale.shape == (1,):
            scale = scale.reshape(())
        if scale.shape != want:
            raise ValueError(f"scale must have shape {want} for axis={self.axis} and values of shape "
                             f"{tuple(values.shape)}, got {scale.shape}")
        if not np.all(np.isfinite(scale)) or not np.all(scale > 0):
            bad = scale[~(np.isfinite(scale) & (scale > 0))].ravel()[:3]
            raise ValueError(f"scale must be positive and finite, got {bad.tolist()}")
        zp = self.zero_point
        if zp is None:
            zp = np.zeros(want, dt)
        else:
            zp = _host("zero_point", zp)
            if zp.dtype != dt:
                raise TypeError(f"zero_point must have values' dtype {dt}, got {zp.dtype}")
            if axis is None and zp.shape == (1,):
                zp = zp.reshape(())
            if zp.shape != want:
                raise ValueError(f"zero_point must have scale's shape {want}, got {zp.shape}")
            zp = np.ascontiguousarray(zp).reshape(want)  # ascontiguousarray makes a 0-d array 1-d
        scale.setflags(write=False)
        zp.setflags(write=False)
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "zero_point", zp)
        object.__setattr__(self, "axis", axis)
        # read on every call of the int8 ops (describe reads shape 7 times): made once
        object.__setattr__(self, "_dtype", dt)
        object.__setattr__(self, "_shape", tuple(int(s) for s in values.shape))

    @classmethod
    def of_kernel(cls, values, scale, zero_point, axis):
        """The QuantizedArray of a quantize kernel's outputs, without __post_init__'s checks
        (about 10 us, a quarter of quantizing BERT-base's 128x768 activations): values int8
        / uint8 (host or CUDA), scale float32 and zero_point values' dtype, both
        C-contiguous host arrays of shape () (axis None) or (values.shape[axis],), every
        scale positive and finite, axis normalized -- what dispatch.quantize's
        implementations make.  Anyone else: the constructor."""
        self = object.__new__(cls)
        scale.setflags(write=False)
        zero_point.setflags(write=False)
        # the frozen dataclass's fields straight into its __dict__ (one object.__setattr__
        # per field cost 1.6 of the 3.3 us this took; Zen 4, 2026-12-04)
        self.__dict__.update(values=values, scale=scale, zero_point=zero_point, axis=axis, _cache={},
                             _lock=threading.Lock(), _keys=(), _dtype=V.dtype_of(values),
                             _shape=tuple(map(int, values.shape)))
        return self

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def shape(self) -> tuple:
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def device(self) -> str:
        return "cuda" if device_kind(self.values) == "cuda" else "cpu"

    @property
    def symmetric(self) -> bool:
        return not np.any(self.zero_point)

    @property
    def qrange(self) -> tuple:
        """(lowest, highest) integer of values' dtype."""
        return qrange(self.dtype)

    def cached(self, key, make):
        """make() once per key for this object (thread-safe): derived layouts and device
        copies that are valid as long as the object lives (it is immutable; its values
        array must not be written after construction).  An entry, once made, is read
        without the lock (entries are never replaced or removed, and a dict read is
        atomic): the lock cost ~0.5 us of a 14 us dequantize 128x768 (Zen 4, 2026-12-06)."""
        hit = self._cache.get(key, _MISSING)
        if hit is not _MISSING:
            return hit
        with self._lock:
            if key not in self._cache:
                self._cache[key] = make()
                # published after the entry: a reader that sees the key finds the entry
                object.__setattr__(self, "_keys", self._keys + (key,))
            return self._cache[key]

    # dispatch/memo.py: the key below is structural, so a remembered call takes any
    # QuantizedArray of that key (an activation is a new one on every call)
    __memo_identity__ = False

    def __memo_key__(self):
        """Its part of a call's signature (dispatch/memo.py): what describe reads of it -- its
        values' type (host or CUDA), shape, strides and dtype, its axis -- and the keys of the
        layouts cached on it (the int8 ops' key says whether the weight is prepacked, and
        explain's note which layouts are): a call after a new layout was cached is described
        again.  Not the scale or zero point values, which no describe reads (the kernels
        read them on every call)."""
        v = self.values
        return type(v), self._shape, getattr(v, "strides", None), self._dtype, self.axis, self._keys

    def __memo_arrays__(self):
        """The caller's memory it holds (dispatch/memo.py checks a remembered call's out=
        against it, as describe does): the host values; scale and zero point are its own
        copies."""
        return (self.values,) if isinstance(self.values, np.ndarray) else ()

    def cached_keys(self) -> tuple:
        """The keys cached() holds so far (what `explain` reports as already prepacked)."""
        return self._keys

    def __repr__(self):
        kind = "per-tensor" if self.axis is None else f"per-channel axis={self.axis}"
        return (f"QuantizedArray(shape={self.shape}, dtype={self.dtype}, {kind}, "
                f"{'symmetric' if self.symmetric else 'asymmetric'}, device={self.device})")
