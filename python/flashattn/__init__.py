"""flashattn: exact, IO-aware attention (FlashAttention family) through a C ABI.

The PyTorch API is a drop-in for flash_attn 2.x (flash_attn_func and friends). The library
(libflashattn.so) is loaded with ctypes, so nothing is compiled against torch: one build works
with any torch >= 2.4. Set FLASHATTN_LIBRARY=/path/to/libflashattn.so to use another build.

Without torch, the ctypes layer still imports (version(), compiled_backends(), device_info()).
"""

from ._lib import FlashAttnError, compiled_backends, device_info, library_path
from ._lib import version as _c_version

__version__ = "0.1.0"


def version():
    """Version of the loaded C library."""
    return _c_version()


try:
    import torch as _torch
except ImportError:  # pragma: no cover - exercised only without torch
    _torch = None

_TORCH_API = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
]

if _torch is not None:
    _tv = tuple(int(x) for x in _torch.__version__.split("+")[0].split(".")[:2])
    if _tv < (2, 4):
        raise ImportError(f"flashattn needs torch >= 2.4 (torch.library.custom_op); found {_torch.__version__}")
    from .interface import (  # noqa: E402
        _bench_bwd,
        _bench_fwd,
        _flash_attn,
        flash_attn_func,
        flash_attn_kvpacked_func,
        flash_attn_qkvpacked_func,
        flash_attn_varlen_func,
        flash_attn_varlen_kvpacked_func,
        flash_attn_varlen_qkvpacked_func,
    )
else:  # pragma: no cover

    def _needs_torch(name):
        def f(*args, **kwargs):
            raise ImportError(f"flashattn.{name} needs PyTorch >= 2.4 (pip install torch)")

        f.__name__ = name
        return f

    for _n in _TORCH_API:
        globals()[_n] = _needs_torch(_n)

__all__ = _TORCH_API + ["FlashAttnError", "compiled_backends", "device_info", "library_path", "version"]
