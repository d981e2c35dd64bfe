"""Drop-in for flash_attn 2.x's Python API (flash_attn.flash_attn_interface).

Same function names, argument names, defaults and return values; tensors are
[batch, seqlen, nheads, headdim] (varlen: packed [total, nheads, headdim]). CPU tensors run the
host path, CUDA tensors the fastest GPU path compiled for their device, on torch's current
stream. Options a path does not implement raise NotImplementedError naming the option; they are
never ignored (the KV cache of flash_attn_with_kvcache and paged KV, block_table, run on the host
paths only for now).

Dropout applies whenever dropout_p > 0, as in flash_attn (regardless of torch's train/eval mode:
pass 0 in eval). Each such call draws its {seed, offset} from torch's default generator of the
tensors' device (torch.manual_seed reproduces a run; CUDA-graph replays draw fresh numbers) and
the backward regenerates the same mask; the random numbers are Philox4x32-10, the same on every
backend (flashattn.h, "Dropout"; rebuilt in pure torch by flashattn._dropout). ALiBi
(alibi_slopes, float32 [nheads] or [batch, nheads]) adds -slope * |i + seqlen_k - seqlen_q - j| to
the scores after the softcap, as flash_attn; the slopes get no gradient.
"""

from __future__ import annotations

import math
import numbers
import operator

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from . import _dropout, _lib
from . import _ops  # also registers torch.ops.flashattn.*

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
]

# out, or (out, softmax_lse, S_dmask or None) with return_attn_probs=True.
_Out = Union[Tensor, Tuple[Tensor, Tensor, Optional[Tensor]]]

_FP8 = torch.float8_e4m3fn
_CUDA_DTYPES = (torch.float16, torch.bfloat16)
_CPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_CUDA_DTYPE_SET, _CPU_DTYPE_SET = frozenset(_CUDA_DTYPES), frozenset(_CPU_DTYPES)  # hashed: cheaper than == on each


def _int_like(x):
    """x as a Python int if it is an integer of any kind (int, numpy or 0-d torch integer), else None."""
    if type(x) is int:
        return x
    if isinstance(x, bool) or (isinstance(x, torch.Tensor) and (x.dim() != 0 or x.is_floating_point())):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


_NO_WINDOW = (-1, -1)  # every entry point's default window_size, recognized by identity (no check)


def _check_window(window_size):
    """window_size as flash_attn takes it: any pair of int-likes (tuple, list, torch or numpy)."""
    if type(window_size) is tuple and len(window_size) == 2:  # the usual (left, right) of Python ints: no copies
        left, right = window_size
        if type(left) is int and type(right) is int and left >= -1 and right >= -1:
            return left, right
    try:
        left, right = (_int_like(x) for x in window_size)
    except (TypeError, ValueError):
        raise ValueError(f"flashattn: window_size must be a pair (left, right), got {window_size!r}") from None
    if left is None or right is None or left < -1 or right < -1:
        raise ValueError(f"flashattn: window_size {window_size!r}: each side must be an integer >= -1 "
                         "(-1 = unbounded)")
    return left, right


def _check_softmax_scale(softmax_scale, headdim):
    """None -> 1/sqrt(headdim); otherwise a finite real > 0 (Python, numpy or 0-d torch). 0 is refused,
    not silently replaced: the C ABI reads 0 as "default", flash_attn would compute with it."""
    if softmax_scale is None:
        return headdim ** (-0.5)
    real = (softmax_scale.dim() == 0 if isinstance(softmax_scale, torch.Tensor)
            else isinstance(softmax_scale, numbers.Real) and not isinstance(softmax_scale, bool))
    if not real:
        raise ValueError(f"flashattn: softmax_scale must be a real number or None, got {softmax_scale!r}")
    scale = float(softmax_scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"flashattn: softmax_scale={softmax_scale!r} must be finite and > 0 "
                         "(pass None for 1/sqrt(headdim))")
    return scale


def _check_inputs(q, k, v, packed_ndim, kv_ndim=None, names=("q", "k", "v"), same_batch=True):
    """q, k, v (or q, k_cache, v_cache): tensors on one device, one supported dtype, ranks packed_ndim (q) and
    kv_ndim (k, v; default packed_ndim), one head dim, GQA-compatible heads, and (same_batch, 4-D) one batch.
    The usual valid call passes one combined test (each attribute read once); anything else goes through
    _check_inputs_slow, which raises the error naming the first failed check."""
    if not _inputs_ok(q, k, v, packed_ndim, packed_ndim if kv_ndim is None else kv_ndim, same_batch):
        _check_inputs_slow(q, k, v, packed_ndim, kv_ndim, names, same_batch)


def _inputs_ok(q, k, v, packed_ndim, kv_ndim, same_batch=True, fp8=False):
    """(q.shape, k.shape) when q, k, v pass every check of _check_inputs (then none is FP8, unless fp8: then all
    are), so that a caller need not read them again; None otherwise (never raises)."""
    if isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor):
        dt = q.dtype
        if k.dtype != dt or v.dtype != dt:
            return None
        if fp8:
            if dt != _FP8 or not (q.is_cuda and k.device == q.device and v.device == q.device
                                  or q.is_cpu and k.is_cpu and v.is_cpu):
                return None
        elif q.is_cuda:
            dev = q.device
            if dt not in _CUDA_DTYPE_SET or k.device != dev or v.device != dev:
                return None
        elif not (q.is_cpu and k.is_cpu and v.is_cpu and dt in _CPU_DTYPE_SET):  # is_cpu: no torch.device objects
            return None
        qs, ks = q.shape, k.shape
        if (len(qs) == packed_ndim and len(ks) == kv_ndim and v.shape == ks
                and qs[-1] == ks[-1] and qs[-1] != 0 and qs[-2] != 0 and ks[-2] != 0 and qs[-2] % ks[-2] == 0
                and not (same_batch and packed_ndim == 4 and qs[0] != ks[0])):
            return qs, ks
    return None


