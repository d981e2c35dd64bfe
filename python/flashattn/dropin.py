"""`install_as_flash_attn()`: make `import flash_attn` resolve to flashattn (the pymysql.install_as_MySQLdb
convention). Explicit, and never silently over a real flash_attn: if one is installed or imported,
it refuses unless called with replace_installed=True.

Provided after installing: `flash_attn` (the six flash_attn_*func functions, flash_attn_with_kvcache,
__version__), `flash_attn.flash_attn_interface`,
`flash_attn.bert_padding`, `flash_attn.layers.rotary` (apply_rotary_emb). Other flash_attn
submodules (ops, modules, models, ...) are not provided: importing them raises ModuleNotFoundError.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

__all__ = ["FLASH_ATTN_COMPAT_VERSION", "install_as_flash_attn"]

# The flash_attn release whose Python API this package mirrors (argument names, defaults, return
# values, unpad_input's 5-tuple). User code gates features on flash_attn.__version__ (e.g. >= 2.1
# for bottom-right causal, >= 2.3 for window_size, >= 2.6 for softcap), so a 2.x string lets those
# checks pass; flash_attn.__flashattn_version__ says what is really behind it.
FLASH_ATTN_COMPAT_VERSION = "2.7.4"

_MARK = "__flashattn_dropin__"


def _module(name: str, doc: str, package: bool = False) -> types.ModuleType:
    m = types.ModuleType(name, doc)
    # A spec, so importlib.util.find_spec("flash_attn") (used by availability checks) works on it.
    m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=package)
    if package:
        m.__path__ = []  # a package with no files: unprovided submodules fail to import, cleanly
    setattr(m, _MARK, True)
    return m


def _is_ours(module: Any) -> bool:
    return getattr(module, _MARK, False) is True


def _real_flash_attn() -> str:
    """A description of a real flash_attn that is imported or importable, or '' if there is none."""
    mod = sys.modules.get("flash_attn")
    if mod is not None:
        return "" if _is_ours(mod) else f"flash_attn is already imported (from {getattr(mod, '__file__', None)!r})"
    try:
        spec = importlib.util.find_spec("flash_attn")
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        where = spec.origin or (list(spec.submodule_search_locations or []) or ["?"])[0]
        return f"a flash_attn package is installed at {where!r}"
    return ""


def install_as_flash_attn(replace_installed: bool = False) -> types.ModuleType:
    """Registers flashattn as `flash_attn` in sys.modules; returns the `flash_attn` module.

    Call it before the first `import flash_attn`. Refuses (ImportError) when a real flash_attn is
    installed or already imported, unless replace_installed=True: then flashattn replaces it for
    imports from now on (modules that already hold the real functions keep them). Calling it again
    is a no-op.
    """
    if not isinstance(replace_installed, bool):
        raise TypeError(f"flashattn: replace_installed must be a bool, got {type(replace_installed).__name__}")
    current = sys.modules.get("flash_attn")
    if current is not None and _is_ours(current):
        return current
    real = _real_flash_attn()
    if real and not replace_installed:
        raise ImportError(
            f"flashattn.install_as_flash_attn: {real}; refusing to shadow it. Use the real one, or "
            "pass replace_installed=True to route `import flash_attn` to flashattn anyway.")

    from . import bert_padding, interface, rotary

    top = _module("flash_attn", "flashattn standing in for flash_attn 2.x (flashattn.install_as_flash_attn).",
                  package=True)
    top.__version__ = FLASH_ATTN_COMPAT_VERSION
    from . import __version__ as ours

    top.__flashattn_version__ = ours
    fai = _module("flash_attn.flash_attn_interface", interface.__doc__)
    names = tuple(interface.__all__)  # the six flash_attn_*_func and flash_attn_with_kvcache
    for name in names:
        fn = getattr(interface, name)
        setattr(top, name, fn)
        setattr(fai, name, fn)
    fai.__all__ = list(names)
    top.__all__ = list(fai.__all__)

    # bert_padding and rotary are this package's own modules, aliased; the two flash_attn
    # namespaces are fresh modules so that flashattn.interface keeps its own identity.
    layers = _module("flash_attn.layers", "flashattn standing in for flash_attn.layers.", package=True)
    layers.rotary = rotary
    top.flash_attn_interface = fai
    top.bert_padding = bert_padding
    top.layers = layers

    if replace_installed:  # drop the real package's submodules so no import mixes the two
        for key in [k for k in sys.modules if k == "flash_attn" or k.startswith("flash_attn.")]:
            del sys.modules[key]
    sys.modules["flash_attn.flash_attn_interface"] = fai
    sys.modules["flash_attn.bert_padding"] = bert_padding
    sys.modules["flash_attn.layers"] = layers
    sys.modules["flash_attn.layers.rotary"] = rotary
    sys.modules["flash_attn"] = top  # last: before this, an `import flash_attn` finds nothing half-made
    return top
