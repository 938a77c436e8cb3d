"""kvoffload: offload KV-cache blocks from GPU memory to a pinned host pool shared by all ranks.

The classes come from the C++ extension ``kvoffload._kvoffload``:

- ``Region.create_or_join(engine_id=..., num_chunks=..., slot_bytes=..., world_size=..., rank=...)``:
  the shared host region; ``region.slot(c)`` is a HostBuffer that ``numpy.asarray`` views without
  copying (the region stays mapped while any view exists). One live process per rank, and one
  scheduler (``rank=None``): a second one gets ``Error`` with ``ErrorCode.IN_USE`` naming the PID.
- ``make_runtime("host" | "sim" | "cuda" | "hip" | "auto")`` and ``TransferEngine``: device pointers are
  ints (``tensor.data_ptr()``), stores and loads are asynchronous jobs polled for completion.
- ``Manager(num_chunks, policy="lru" | "arc")``: lookup, prepare/complete store and load, events.
- ``RemoteTierOptions(url, slot_bytes, world_size=..., dtype=...)``: the distributed tier's
  configuration (``validate()``, ``fingerprint``); ``parse_remote_url(url)``.
- ``Error``: every failure; ``str(e)`` is the message, ``e.code`` an ``ErrorCode``.
"""

from . import _kvoffload as _ext

# Every public name of the extension, re-exported (what `from ._kvoffload import *` did, spelled
# so a linter can follow it; type checkers read __init__.pyi, generated with _kvoffload.pyi).
__version__ = _ext.__version__
__all__ = [name for name in dir(_ext) if not name.startswith("_")]
globals().update({name: getattr(_ext, name) for name in __all__})
