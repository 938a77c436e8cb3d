"""kvoffload.vllm_pool is kvoffload.vllm.pool (the module's path before kvoffload.vllm became a
package; configurations and code name it): the same module object, so an attribute set through
either name is seen through both."""

import sys

from .vllm import pool as _module

sys.modules[__name__] = _module
