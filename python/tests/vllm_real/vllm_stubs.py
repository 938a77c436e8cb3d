"""Stand-ins for the vLLM modules that the offloading sources at KVOFFLOAD_VLLM_SRC import but that
the tree does not contain (it holds vllm/v1/kv_offload, the offloading connector and
vllm/config/kv_transfer.py, not the rest of vLLM) or that need a GPU stack.

Each entry is as small as the imported names allow and says what it stands for. None of them
decides anything the tests check: managers, policies, specs, metrics and configs are vLLM's own.
Where vLLM itself has a no-GPU answer, that answer is used (triton_utils' placeholder, the CPU
platform, no pinned memory); a call that needs a GPU raises.

Add a module here (one function, registered in STUBS) when a test imports a vLLM module that needs
it; keep the reason next to it.
"""

from __future__ import annotations

import hashlib
import logging
import types
from collections.abc import Callable
from pathlib import Path


def _module(name: str, doc: str, package_path: list[str] | None = None) -> types.ModuleType:
    m = types.ModuleType(name, doc)
    m.__file__ = __file__
    if package_path is not None:
        m.__path__ = package_path
    return m


# --- vllm.logger: init_logger returns vLLM's _VllmLogger, a Logger with *_once methods. --------
class _OnceLogger(logging.LoggerAdapter):
    def __init__(self, logger: logging.Logger):
        super().__init__(logger, {})
        self._seen: set[tuple[int, str]] = set()

    def _once(self, level: int, msg: str, *args, **kwargs) -> None:
        if (level, msg) not in self._seen:
            self._seen.add((level, msg))
            self.log(level, msg, *args, **kwargs)

    def debug_once(self, msg, *args, **kwargs):
        self._once(logging.DEBUG, msg, *args, **kwargs)

    def info_once(self, msg, *args, **kwargs):
        self._once(logging.INFO, msg, *args, **kwargs)

    def warning_once(self, msg, *args, **kwargs):
        self._once(logging.WARNING, msg, *args, **kwargs)


def _logger(tree: Path) -> types.ModuleType:
    m = _module("vllm.logger", "vllm/logger.py: init_logger (not in the tree)")
    m.init_logger = lambda name: _OnceLogger(logging.getLogger(name))
    return m


# --- vllm.utils: math_utils, torch_utils, hashing (not in the tree). -------------------------
def _utils(tree: Path) -> types.ModuleType:
    return _module("vllm.utils", "vllm/utils/ (not in the tree)", package_path=[])


