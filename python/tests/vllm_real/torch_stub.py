"""The few parts of torch that vLLM's offloading modules touch when imported, and the tensor
interface kvoffload.vllm reads, for machines without torch (CI has no GPU stack).

vLLM's kv_offload modules import torch for type annotations (``torch.Tensor``, ``torch.Event``,
``torch.cuda.Stream`` in dataclasses and signatures, evaluated at import) and for device calls
made only by vLLM's own CUDA worker, which these tests never run. So this module defines those
names, and every device call raises: nothing here pretends that a GPU exists.

``Tensor`` is a strided view over memory someone else owns: a numpy array (``from_numpy``, device
``cpu``), or device memory of kvoffload's simulated GPU (``vllm_real.sim_tensor``, device ``cuda:N``,
as torch names CUDA and ROCm devices). It offers what kvoffload.vllm uses of a torch tensor, with
torch's meaning: ``data_ptr()`` (address of the first element), ``shape``, ``stride()`` in
elements, ``element_size()``, ``dtype``, ``device``, ``is_cuda``. Host tensors also give
``numpy()`` (a view, as torch's does).
"""

from __future__ import annotations

import types

import numpy as np

__version__ = "0.0+kvoffload.test.stub"
STUB = True  # lets a test tell this module from a real torch


class dtype:
    def __init__(self, name: str, np_dtype):
        self.name = name
        self.np_dtype = np.dtype(np_dtype)
        self.itemsize = self.np_dtype.itemsize

    def __repr__(self) -> str:
        return f"torch.{self.name}"


int8 = dtype("int8", np.int8)
uint8 = dtype("uint8", np.uint8)
int32 = dtype("int32", np.int32)
int64 = dtype("int64", np.int64)
uint64 = dtype("uint64", np.uint64)
float16 = dtype("float16", np.float16)
float32 = dtype("float32", np.float32)
half = float16
_BY_NUMPY = {d.np_dtype: d for d in (int8, uint8, int32, int64, uint64, float16, float32)}


class device:
    """torch.device: ``device("cuda:1")``, ``device("cuda", 1)``, ``device("cpu")``."""

    def __init__(self, type: str, index: int | None = None):  # noqa: A002 - torch's name
        if isinstance(type, device):
            type, index = type.type, type.index
        if ":" in type:
            type, _, idx = type.partition(":")
            index = int(idx)
        if type not in ("cpu", "cuda"):
            raise RuntimeError(f"torch stub: unknown device type {type!r}")
        self.type = type
        self.index = index

    def __eq__(self, other) -> bool:
        return isinstance(other, device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        return f"device(type='{self.type}'" + ("" if self.index is None else f", index={self.index}") + ")"


class Size(tuple):
    pass


class Tensor:
    def __init__(self, *, address: int, shape, strides, dtype: dtype, device: device, owner=None):
        self._address = int(address)
        self.shape = Size(int(s) for s in shape)
        self._strides = tuple(int(s) for s in strides)
        self.dtype = dtype
        self.device = device
        self._owner = owner  # keeps the memory alive

    def data_ptr(self) -> int:
        return self._address

    def stride(self, dim: int | None = None):
        return self._strides if dim is None else self._strides[dim]

    def element_size(self) -> int:
        return self.dtype.itemsize

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return len(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def numpy(self) -> np.ndarray:
        if self.device.type != "cpu":
            raise TypeError(
                f"can't convert {self.device} device type tensor to numpy. "
                "Use Tensor.cpu() to copy the tensor to host memory first."
            )
        return self._owner

    def view(self, *shape) -> "Tensor":
        """torch's view of a contiguous host tensor with another shape (vLLM's
        SharedOffloadRegion.create_kv_memoryview: a (num_blocks, row) view of its 1-D base)."""
        if self.device.type != "cpu" or not isinstance(self._owner, np.ndarray):
            raise TypeError("torch stub: view() is implemented for host tensors over numpy only")
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return from_numpy(self._owner.reshape(shape))

    def __repr__(self) -> str:
        return f"tensor(<stub>, shape={tuple(self.shape)}, dtype={self.dtype}, device='{self.device}')"


def from_numpy(array: np.ndarray) -> Tensor:
    if array.dtype not in _BY_NUMPY:
        raise TypeError(f"torch stub: numpy dtype {array.dtype} is not supported")
    strides = []
    for s in array.strides:
        if s % array.itemsize:
            raise ValueError("torch stub: strides must be multiples of the element size")
        strides.append(s // array.itemsize)
    return Tensor(address=array.ctypes.data, shape=array.shape, strides=strides,
                  dtype=_BY_NUMPY[array.dtype], device=device("cpu"), owner=array)


def frombuffer(buffer, dtype: dtype = None) -> Tensor:
    """torch.frombuffer: a 1-D host tensor sharing the buffer's memory (vLLM's SharedOffloadRegion
    maps its region file and views it this way)."""
    return from_numpy(np.frombuffer(buffer, dtype=(dtype or uint8).np_dtype))


def _no_gpu(what: str):
    raise RuntimeError(f"torch stub: {what} needs a GPU stack; these tests have none")


class Event:
    def __init__(self, *args, **kwargs):
        _no_gpu("torch.Event")


class _Stream:
    def __init__(self, *args, **kwargs):
        _no_gpu("torch.cuda.Stream")


cuda = types.ModuleType("torch.cuda")
cuda.Stream = _Stream
cuda.Event = Event
cuda.is_available = lambda: False
cuda.device_count = lambda: 0
cuda.current_stream = lambda device=None: _no_gpu("torch.cuda.current_stream")
cuda.current_device = lambda: _no_gpu("torch.cuda.current_device")
cuda.cudart = lambda: _no_gpu("torch.cuda.cudart")

# A CUDA build of torch (tests set hip to a version string for a ROCm build).
version = types.ModuleType("torch.version")
version.cuda = "13.0"
version.hip = None

accelerator = types.ModuleType("torch.accelerator")
accelerator.current_device_index = lambda: _no_gpu("torch.accelerator.current_device_index")
accelerator.synchronize = lambda *a, **k: _no_gpu("torch.accelerator.synchronize")