def _check_inputs_slow(q, k, v, packed_ndim, kv_ndim=None, names=("q", "k", "v"), same_batch=True):
    """q, k, v (or q, k_cache, v_cache): tensors on one device, one supported dtype, ranks packed_ndim (q) and
    kv_ndim (k, v; default packed_ndim), one head dim, GQA-compatible heads, and (same_batch, 4-D) one batch."""
    kv_ndim = packed_ndim if kv_ndim is None else kv_ndim
    qn, kn, vn = names
    for name, t in zip(names, (q, k, v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flashattn: {name} must be a torch.Tensor, got {type(t).__name__}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"flashattn: {qn}, {kn}, {vn} must be on the same device (got {qn}: {q.device}, {kn}: "
                         f"{k.device}, {vn}: {v.device})")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"flashattn: {qn}, {kn}, {vn} must have the same dtype (got {qn}: {q.dtype}, {kn}: "
                         f"{k.dtype}, {vn}: {v.dtype})")
    if q.dtype == _FP8 and q.device.type in ("cpu", "cuda"):
        pass  # FP8 attention (_flash_attn_fp8): the library says which paths run it
    elif q.device.type == "cuda":
        if q.dtype not in _CUDA_DTYPES:
            if q.dtype in _CPU_DTYPES:
                raise NotImplementedError(
                    f"flashattn: dtype {q.dtype} on CUDA is not supported (CUDA paths: float16, bfloat16)")
            raise ValueError(f"flashattn: dtype {q.dtype} is not supported (float16, bfloat16)")
    elif q.device.type == "cpu":
        if q.dtype not in _CPU_DTYPES:
            raise ValueError(f"flashattn: dtype {q.dtype} is not supported (float16, bfloat16, float32, float64)")
    else:
        raise ValueError(f"flashattn: {qn} is on device {q.device}; only CPU and CUDA tensors are supported")
    layouts = {4: "[batch, seqlen, nheads, headdim]", 3: "[total, nheads, headdim]"}
    for name, t, ndim in zip(names, (q, k, v), (packed_ndim, kv_ndim, kv_ndim)):
        if t.dim() != ndim:
            layout = layouts[ndim] if ndim == packed_ndim or name == qn else "[num_blocks, page_block_size, nheads_k, headdim]"
            raise ValueError(f"flashattn: {name} must be {ndim}-D {layout}, got shape {tuple(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"flashattn: {kn} and {vn} must have the same shape (got {kn}: {tuple(k.shape)}, {vn}: "
                         f"{tuple(v.shape)})")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"flashattn: {qn} and {kn} must have the same head dim (got {qn}: {q.shape[-1]}, {kn}: "
                         f"{k.shape[-1]})")
    if q.shape[-1] == 0:
        raise ValueError(f"flashattn: headdim (the last dim of {qn}, {kn}, {vn}) is 0, got {qn} shape {tuple(q.shape)}")
    hq, hk = q.shape[-2], k.shape[-2]
    if hq == 0:
        raise ValueError(f"flashattn: nheads of {qn} is 0, got {qn} shape {tuple(q.shape)}")
    if hk == 0 or hq % hk != 0:
        raise ValueError(f"flashattn: the number of heads in {qn} ({hq}) must be a multiple of that in {kn}, {vn} "
                         f"({hk})")
    if same_batch and packed_ndim == 4 and q.shape[0] != k.shape[0]:
        raise ValueError(f"flashattn: {qn} and {kn} must have the same batch size (got {qn}: {q.shape[0]}, {kn}: "
                         f"{k.shape[0]})")


def _check_index(name, t, device, shape, desc):
    """An int32 index tensor (cache_seqlens, block_table, ...) of `shape` (None: any size) on `device`."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"flashattn: {name} must be a torch.Tensor or None, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise ValueError(f"flashattn: {name} must be int32, got {t.dtype}")
    if t.dim() != len(shape) or any(want is not None and got != want for got, want in zip(t.shape, shape)):
        raise ValueError(f"flashattn: {name} must have shape {desc}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"flashattn: {name} must be on the same device as q (got {t.device}, q: {device})")
    return t


def _check_softcap(softcap):
    if softcap is None:
        return 0.0
    if softcap < 0:
        raise ValueError(f"flashattn: softcap={softcap} must be >= 0 (0 = off)")
    return float(softcap)


def _score_options(window_size, causal, softmax_scale, softcap, alibi_slopes, q, headdim, batch):
    """The options every entry point shares, checked and normalised: (window_left, window_right,
    softmax_scale, softcap, alibi_slopes). causal is the window's right edge at the diagonal, as in
    flash_attn. The usual call (no softcap, no ALiBi) skips their checks."""
    # The default window_size (the very tuple _NO_WINDOW) needs no check.
    window_left, window_right = (-1, -1) if window_size is _NO_WINDOW else _check_window(window_size)
    if causal:
        window_right = 0
    # A float either way (_check_softmax_scale's default for None, inline).
    softmax_scale = headdim ** (-0.5) if softmax_scale is None else _check_softmax_scale(softmax_scale, headdim)
    if type(softcap) is not float or softcap != 0.0:
        softcap = _check_softcap(softcap)
    if alibi_slopes is not None:
        alibi_slopes = _ops.check_alibi_slopes(alibi_slopes, q, batch)
    return window_left, window_right, softmax_scale, softcap, alibi_slopes


def _check_cu_seqlens(q, cu_seqlens_q, cu_seqlens_k):
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"flashattn: {name} must be a torch.Tensor, got {type(cu).__name__}")
        if cu.device != q.device:
            raise ValueError(f"flashattn: {name} must be on the same device as q (got {cu.device}, q: {q.device})")
        if cu.dtype != torch.int32:
            raise ValueError(f"flashattn: {name} must be int32, got {cu.dtype}")
        if cu.dim() != 1 or cu.shape[0] < 2:
            raise ValueError(f"flashattn: {name} must be 1-D with batch_size + 1 >= 2 entries, got shape {tuple(cu.shape)}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(
            f"flashattn: cu_seqlens_q and cu_seqlens_k must have the same length (batch_size + 1), "
            f"got {cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}")


# The FP8 entries' default v_layout: v in rows, which the library may copy once to keys_permuted16 in its workspace
# where the sm90 kernel repays that (C: FLASHATTN_FP8_V_ROWS_AUTO; flashattn.h says when).
_V_AUTO = None
# flash_attn_func's v_layout values: the C fp8_v_layout.
_V_LAYOUTS = {"rows": _lib.FP8_V_ROWS, "keys_permuted16": _lib.FP8_V_KEYS_PERMUTED16, None: _lib.FP8_V_ROWS_AUTO}


def _fp8_args(q_scale, k_scale, v_scale, q_descale, k_descale, v_descale, q_block_size, k_block_size, out_dtype,
              v_layout=_V_AUTO):
    """The public functions' FP8 keyword arguments as _Fp8Args, or None when all are at their defaults (the usual
    call: no object built)."""
    if (q_scale is None and k_scale is None and v_scale is None and q_descale is None and k_descale is None
            and v_descale is None and out_dtype is None and type(q_block_size) is int and q_block_size == 128
            and type(k_block_size) is int and k_block_size == 128 and v_layout is _V_AUTO):
        return None
    return _Fp8Args(q_scale, k_scale, v_scale, q_descale, k_descale, v_descale, q_block_size, k_block_size, out_dtype,
                    v_layout)


class _Fp8Args:
    """The FP8 keyword arguments of the public functions, FA3's *_descale aliases merged in."""

    def __init__(self, q_scale=None, k_scale=None, v_scale=None, q_descale=None, k_descale=None, v_descale=None,
                 q_block_size=128, k_block_size=128, out_dtype=None, v_layout=_V_AUTO):
        def pick(name, value, alias, alias_value):
            if alias_value is None:
                return value
            if value is not None:
                raise ValueError(f"flashattn: {name} and {alias} are the same argument (FA3 calls it {alias}); give one")
            return alias_value

        self.q_scale = pick("q_scale", q_scale, "q_descale", q_descale)
        self.k_scale = pick("k_scale", k_scale, "k_descale", k_descale)
        self.v_scale = pick("v_scale", v_scale, "v_descale", v_descale)
        self.q_block_size, self.k_block_size, self.out_dtype = q_block_size, k_block_size, out_dtype
        if v_layout is not _V_AUTO and (not isinstance(v_layout, str) or v_layout not in _V_LAYOUTS):
            raise ValueError(f"flashattn: v_layout must be None, 'rows' or 'keys_permuted16', got {v_layout!r}")
        self.v_layout = v_layout

    def first_given(self):
        """The name of the first FP8-only argument given (the block sizes and v_layout None or "rows" count as
        defaults), or None."""
        for name in ("q_scale", "k_scale", "v_scale", "out_dtype"):
            if getattr(self, name) is not None:
                return name
        if self.v_layout is not _V_AUTO and self.v_layout != "rows":
            return "v_layout"
        return None