def _math_utils(tree: Path) -> types.ModuleType:
    m = _module("vllm.utils.math_utils", "vllm/utils/math_utils.py: vLLM's definitions")
    m.cdiv = lambda a, b: -(a // -b)
    m.round_up = lambda x, y: ((x + y - 1) // y) * y
    m.round_down = lambda x, y: (x // y) * y
    m.next_power_of_2 = lambda n: 1 if n < 1 else 1 << (n - 1).bit_length()
    return m


def _torch_utils(tree: Path) -> types.ModuleType:
    m = _module("vllm.utils.torch_utils", "vllm/utils/torch_utils.py: no CUDA, so no pinned memory")
    m.PIN_MEMORY = False  # vLLM: is_pin_memory_available() is False without CUDA
    return m


def _hashing(tree: Path) -> types.ModuleType:
    m = _module("vllm.utils.hashing", "vllm/utils/hashing.py: safe_hash")

    def safe_hash(data: bytes = b"", usedforsecurity: bool = True):
        return hashlib.md5(data, usedforsecurity=usedforsecurity)

    m.safe_hash = safe_hash
    return m


# --- vllm.platforms: current_platform is vLLM's CPU platform on a machine without a GPU. ------
class _CpuPlatform:
    device_name = "cpu"
    device_type = "cpu"

    def is_cuda_alike(self) -> bool:
        return False

    def is_cuda(self) -> bool:
        return False

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return True

    def __getattr__(self, name):
        raise AttributeError(f"vllm.platforms stub: current_platform.{name} needs a GPU platform")


def _platforms(tree: Path) -> types.ModuleType:
    m = _module("vllm.platforms", "vllm/platforms: current_platform on a machine without a GPU")
    m.current_platform = _CpuPlatform()
    return m


# --- vllm._custom_ops, vllm.triton_utils: vLLM's compiled kernels and Triton. --------------------
def _custom_ops(tree: Path) -> types.ModuleType:
    m = _module("vllm._custom_ops", "vllm/_custom_ops.py: vLLM's compiled CUDA kernels")

    def missing(name):
        raise AttributeError(f"vllm._custom_ops.{name}: vLLM's CUDA kernels are not available here")

    m.__getattr__ = missing
    return m


class _TritonPlaceholder(types.ModuleType):
    """vllm/triton_utils/importing.py's TritonPlaceholder: what vLLM uses when Triton is absent."""

    def __init__(self):
        super().__init__("triton")
        self.jit = self._dummy_decorator
        self.autotune = self._dummy_decorator
        self.heuristics = self._dummy_decorator
        self.Config = lambda *a, **k: None
        self.next_power_of_2 = lambda n: 1 if n < 1 else 1 << (n - 1).bit_length()

    @staticmethod
    def _dummy_decorator(*args, **kwargs):
        if args and callable(args[0]):
            return args[0]
        return lambda f: f


class _TritonLanguagePlaceholder(types.ModuleType):
    def __init__(self):
        super().__init__("triton.language")
        self.constexpr = None
        self.dtype = None
        self.int64 = None
        self.int32 = None
        self.tensor = None


def _triton_utils(tree: Path) -> types.ModuleType:
    m = _module("vllm.triton_utils", "vllm/triton_utils: the placeholders vLLM uses without Triton")
    m.HAS_TRITON = False
    m.triton = _TritonPlaceholder()
    m.tl = _TritonLanguagePlaceholder()
    return m


# --- vllm.distributed.device_communicators.shm_broadcast: used by SharedOffloadRegion only. ------
def _device_communicators(tree: Path) -> types.ModuleType:
    return _module("vllm.distributed.device_communicators", "not in the tree", package_path=[])


def _shm_broadcast(tree: Path) -> types.ModuleType:
    m = _module("vllm.distributed.device_communicators.shm_broadcast", "not in the tree")

    def check_shm_free_space(*args, **kwargs):
        raise RuntimeError("vLLM's SharedOffloadRegion is not used by these tests")

    m.check_shm_free_space = check_shm_free_space
    return m


# --- vllm.config: the package's __init__ is not in the tree; kv_transfer.py is. -----------------
def _config(tree: Path) -> types.ModuleType:
    # A package whose path is the tree's vllm/config, so vllm.config.kv_transfer is vLLM's file.
    m = _module("vllm.config", "vllm/config/__init__.py: VllmConfig and the re-exports used here",
                package_path=[str(tree / "vllm" / "config")])

    class VllmConfig:
        """The part of vllm.config.VllmConfig the offloading metrics read."""

        def __init__(self, kv_transfer_config=None, **unsupported):
            if unsupported:
                raise TypeError(f"VllmConfig stub: unsupported fields {sorted(unsupported)}")
            self.kv_transfer_config = kv_transfer_config

    m.VllmConfig = VllmConfig

    def __getattr__(name):
        if name == "KVTransferConfig":  # vLLM's own class, from the tree
            from vllm.config.kv_transfer import KVTransferConfig

            return KVTransferConfig
        raise AttributeError(f"vllm.config stub has no {name}")

    m.__getattr__ = __getattr__
    return m


def _config_utils(tree: Path) -> types.ModuleType:
    # vLLM's @config makes a pydantic dataclass; the kv_transfer config validates itself in
    # __post_init__, which a plain dataclass runs too.
    import dataclasses

    m = _module("vllm.config.utils", "vllm/config/utils.py: the @config decorator")
    m.config = lambda cls=None, **kw: dataclasses.dataclass(cls) if cls else dataclasses.dataclass
    return m


def _kv_connector_factory(tree: Path) -> types.ModuleType:
    m = _module("vllm.distributed.kv_transfer.kv_connector.factory",
                "kv_connector/factory.py: KVConnectorFactory (imported by the metrics base)")

    class KVConnectorFactory:
        @classmethod
        def get_connector_class(cls, kv_transfer_config):
            raise NotImplementedError("KVConnectorFactory is not part of the vLLM tree here")

    m.KVConnectorFactory = KVConnectorFactory
    return m


# Module name -> builder, in import order (parents before children).
STUBS: dict[str, Callable[[Path], types.ModuleType]] = {
    "vllm.logger": _logger,
    "vllm.utils": _utils,
    "vllm.utils.math_utils": _math_utils,
    "vllm.utils.torch_utils": _torch_utils,
    "vllm.utils.hashing": _hashing,
    "vllm.platforms": _platforms,
    "vllm._custom_ops": _custom_ops,
    "vllm.triton_utils": _triton_utils,
    "vllm.distributed.device_communicators": _device_communicators,
    "vllm.distributed.device_communicators.shm_broadcast": _shm_broadcast,
    "vllm.config": _config,
    "vllm.config.utils": _config_utils,
    "vllm.distributed.kv_transfer.kv_connector.factory": _kv_connector_factory,
}
