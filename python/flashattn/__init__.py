"""flashattn: exact, IO-aware attention (FlashAttention family) through a C ABI.

The PyTorch API is a drop-in for flash_attn 2.x (flash_attn_func and friends). The library
(libflashattn.so) is loaded with ctypes, so nothing is compiled against torch: one build works
with any torch >= 2.4. Set FLASHATTN_LIBRARY=/path/to/libflashattn.so to use another build.

Without torch, the ctypes layer still imports (version(), compiled_backends(), device_info()).

`flashattn.install_as_flash_attn()` makes `import flash_attn` (and flash_attn.bert_padding,
flash_attn.layers.rotary) resolve to this package; `flashattn.integrations.transformers.register()`
plugs it into Hugging Face Transformers.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List

from . import _lib
from ._lib import FlashAttnError
from .dropin import install_as_flash_attn

__version__ = "0.1.0"


# Typed front ends of the ctypes layer's functions (the public surface is typed; _lib stays untyped).
def version() -> str:
    """Version of the loaded C library."""
    return _lib.version()


def library_path() -> str:
    """Path of the loaded libflashattn (loads it if needed)."""
    return _lib.library_path()


def compiled_backends() -> List[str]:
    """Names of the backends compiled into the loaded library ("reference", "cpu", "sm80", "sm90")."""
    return _lib.compiled_backends()


def device_info(device: int = 0) -> Dict[str, Any]:
    """Capability of CUDA device `device` as a dict (raises FlashAttnError when there is none)."""
    return _lib.device_info(device)


try:
    import torch as _torch
except ImportError:  # pragma: no cover - exercised only without torch
    _torch = None

# interface.__all__, spelled out because interface needs torch and this list must not
# (test_dropin.py checks the two agree).
_TORCH_API = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
]

if _torch is not None:
    _tv = tuple(int(x) for x in _torch.__version__.split("+")[0].split(".")[:2])
    if _tv < (2, 4):
        raise ImportError(f"flashattn needs torch >= 2.4 (torch.library.custom_op); found {_torch.__version__}")
    from .interface import (  # noqa: E402
        flash_attn_func,
        flash_attn_kvpacked_func,
        flash_attn_qkvpacked_func,
        flash_attn_varlen_func,
        flash_attn_varlen_kvpacked_func,
        flash_attn_varlen_qkvpacked_func,
        flash_attn_with_kvcache,
    )
    from .combine import combine  # noqa: E402
    from .fp8 import dequantize as fp8_dequantize  # noqa: E402
    from .fp8 import flash_attn_fp8_func  # noqa: E402
    from .fp8 import quantize as fp8_quantize  # noqa: E402
else:  # pragma: no cover

    def _needs_torch(name: str) -> Callable[..., Any]:
        def f(*args: Any, **kwargs: Any) -> Any:
            raise ImportError(f"flashattn.{name} needs PyTorch >= 2.4 (pip install torch)")

        f.__name__ = name
        return f

    for _n in _TORCH_API + ["combine", "fp8_quantize", "fp8_dequantize", "flash_attn_fp8_func"]:
        globals()[_n] = _needs_torch(_n)

__all__ = _TORCH_API + ["FlashAttnError", "combine", "compiled_backends", "device_info", "flash_attn_fp8_func",
                       "fp8_dequantize", "fp8_quantize", "install_as_flash_attn", "library_path", "version"]