_INT32_MAX = 2**31 - 1
_AUTO = _lib.BACKEND_AUTO


def _check_block_size(name, value):
    if isinstance(value, bool) or _int_like(value) is None or _int_like(value) < 1:
        raise ValueError(f"flashattn: {name} must be an integer >= 1 (rows per scale block), got {value!r}")
    return min(_int_like(value), _INT32_MAX)


def _fp8_scale_views(names, scales, batch, heads, seqlen, block_size, block_name, device, heads_q=None):
    """Scales of q (one tensor) or of k and v (two, sharing one block size) in the C ABI's layout: contiguous
    float32 [batch, heads, nblocks] and the block size. Each may be per tensor (shape () or (1,)), per (batch,
    head) ((batch, heads), or (batch, heads, 1)), or per block of block_size rows ((batch, heads, ceil(seqlen /
    block_size))). For q, (batch, nheads_k) is FA3's q_descale layout (one scale per GQA group): heads_q = nheads
    expands it. Per-tensor and per-head scales are copied out over the blocks (the arrays are tiny)."""
    nblocks = -(-seqlen // block_size) if seqlen > 0 else 0
    # The usual call (flashattn.fp8.quantize's scales): contiguous float32 already in the C layout, used as they are.
    want = (batch, heads_q or heads, nblocks)
    if all(type(t) is Tensor and t.dtype is torch.float32 and t.shape == want and not t.requires_grad
           and t.is_contiguous() and t.device == device for t in scales):
        return list(scales), block_size if nblocks > 1 else min(max(seqlen, 1), _INT32_MAX)
    shaped = []
    for name, t in zip(names, scales):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"flashattn: {name} must be a float32 torch.Tensor for float8_e4m3fn inputs, got "
                             f"{type(t).__name__}")
        if t.dtype != torch.float32:
            raise ValueError(f"flashattn: {name} must be float32, got {t.dtype}")
        if t.device != device:
            raise ValueError(f"flashattn: {name} must be on the same device as q (got {t.device}, q: {device})")
        t = t.detach()
        shape = tuple(t.shape)
        fa3_q = heads_q is not None and heads_q != heads and shape == (batch, heads)
        if shape in ((), (1,)):
            t, blocks = t.reshape(1, 1, 1).expand(batch, heads_q or heads, 1), None
        elif fa3_q:
            t, blocks = t.repeat_interleave(heads_q // heads, dim=1).unsqueeze(-1), None
        elif shape == (batch, heads_q or heads):
            t, blocks = t.unsqueeze(-1), None
        elif shape == (batch, heads_q or heads, 1):
            blocks = None
        elif shape == (batch, heads_q or heads, nblocks):
            blocks = nblocks
        else:
            h = heads_q or heads
            fa3 = f", (batch, nheads_k) = {(batch, heads)} (FA3's q_descale)" if heads_q and heads_q != heads else ""
            raise ValueError(
                f"flashattn: {name} has shape {shape}; expected () or (1,) (per tensor), (batch, nheads) = "
                f"{(batch, h)}{fa3} (per head), or (batch, nheads, ceil(seqlen / {block_name})) = "
                f"{(batch, h, nblocks)} (block scales, {block_name} = {block_size}; pass {block_name} for another)")
        shaped.append((t, blocks))
    # One block size for the group: block_size if any tensor has real blocks, else one block per sequence.
    blocked = any(b is not None and b > 1 for _, b in shaped)
    c_block = block_size if blocked else min(max(seqlen, 1), _INT32_MAX)
    n = nblocks if blocked else (1 if seqlen > 0 else 0)
    out = [t.expand(t.shape[0], t.shape[1], n).contiguous() if t.shape[-1] != n else t.contiguous() for t, _ in shaped]
    return out, c_block


def _flash_attn_fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                    causal, window_size, softcap, alibi_slopes, return_attn_probs, block_table, seqused_k, backend,
                    fp8):
    """FP8 (E4M3) attention: q, k, v torch.float8_e4m3fn with float32 scales; forward only."""
    # The usual call (fixed length, the scales as flashattn.fp8.quantize returns them, no cache, no dropout, nothing
    # requiring grad) passes one combined test; anything else takes the checks below, in their order.
    if cu_seqlens_q is None and cu_seqlens_k is None and block_table is None and seqused_k is None and not dropout_p:
        shapes = _inputs_ok(q, k, v, 4, 4, fp8=True)
        ready = shapes and _fp8_scales_ready(q, shapes[0], shapes[1], fp8)
        if ready and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
            return _fp8_call(q, k, v, None, None, 0, 0, *ready, softmax_scale, causal, window_size, softcap,
                             alibi_slopes, return_attn_probs, backend, fp8, False)
    names = ("q", "k", "v")
    for name, t in zip(names, (q, k, v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flashattn: {name} must be a torch.Tensor, got {type(t).__name__}")
    if not q.dtype == k.dtype == v.dtype == _FP8:
        raise ValueError(f"flashattn: FP8 attention needs q, k, v all torch.float8_e4m3fn (got q: {q.dtype}, "
                         f"k: {k.dtype}, v: {v.dtype})")
    if block_table is not None or seqused_k is not None:
        raise NotImplementedError("flashattn: block_table / seqused_k with float8_e4m3fn inputs: the KV cache is not "
                                  "supported for FP8 attention")
    if dropout_p > 0:
        raise NotImplementedError(f"flashattn: dropout_p={dropout_p} with float8_e4m3fn inputs: FP8 attention is "
                                  "forward-only (inference); pass dropout_p=0")
    missing = [n for n in ("q_scale", "k_scale", "v_scale") if getattr(fp8, n) is None]
    if missing:
        raise ValueError(f"flashattn: {missing[0]} (FA3: {missing[0].replace('scale', 'descale')}) is required for "
                         "float8_e4m3fn inputs: the float32 scales the codes are multiplied by (see flashattn.fp8)")
    scales = (fp8.q_scale, fp8.k_scale, fp8.v_scale)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, *scales)
                                       if isinstance(t, torch.Tensor)):
        raise RuntimeError("flashattn: FP8 attention is forward-only (no backward for float8_e4m3fn inputs), but an "
                           "input or scale requires grad: call it under torch.no_grad(), or detach the inputs")
    out_dtype = torch.bfloat16 if fp8.out_dtype is None else fp8.out_dtype
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"flashattn: out_dtype must be torch.bfloat16 or torch.float16 (FP8 attention writes 16-bit "
                         f"outputs), got {out_dtype!r}")
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if not _inputs_ok(q, k, v, 3 if varlen else 4, 3 if varlen else 4, fp8=True):
        _check_inputs_slow(q, k, v, 3 if varlen else 4)
    if varlen:
        _check_cu_seqlens(q, cu_seqlens_q, cu_seqlens_k)
        max_seqlen_q, max_seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
        batch, seqlen_q, seqlen_k = cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_k
    else:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
    q_block = _check_block_size("q_block_size", fp8.q_block_size)
    k_block = _check_block_size("k_block_size", fp8.k_block_size)
    hq, hk = q.shape[-2], k.shape[-2]
    device = q.device
    (q_scale,), q_block = _fp8_scale_views(("q_scale",), scales[:1], batch, hk, seqlen_q, q_block, "q_block_size",
                                           device, heads_q=hq)
    (k_scale, v_scale), k_block = _fp8_scale_views(("k_scale", "v_scale"), scales[1:], batch, hk, seqlen_k, k_block,
                                                   "k_block_size", device)
    return _fp8_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q_scale, k_scale, v_scale,
                     q_block, k_block, out_dtype, softmax_scale, causal, window_size, softcap, alibi_slopes,
                     return_attn_probs, backend, fp8, varlen)


