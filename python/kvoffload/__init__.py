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

from ._kvoffload import *  # noqa: F401,F403
from ._kvoffload import __version__  # noqa: F401
from . import _kvoffload as _ext

__all__ = [name for name in dir(_ext) if not name.startswith("_")]