def _fp8_scales_ready(q, qs, ks, fp8):
    """(q_scale, k_scale, v_scale, q_block, k_block, out_dtype) as _flash_attn_fp8's checks would make them, when the
    scales are already in the C layout (contiguous float32 [batch, heads, nblocks] on q's device, not requiring grad),
    the block sizes plain ints >= 1 and out_dtype a valid one; else None (the full checks then run)."""
    qb, kb, out_dtype = fp8.q_block_size, fp8.k_block_size, fp8.out_dtype
    if type(qb) is not int or type(kb) is not int or qb < 1 or kb < 1:
        return None
    if out_dtype is None:
        out_dtype = torch.bfloat16
    elif out_dtype is not torch.bfloat16 and out_dtype is not torch.float16:
        return None
    batch, sq, hq, sk, hk = qs[0], qs[1], qs[2], ks[1], ks[2]
    if not sq or not sk:
        return None
    qsc, ksc, vsc = fp8.q_scale, fp8.k_scale, fp8.v_scale
    if type(qsc) is not Tensor or type(ksc) is not Tensor or type(vsc) is not Tensor:
        return None
    # Per block ([b, h, ceil(s / block)]) or per head as [b, h, 1] (one block per sequence, whatever the block
    # size); k and v alike.
    qshape, kshape = qsc.shape, ksc.shape
    if len(qshape) != 3 or len(kshape) != 3:
        return None
    nq, nk = qshape[2], kshape[2]
    if nq != 1 and nq != -(-sq // qb) or nk != 1 and nk != -(-sk // kb):
        return None
    device = q.device
    for t, want in ((qsc, (batch, hq, nq)), (ksc, (batch, hk, nk)), (vsc, (batch, hk, nk))):
        if (t.dtype is not torch.float32 or t.shape != want or t.requires_grad or not t.is_contiguous()
                or t.device != device):
            return None
    # One scale block per sequence: the C block size is the length (as _fp8_scale_views gives it).
    return (qsc, ksc, vsc, qb if nq > 1 else min(sq, _INT32_MAX), kb if nk > 1 else min(sk, _INT32_MAX), out_dtype)


def _fp8_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q_scale, k_scale, v_scale, q_block,
              k_block, out_dtype, softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs,
              backend, fp8, varlen):
    """The FP8 call after the input and scale checks: the score options, v_layout, the op."""
    batch = cu_seqlens_q.shape[0] - 1 if varlen else q.shape[0]
    window_left, window_right, softmax_scale, softcap, alibi_slopes = _score_options(
        window_size, causal, softmax_scale, softcap, alibi_slopes, q, q.shape[-1], batch)
    v_layout = _V_LAYOUTS[fp8.v_layout]
    if v_layout == _lib.FP8_V_KEYS_PERMUTED16:
        _check_v_keys_permuted16(v, varlen)
    out, lse = _ops.fp8_attention(q, k, v, q_scale, k_scale, v_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, q_block, k_block, float(softmax_scale), bool(causal), window_left,
                                  window_right, float(softcap), alibi_slopes, out_dtype, _lib.backend_id(backend),
                                  v_layout, need_lse=bool(return_attn_probs))
    if return_attn_probs:
        return out, lse, None
    return out


def _check_v_keys_permuted16(v, varlen):
    """v_layout="keys_permuted16": v must be flashattn.fp8.keys_permuted16's V^T view (keys contiguous, rows of a
    multiple of 16 >= seqlen_k rounded up). A row-layout v is refused rather than copied: .contiguous() would
    reorder nothing and read the keys as rows."""
    if varlen:
        raise NotImplementedError("flashattn: v_layout='keys_permuted16' is for fixed-length batches "
                                  "(flash_attn_func); the varlen functions take v in rows")
    st, s = v.stride(), v.shape[1]
    if st[1] != 1 or st[3] % 16 or st[3] < -(-s // 16) * 16:
        raise ValueError("flashattn: v_layout='keys_permuted16' needs v as flashattn.fp8.keys_permuted16(v) returns it "
                         "(V^T storage: v.stride(1) == 1, v.stride(3) a multiple of 16 >= seqlen_k rounded up to 16), "
                         f"got v.stride() = {tuple(st)}; pass v_layout='rows' for a v in rows")


def _flash_attn(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, dropout_p=0.0,
                softmax_scale=None, causal=False, window_size=_NO_WINDOW, softcap=0.0, alibi_slopes=None,
                deterministic=False, return_attn_probs=False, block_table=None, seqused_k=None, backend="auto",
                fp8=None):
    """The one entry behind every public function. `backend` (private): auto, cpu, reference, sm80, sm90.
    fp8: the _Fp8Args of the functions that take them (float8_e4m3fn inputs)."""
    if type(dropout_p) is not float or not 0.0 <= dropout_p < 1.0:  # the usual Python float passes as it is
        dropout_p = _ops.check_dropout_p(dropout_p)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    # The usual valid q, k, v pass one combined test (which also says none is FP8); anything else takes the
    # checks below in their order, which raise the error naming the first failed one.
    plain = _inputs_ok(q, k, v, 3 if varlen else 4, 3 if varlen else 4)
    if not plain and (type(q) is Tensor and q.dtype is _FP8
                      or any(isinstance(t, torch.Tensor) and t.dtype == _FP8 for t in (q, k, v))):
        return _flash_attn_fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                               softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs,
                               block_table, seqused_k, backend, fp8 or _Fp8Args())
    if fp8 is not None and fp8.first_given() is not None:
        raise ValueError(f"flashattn: {fp8.first_given()} is for float8_e4m3fn inputs (q is "
                         f"{getattr(q, 'dtype', type(q).__name__)})")
    if block_table is not None or seqused_k is not None:
        return _varlen_kv_cache(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs,
                                block_table, seqused_k, backend)
    if not plain:
        _check_inputs_slow(q, k, v, 3 if varlen else 4)
    if varlen:
        _check_cu_seqlens(q, cu_seqlens_q, cu_seqlens_k)
        max_seqlen_q, max_seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
    window_left, window_right, softmax_scale, softcap, alibi_slopes = _score_options(
        window_size, causal, softmax_scale, softcap, alibi_slopes, q, q.shape[-1],
        cu_seqlens_q.shape[0] - 1 if varlen else q.shape[0])
    backend = _AUTO if backend == "auto" else _lib.backend_id(backend)
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, float(softmax_scale), bool(causal),
            window_left, window_right, float(softcap))
    if dropout_p > 0 or alibi_slopes is not None:
        out, lse, rng_state = _ops.attention_ext(*args, dropout_p, alibi_slopes, bool(deterministic), backend)
    elif return_attn_probs:
        out, lse = _ops.attention(*args, bool(deterministic), backend)
    else:
        # Only out is returned: without autograd, the call computes no LSE (the C ABI's lse may be NULL).
        out, lse = _ops.attention(*args, bool(deterministic), backend, need_lse=False)
    if return_attn_probs:
        # As flash_attn: S_dmask only with dropout (None without); here for fixed-length calls only.
        if dropout_p == 0 or varlen:
            return out, lse, None
        return out, lse, _attn_probs(q, k, lse, rng_state, float(softmax_scale), window_left, window_right,
                                     float(softcap), alibi_slopes, dropout_p)
    return out


def _varlen_kv_cache(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                     causal, window_size, softcap, alibi_slopes, return_attn_probs, block_table, seqused_k, backend):
    """flash_attn_varlen_func with block_table (k/v paged [num_blocks, page_block_size, nheads_k, headdim]; sequence
    b's keys are its first cu_seqlens_k[b + 1] - cu_seqlens_k[b] rows through block_table[b]) and/or seqused_k
    (sequence b uses only its first seqused_k[b] keys). Forward only: a backward raises."""
    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise ValueError("flashattn: block_table / seqused_k need the varlen layout (cu_seqlens_q and cu_seqlens_k)")
    if dropout_p > 0:
        raise NotImplementedError(f"flashattn: dropout_p={dropout_p} with block_table / seqused_k: paged KV is "
                                  "inference-only here (pass dropout_p=0)")
    paged = block_table is not None
    _check_inputs(q, k, v, 3, kv_ndim=4 if paged else 3, same_batch=False)
    _check_cu_seqlens(q, cu_seqlens_q, cu_seqlens_k)
    max_seqlen_q, max_seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
    batch = cu_seqlens_q.shape[0] - 1
    if paged:
        _check_index("block_table", block_table, q.device, (batch, None), f"(batch, max_num_blocks_per_seq) = ({batch}, n)")
        if block_table.shape[1] == 0:
            raise ValueError("flashattn: block_table has 0 columns (each sequence needs at least one page)")
    if seqused_k is not None:
        _check_index("seqused_k", seqused_k, q.device, (batch,), f"(batch,) = ({batch},)")
    window_left, window_right, softmax_scale, softcap, alibi_slopes = _score_options(
        window_size, causal, softmax_scale, softcap, alibi_slopes, q, q.shape[-1], batch)
    out, lse = _ops.kvcache_attention(q, k, v, seqused_k, None, None, block_table, alibi_slopes, cu_seqlens_q,
                                      cu_seqlens_k, max_seqlen_q, max_seqlen_k, float(softmax_scale), bool(causal),
                                      window_left, window_right, softcap, 0, bool(return_attn_probs),
                                      _lib.backend_id(backend))
    if return_attn_probs:
        return out, lse, None
    return out


def _attn_probs(q, k, lse, rng_state, softmax_scale, window_left, window_right, softcap, alibi_slopes, dropout_p):
    """S_dmask [batch, nheads, seqlen_q, seqlen_k] in q's dtype: the attention probabilities P (after softcap,
    ALiBi and masks, normalized with the call's LSE), negated where dropout dropped them. Pure torch, from
    the same scores the kernels form and the Philox mask rebuilt from the call's rng_state."""
    # The library takes softmax_scale and softcap as float32: so do these scores (they meet its LSE).
    softmax_scale, softcap = _dropout.to_float32(softmax_scale), _dropout.to_float32(softcap)
    with torch.no_grad():
        dt = torch.float64 if q.dtype == torch.float64 else torch.float32
        b, sq, h, _ = q.shape
        sk, hk = k.shape[1], k.shape[2]
        kk = k.to(dt).repeat_interleave(h // hk, dim=2)
        s = torch.einsum("bqhd,bkhd->bhqk", q.to(dt), kk) * softmax_scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        i = torch.arange(sq, device=q.device).view(sq, 1)
        j = torch.arange(sk, device=q.device).view(1, sk)
        rel = i + (sk - sq) - j  # key j is rel columns left of query i's diagonal
        if alibi_slopes is not None:
            slopes = alibi_slopes.to(dt).view(-1, h, 1, 1)
            s = s - slopes * rel.abs().to(dt)
        allowed = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
        if window_left >= 0:
            allowed &= rel <= window_left
        if window_right >= 0:
            allowed &= rel >= -window_right
        lse_ = lse.to(dt).unsqueeze(-1)
        p = torch.exp(s - torch.where(torch.isfinite(lse_), lse_, torch.zeros_like(lse_)))
        p = torch.where(allowed & torch.isfinite(lse_), p, torch.zeros((), dtype=dt, device=q.device))
        keep = _dropout.keep_mask(rng_state[0], rng_state[1], b, h, sq, sk, dropout_p, q.device)
        return torch.where(keep, p, -p).to(q.dtype)


def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False, window_size: Tuple[int, int] = _NO_WINDOW, softcap: float = 0.0,
                    alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                    return_attn_probs: bool = False, *, q_scale: Optional[Tensor] = None, k_scale: Optional[Tensor] = None,
                    v_scale: Optional[Tensor] = None, q_descale: Optional[Tensor] = None,
                    k_descale: Optional[Tensor] = None, v_descale: Optional[Tensor] = None, q_block_size: int = 128,
                    k_block_size: int = 128, out_dtype: Optional[torch.dtype] = None,
                    v_layout: Optional[str] = _V_AUTO) -> _Out:
    """q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim).

    nheads must be a multiple of nheads_k (GQA/MQA). causal is bottom-right aligned; window_size
    (left, right) restricts query i to keys [i + sk - sq - left, i + sk - sq + right]; softcap > 0
    applies softcap * tanh(S / softcap).

    dropout_p in [0, 1): drop probability of each entry of P, applied whenever it is > 0 (as
    flash_attn, regardless of torch's train/eval mode: pass 0.0 for evaluation); kept entries are
    scaled by 1 / (1 - p). The drop threshold is p rounded to a multiple of 2^-16 (at least 2^-16).
    Each call draws its seed from torch's default generator of q's device (torch.manual_seed
    reproduces it; CUDA-graph replays draw fresh ones) and its backward reuses the same mask.
    alibi_slopes: float32 (nheads,) or (batch, nheads) on q's device; adds
    -slope * |i + seqlen_k - seqlen_q - j| to the scores after the softcap (no gradient to it).

    Returns out (batch, seqlen_q, nheads, headdim), or with return_attn_probs=True
    (out, softmax_lse (batch, nheads, seqlen_q), S_dmask): S_dmask is None unless dropout_p > 0, as in
    flash_attn; with dropout it is (batch, nheads, seqlen_q, seqlen_k) in q's dtype, the attention
    probabilities P (after softcap, ALiBi and masks; P = exp(S - softmax_lse)) with the dropped entries
    negated (before the 1 / (1 - p) scaling), computed in torch from the call's random numbers.
    softmax_lse is not affected by dropout and carries no gradient.

    FP8 (forward only, inference): q, k, v torch.float8_e4m3fn with float32 scales q_scale, k_scale,
    v_scale (FA3's names q_descale, k_descale, v_descale are accepted too). The attention is that of the
    dequantized inputs x = float(code) * scale, each scale covering a block of q_block_size (q) or
    k_block_size (k and v) rows of one (batch, head), rows counted from each sequence's start:
    q_scale (batch, nheads, ceil(seqlen_q / q_block_size)), k_scale/v_scale (batch, nheads_k,
    ceil(seqlen_k / k_block_size)) as flashattn.fp8.quantize returns them; or per (batch, head): (batch,
    nheads) (for q also FA3's (batch, nheads_k)); or per tensor: shape () or (1,). Returns out in out_dtype
    (torch.bfloat16 by default, or torch.float16) and a float32 softmax_lse. dropout_p must be 0; inputs that
    require grad are refused. CPU tensors run the exact reference (fp64 attention of the dequantized inputs);
    CUDA tensors run the Hopper (sm90) kernel. flashattn.fp8.flash_attn_fp8_func quantizes and calls this.
    v_layout (FP8 only): None (default: v as above; on the sm90 kernel a fixed-length call with at least 1536
    unmasked (query row, key) pairs per key and kv head, e.g. seqlen_q x GQA group >= 1536 without a mask or
    >= 3072 causal, first copies v into flashattn.fp8.keys_permuted16's layout in the library's workspace, one
    extra pass over V that the kernel repays), "rows" (v as above, never copied) or "keys_permuted16": v is what
    flashattn.fp8.keys_permuted16
    returns (V^T, keys contiguous and permuted in groups of 16), which the sm90 kernel reads without transposing
    V; the same attention. Any other value, or "keys_permuted16" with a non-FP8 dtype or a v not in that
    layout, is a ValueError naming v_layout.
    """
    # Positional: a little cheaper than 13 keywords.
    return _flash_attn(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                       deterministic, return_attn_probs, None, None, "auto",
                       _fp8_args(q_scale, k_scale, v_scale, q_descale, k_descale, v_descale, q_block_size,
                                 k_block_size, out_dtype, v_layout))


def flash_attn_qkvpacked_func(qkv: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                              causal: bool = False, window_size: Tuple[int, int] = _NO_WINDOW, softcap: float = 0.0,
                              alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                              return_attn_probs: bool = False) -> _Out:
    """qkv: (batch, seqlen, 3, nheads, headdim). Arguments (dropout_p, alibi_slopes, ...) and returns as
    flash_attn_func."""
    _check_packed(qkv, "qkv", 5, 2, 3)
    q, k, v = qkv.unbind(dim=2)
    return _flash_attn(q, k, v, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                       window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                       deterministic=deterministic, return_attn_probs=return_attn_probs)


def flash_attn_kvpacked_func(q: Tensor, kv: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                             causal: bool = False, window_size: Tuple[int, int] = _NO_WINDOW, softcap: float = 0.0,
                             alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                             return_attn_probs: bool = False, *, q_scale: Optional[Tensor] = None, k_scale: Optional[Tensor] = None,
                             v_scale: Optional[Tensor] = None, q_descale: Optional[Tensor] = None,
                             k_descale: Optional[Tensor] = None, v_descale: Optional[Tensor] = None, q_block_size: int = 128,
                             k_block_size: int = 128, out_dtype: Optional[torch.dtype] = None) -> _Out:
    """q: (batch, seqlen_q, nheads, headdim); kv: (batch, seqlen_k, 2, nheads_k, headdim). Arguments
    (dropout_p, alibi_slopes, the FP8 scales, ...) and returns as flash_attn_func."""
    _check_packed(kv, "kv", 5, 2, 2)
    k, v = kv.unbind(dim=2)
    return _flash_attn(q, k, v, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                       window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                       deterministic=deterministic, return_attn_probs=return_attn_probs,
                       fp8=_fp8_args(q_scale, k_scale, v_scale, q_descale, k_descale, v_descale, q_block_size,
                       k_block_size, out_dtype))


def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size: Tuple[int, int] = _NO_WINDOW, softcap: float = 0.0,
                           alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                           return_attn_probs: bool = False, block_table: Optional[Tensor] = None,
                           seqused_k: Optional[Tensor] = None, *, q_scale: Optional[Tensor] = None, k_scale: Optional[Tensor] = None,
                           v_scale: Optional[Tensor] = None, q_descale: Optional[Tensor] = None,
                           k_descale: Optional[Tensor] = None, v_descale: Optional[Tensor] = None, q_block_size: int = 128,
                           k_block_size: int = 128, out_dtype: Optional[torch.dtype] = None) -> _Out:
    """q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim); cu_seqlens_*: int32 (batch + 1,).

    Sequence b occupies rows [cu_seqlens[b], cu_seqlens[b + 1]). Options as flash_attn_func;
    dropout_p and alibi_slopes ((nheads,) or (batch, nheads), batch = the number of sequences) apply
    per sequence, with row and column indices counted from each sequence's start. Returns out
    (total_q, nheads, headdim), or (out, softmax_lse (nheads, total_q), None) with
    return_attn_probs=True: the varlen functions never return S_dmask (None even with dropout).
    block_table: int32 (batch, max_num_blocks_per_seq), paged KV (inference): k, v are then page pools
    (num_blocks, page_block_size, nheads_k, headdim), any page_block_size >= 1, and sequence b's keys are rows
    0 .. cu_seqlens_k[b + 1] - cu_seqlens_k[b] - 1 of its pages block_table[b] (cu_seqlens_k gives lengths only).
    seqused_k: int32 (batch,), optional: sequence b attends to its first seqused_k[b] keys only (masks bottom-right
    aligned to that length). Both are forward-only (no dropout): a backward through the result raises
    RuntimeError. Host paths only for now: the CUDA paths raise NotImplementedError naming the field.
    FP8 (float8_e4m3fn q/k/v with q_scale/k_scale/v_scale, ...) as flash_attn_func, with batch = the number of
    sequences and seqlen = max_seqlen_q / max_seqlen_k in the scales' shapes: sequence b's row i has the scale of
    block i // block_size of its own row of scales (blocks start at each sequence's first row; a sequence
    shorter than max_seqlen leaves its last entries unread).
    """
    return _flash_attn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=dropout_p,
                       softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                       alibi_slopes=alibi_slopes, deterministic=deterministic,
                       return_attn_probs=return_attn_probs, block_table=block_table, seqused_k=seqused_k,
                       fp8=_fp8_args(q_scale, k_scale, v_scale, q_descale, k_descale, v_descale, q_block_size,
                       k_block_size, out_dtype))


def flash_attn_varlen_qkvpacked_func(qkv: Tensor, cu_seqlens: Tensor, max_seqlen: int, dropout_p: float = 0.0,
                                     softmax_scale: Optional[float] = None, causal: bool = False,
                                     window_size: Tuple[int, int] = _NO_WINDOW, softcap: float = 0.0,
                                     alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                     return_attn_probs: bool = False) -> _Out:
    """qkv: (total, 3, nheads, headdim); cu_seqlens: int32 (batch + 1,). As flash_attn_varlen_func."""
    _check_packed(qkv, "qkv", 4, 1, 3)
    q, k, v = qkv.unbind(dim=1)
    return _flash_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p=dropout_p,
                       softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                       alibi_slopes=alibi_slopes, deterministic=deterministic,
                       return_attn_probs=return_attn_probs)


def flash_attn_varlen_kvpacked_func(q: Tensor, kv: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                                    max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                                    softmax_scale: Optional[float] = None, causal: bool = False,
                                    window_size: Tuple[int, int] = _NO_WINDOW, softcap: float = 0.0,
                                    alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                    return_attn_probs: bool = False, *, q_scale: Optional[Tensor] = None, k_scale: Optional[Tensor] = None,
                                    v_scale: Optional[Tensor] = None, q_descale: Optional[Tensor] = None,
                                    k_descale: Optional[Tensor] = None, v_descale: Optional[Tensor] = None, q_block_size: int = 128,
                                    k_block_size: int = 128, out_dtype: Optional[torch.dtype] = None) -> _Out:
    """q: (total_q, nheads, headdim); kv: (total_k, 2, nheads_k, headdim). As flash_attn_varlen_func."""
    _check_packed(kv, "kv", 4, 1, 2)
    k, v = kv.unbind(dim=1)
    return _flash_attn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=dropout_p,
                       softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                       alibi_slopes=alibi_slopes, deterministic=deterministic,
                       return_attn_probs=return_attn_probs,
                       fp8=_fp8_args(q_scale, k_scale, v_scale, q_descale, k_descale, v_descale, q_block_size,
                       k_block_size, out_dtype))


def _check_packed(t, name, ndim, dim, n):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"flashattn: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim or t.shape[dim] != n:
        want = {("qkv", 5): "(batch, seqlen, 3, nheads, headdim)", ("kv", 5): "(batch, seqlen, 2, nheads_k, headdim)",
                ("qkv", 4): "(total, 3, nheads, headdim)", ("kv", 4): "(total, 2, nheads_k, headdim)"}[(name, ndim)]
        raise ValueError(f"flashattn: {name} must have shape {want}, got {tuple(t.shape)}")


def _check_new_kv(q, k, v, batch, seqlen_q, hk, d):
    """flash_attn_with_kvcache's k/v (the rows to append), checked one by one: seqlen_new, or the error naming the
    first failed check (the usual valid k/v pass the combined test in flash_attn_with_kvcache instead)."""
    if (k is None) != (v is None):
        raise ValueError(f"flashattn: {'k' if v is None else 'v'} is given without {'v' if v is None else 'k'}: "
                         "give both k and v (the rows to append) or neither")
    device = q.device
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flashattn: {name} must be a torch.Tensor or None, got {type(t).__name__}")
        if t.device != device or t.dtype != q.dtype:
            raise ValueError(f"flashattn: {name} must be on q's device with q's dtype ({device}, {q.dtype}), got "
                             f"{t.device}, {t.dtype}")
        if t.dim() != 4 or t.shape[0] != batch or t.shape[2] != hk or t.shape[3] != d:
            want = f"(batch, seqlen_new, nheads_k, headdim) = ({batch}, seqlen_new, {hk}, {d})"
            raise ValueError(f"flashattn: {name} must have shape {want}, got {tuple(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"flashattn: k and v must have the same shape (got k: {tuple(k.shape)}, "
                         f"v: {tuple(v.shape)})")
    seqlen_new = k.shape[1]
    if seqlen_new == 0:
        raise ValueError("flashattn: k and v have 0 rows (seqlen_new = 0): pass k=None, v=None to append nothing")
    if seqlen_q == 0:
        raise ValueError("flashattn: q has 0 rows (seqlen_q = 0) while k/v are given: the rows are appended by "
                         "the attention call")
    return seqlen_new


_INT32 = torch.int32


def flash_attn_with_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor] = None,
                            v: Optional[Tensor] = None, rotary_cos: Optional[Tensor] = None,
                            rotary_sin: Optional[Tensor] = None, cache_seqlens: Optional[Union[int, Tensor]] = None,
                            cache_batch_idx: Optional[Tensor] = None, cache_leftpad: Optional[Tensor] = None,
                            block_table: Optional[Tensor] = None, softmax_scale: Optional[float] = None,
                            causal: bool = False, window_size: Tuple[int, int] = _NO_WINDOW, softcap: float = 0.0,
                            rotary_interleaved: bool = True, alibi_slopes: Optional[Tensor] = None,
                            num_splits: int = 0, return_softmax_lse: bool = False
                            ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Attention over a KV cache, appending new keys/values in place first (decoding), as flash_attn 2.x's.

    q: (batch, seqlen_q, nheads, headdim). k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, headdim), or,
    with block_table (int32 (batch, max_num_blocks_per_seq)), page pools (num_blocks, page_block_size, nheads_k,
    headdim) with any page_block_size >= 1: row r of sequence b is k_cache[block_table[b, r // page_block_size],
    r % page_block_size]. Without block_table, sequence b uses cache entry cache_batch_idx[b] (int32 (batch,)), or
    entry b (the first batch entries of a larger cache).
    cache_seqlens: int or int32 (batch,): the rows already in each sequence's cache (default: the whole cache).
    k, v: (batch, seqlen_new, nheads_k, headdim), optional: written IN PLACE into k_cache / v_cache at rows
    cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 (they must fit); the attention then covers them too.
    rotary_cos, rotary_sin: (seqlen_ro, rotary_dim / 2) in q's dtype, with k/v only: the first rotary_dim columns of
    k are rotated at positions cache_seqlens[b] + j before they are stored, and those of q at cache_seqlens[b] + i
    (causal or windowed) or cache_seqlens[b] (otherwise); q itself is not modified. rotary_interleaved rotates
    pairs (0, 1), (2, 3), ... (GPT-J), otherwise the two halves (GPT-NeoX).
    cache_leftpad: int32 (batch,), optional: sequence b's keys start at row cache_leftpad[b].
    Sequence b attends to rows [cache_leftpad[b], cache_seqlens[b] + seqlen_new); causal and window_size are
    bottom-right aligned to that length, ALiBi (alibi_slopes, float32 (nheads,) or (batch, nheads)) too.
    softmax_scale, causal, window_size, softcap as flash_attn_func. num_splits: split-KV hint for the CUDA paths
    (0 = heuristic; the host paths never split: it changes no result).

    Returns out (batch, seqlen_q, nheads, headdim), or (out, softmax_lse (batch, nheads, seqlen_q)) with
    return_softmax_lse=True. No autograd, as flash_attn's: the outputs never require grad.
    CPU tensors run the host paths (fp16/bf16/fp32/fp64); CUDA tensors (fp16/bf16) the sm80 path's KV-cache
    kernel (on Hopper too), with split-KV; see python/README.md.
    """
    shapes = _inputs_ok(q, k_cache, v_cache, 4, 4, False)  # (q.shape, k_cache.shape): each shape read once
    if shapes is None:
        _check_inputs_slow(q, k_cache, v_cache, 4, names=("q", "k_cache", "v_cache"), same_batch=False)
        shapes = q.shape, k_cache.shape
    (batch, seqlen_q, _, d), kc_shape = shapes
    hk = kc_shape[2]
    on_cpu = q.is_cpu  # the host paths: no torch.device objects on their usual path
    paged = block_table is not None
    seqlen_new = 0
    new_shape = None  # k.shape (= v.shape) once the combined test has read it
    if k is not None or v is not None:
        # The usual k/v (q's dtype and device, (batch, seqlen_new >= 1, nheads_k, headdim) each) pass one combined
        # test; anything else takes _check_new_kv, which raises the error naming the argument.
        dt = q.dtype
        if (isinstance(k, Tensor) and isinstance(v, Tensor) and k.dtype is dt and v.dtype is dt
                and (k.is_cpu and v.is_cpu if on_cpu else k.device == q.device == v.device)):
            ks = k.shape
            if len(ks) == 4 and v.shape == ks and ks[0] == batch and ks[2] == hk and ks[3] == d and seqlen_q:
                seqlen_new = ks[1]
                new_shape = ks
        if not seqlen_new:
            seqlen_new = _check_new_kv(q, k, v, batch, seqlen_q, hk, d)
    if rotary_cos is not None or rotary_sin is not None:
        device = q.device
        if rotary_cos is None or rotary_sin is None:
            raise ValueError("flashattn: rotary_cos and rotary_sin: give both or neither")
        if k is None:
            raise ValueError("flashattn: rotary_cos/rotary_sin need k and v: the rotary embedding is applied to q and "
                             "to the new keys as they are appended (without new keys, rotate q yourself)")
        for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"flashattn: {name} must be a torch.Tensor or None, got {type(t).__name__}")
            if t.dtype != q.dtype or t.device != device:
                raise ValueError(f"flashattn: {name} must have q's dtype and device ({q.dtype}, {device}), got "
                                 f"{t.dtype}, {t.device}")
            if t.dim() != 2 or t.shape[0] < 1 or t.shape[1] < 1 or 2 * t.shape[1] > d:
                raise ValueError(f"flashattn: {name} must have shape (seqlen_ro, rotary_dim / 2) with seqlen_ro >= 1 and"
                                 f" 2 <= rotary_dim <= headdim = {d}, got {tuple(t.shape)}")
        if rotary_cos.shape != rotary_sin.shape:
            raise ValueError(f"flashattn: rotary_cos and rotary_sin must have the same shape (got "
                             f"{tuple(rotary_cos.shape)} and {tuple(rotary_sin.shape)})")
    if cache_batch_idx is not None:
        if paged:
            raise ValueError("flashattn: cache_batch_idx is not supported with block_table (the block table already "
                             "maps each sequence to its pages)")
        _check_index("cache_batch_idx", cache_batch_idx, q.device, (batch,), f"(batch,) = ({batch},)")
    if cache_leftpad is not None:
        _check_index("cache_leftpad", cache_leftpad, q.device, (batch,), f"(batch,) = ({batch},)")
    if paged:
        _check_index("block_table", block_table, q.device, (batch, None),
                     f"(batch, max_num_blocks_per_seq) = ({batch}, n)")
        if block_table.shape[1] == 0:
            raise ValueError("flashattn: block_table has 0 columns (each sequence needs at least one page)")
        if k_cache.shape[1] == 0:
            raise ValueError(f"flashattn: k_cache has page_block_size 0 (shape {tuple(k_cache.shape)})")
        capacity = k_cache.shape[1] * block_table.shape[1]
    else:
        capacity = kc_shape[1]
        if cache_batch_idx is None and kc_shape[0] != batch:
            if k_cache.shape[0] < batch:
                raise ValueError(f"flashattn: k_cache has {k_cache.shape[0]} batch entries, fewer than q's batch {batch}"
                                 " (pass cache_batch_idx to map sequences to cache entries)")
            # Sequence b uses entry b, as flash_attn: views, so appends land in the caller's cache.
            k_cache, v_cache = k_cache[:batch], v_cache[:batch]
            kc_shape = k_cache.shape
    if seqlen_new > capacity:
        raise ValueError(f"flashattn: k has {seqlen_new} new rows, more than the cache's {capacity} rows per sequence")
    if cache_seqlens is None:
        if k is not None:
            raise ValueError("flashattn: cache_seqlens is required with k/v: the new rows are written at rows "
                             "cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1")
    elif isinstance(cache_seqlens, torch.Tensor):
        # The usual int32 (batch,) tensor on q's device passes one test; anything else gets the error naming it.
        if not (cache_seqlens.dtype is _INT32 and cache_seqlens.shape == (batch,)
                and (cache_seqlens.is_cpu if on_cpu else cache_seqlens.device == q.device)):
            _check_index("cache_seqlens", cache_seqlens, q.device, (batch,), f"(batch,) = ({batch},)")
    else:
        n = _int_like(cache_seqlens)
        if n is None or n < 0 or n + seqlen_new > capacity:
            raise ValueError(f"flashattn: cache_seqlens={cache_seqlens!r} must be an int in [0, {capacity - seqlen_new}]"
                             f" (the cache holds {capacity} rows per sequence, {seqlen_new} new ones are appended) or "
                             "an int32 tensor (batch,)")
        cache_seqlens = _ops.seqlens_tensor(n, batch, q.device)
    splits = num_splits if type(num_splits) is int else _int_like(num_splits)
    if splits is None or splits < 0:
        raise ValueError(f"flashattn: num_splits={num_splits!r} must be an integer >= 0 (0 = heuristic)")
    window_left, window_right, softmax_scale, softcap, alibi_slopes = _score_options(
        window_size, causal, softmax_scale, softcap, alibi_slopes, q, d, batch)
    return_lse = bool(return_softmax_lse)
    # with_kvcache_*_out: lse is None (none allocated) unless return_lse.
    if k is not None:
        out, lse = _ops.with_kvcache_append_out(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                                cache_batch_idx, cache_leftpad, block_table, alibi_slopes,
                                                softmax_scale, bool(causal), window_left, window_right, softcap,
                                                bool(rotary_interleaved), splits, return_lse, _AUTO,
                                                (shapes[0], kc_shape, new_shape))
    else:
        out, lse = _ops.with_kvcache_read_out(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad,
                                              block_table, alibi_slopes, None, None, 0, 0, softmax_scale,
                                              bool(causal), window_left, window_right, softcap, splits, return_lse,
                                              _AUTO, (shapes[0], kc_shape, None))
    return (out, lse) if return_lse else out


# ---- private entry points for benchmarks and tests ---------------------------------------------


def _bench_fwd(q, k, v, causal=False, softmax_scale=None, backend="auto"):
    """One forward on a chosen backend ("sm90", "sm80", "cpu", ...): (out, lse)."""
    out, lse, _ = _flash_attn(q, k, v, causal=causal, softmax_scale=softmax_scale, return_attn_probs=True,
                              backend=backend)
    return out, lse


def _bench_bwd(dout, q, k, v, out, lse, causal=False, softmax_scale=None, deterministic=False, backend="auto"):
    """One backward on a chosen backend: (dq, dk, dv)."""
    softmax_scale = _check_softmax_scale(softmax_scale, q.shape[-1])
    return torch.ops.flashattn.bwd(dout, q, k, v, out, lse, None, None, 0, 0, float(softmax_scale), bool(causal),
                                   -1, 0 if causal else -1, 0.0, bool(deterministic), _lib.backend_id(backend))
