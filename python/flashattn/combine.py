"""flashattn.combine: merging partial attention results computed over separate key ranges.

Split-KV decoding and cascade / prefix-caching attention compute attention over key ranges
separately: partial outputs O_s and their log-sum-exps LSE_s (natural log, -inf for a row that saw
no key), as flash_attn_func(..., return_attn_probs=True) returns them. `combine` merges them into
the attention over the union of the ranges:

    LSE = log(sum_s exp(LSE_s)),   O = sum_s exp(LSE_s - LSE) O_s

A row whose every LSE_s is -inf gets O = 0 and LSE = -inf (never NaN); a split with LSE_s = -inf
contributes nothing (its O_s is not read). Runs the C library's flashattn_combine: on CPU tensors
(fp32 accumulation; fp64 for float64) or CUDA tensors (the device kernel split-KV decode uses,
fp32 accumulation; float64 refused there). No autograd: the outputs do not require grad.
"""

from __future__ import annotations

import ctypes
from typing import Sequence, Tuple, Union

import torch

from . import _lib
from ._ops import _alloc  # NaN-filled under FLASHATTN_DEBUG_POISON=1 (tests)

__all__ = ["combine"]

_DTYPES = {
    torch.float16: _lib.DTYPE_FP16,
    torch.bfloat16: _lib.DTYPE_BF16,
    torch.float32: _lib.DTYPE_FP32,
    torch.float64: _lib.DTYPE_FP64,
}

_Stack = Union[torch.Tensor, Sequence[torch.Tensor]]


def _stacked(name: str, x: _Stack, ndim: int, layout: str) -> torch.Tensor:
    """x as one [num_splits, ...] tensor of ndim + 1 dims (a list/tuple of ndim-dim tensors is stacked)."""
    if isinstance(x, (list, tuple)):
        if len(x) == 0:
            raise ValueError(f"flashattn.combine: {name} is empty (give at least one split)")
        for i, t in enumerate(x):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"flashattn.combine: {name}[{i}] must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != ndim:
                raise ValueError(f"flashattn.combine: {name}[{i}] must have {ndim} dims {layout}, got shape "
                                 f"{tuple(t.shape)}")
        shapes = {tuple(t.shape) for t in x}
        if len(shapes) != 1:
            raise ValueError(f"flashattn.combine: {name} must all have one shape, got {sorted(shapes)}")
        if len({t.dtype for t in x}) != 1 or len({t.device for t in x}) != 1:
            raise ValueError(f"flashattn.combine: {name} must all have one dtype and device")
        return torch.stack(list(x))
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"flashattn.combine: {name} must be a torch.Tensor or a list of them, got {type(x).__name__}")
    if x.dim() != ndim + 1:
        raise ValueError(f"flashattn.combine: {name} must have {ndim + 1} dims [num_splits, "
                         f"{layout[1:-1]}], got shape {tuple(x.shape)}")
    return x


def combine(outs: _Stack, lses: _Stack) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merges partial attention results over key ranges into the attention over all of them.

    Args:
        outs: the partial outputs, [num_splits, batch, seqlen_q, nheads, headdim] (or a list/tuple
            of [batch, seqlen_q, nheads, headdim] tensors), float16/bfloat16/float32/float64.
        lses: their LSEs, [num_splits, batch, nheads, seqlen_q] (or a list/tuple of
            [batch, nheads, seqlen_q]), float32; float64 is accepted with float64 outs.
            -inf marks a row that saw no key in that split.

    Returns:
        (out, lse): out [batch, seqlen_q, nheads, headdim] in outs' dtype, lse
        [batch, nheads, seqlen_q] in lses' dtype.

    Raises:
        ValueError: a bad argument (the message names it).
        NotImplementedError: a library built without flashattn_combine.
    """
    o = _stacked("outs", outs, 4, "[batch, seqlen_q, nheads, headdim]")
    lse = _stacked("lses", lses, 3, "[batch, nheads, seqlen_q]")
    if o.dtype not in _DTYPES:
        raise ValueError(f"flashattn.combine: outs dtype {o.dtype} is not supported "
                         "(float16, bfloat16, float32, float64)")
    if lse.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"flashattn.combine: lses must be float32 (or float64 with float64 outs), got {lse.dtype}")
    if lse.dtype == torch.float64 and o.dtype != torch.float64:
        raise ValueError(f"flashattn.combine: lses are float64 but outs are {o.dtype} (float64 LSEs need float64 "
                         "outs; pass lses.float())")
    n, b, s, h, d = o.shape
    if tuple(lse.shape) != (n, b, h, s):
        raise ValueError(f"flashattn.combine: lses shape {tuple(lse.shape)} does not match outs: expected "
                         f"(num_splits, batch, nheads, seqlen_q) = {(n, b, h, s)}")
    if n < 1:
        raise ValueError("flashattn.combine: outs has 0 splits (num_splits must be >= 1)")
    if o.device != lse.device:
        raise ValueError(f"flashattn.combine: outs ({o.device}) and lses ({lse.device}) are on different devices")
    o = o.detach()
    lse = lse.detach()
    if o.numel() and o.stride(-1) != 1 and d != 1:
        o = o.contiguous()
    out = _alloc((b, s, h, d), o.dtype, o.device, None)
    lse_out = _alloc((b, h, s), lse.dtype, o.device, None)

    lib = _lib.load()
    if not hasattr(lib, "flashattn_combine"):
        raise NotImplementedError(f"flashattn.combine: {_lib.library_path()} has no flashattn_combine (older build)")
    p = lib.flashattn_combine_params_init()
    p.dtype = _DTYPES[o.dtype]
    p.num_splits = n
    p.out_partial = o.data_ptr() if o.numel() else None
    for i in range(5):
        p.out_partial_shape[i] = o.shape[i]
        p.out_partial_stride[i] = o.stride(i)
    p.out_partial_stride[4] = 1
    lse_ptr = lse.data_ptr() if lse.numel() else None
    if lse.dtype == torch.float64:
        p.lse_partial_fp64 = lse_ptr
        p.lse_fp64 = lse_out.data_ptr() if lse_out.numel() else None
    else:
        p.lse_partial = lse_ptr
        p.lse = lse_out.data_ptr() if lse_out.numel() else None
    for i in range(4):
        p.lse_partial_stride[i] = lse.stride(i)
        p.out.shape[i] = out.shape[i]
        p.out.stride[i] = out.stride(i)
    p.out.data = out.data_ptr() if out.numel() else None
    stream = _lib.place(p.options, o)
    status = lib.flashattn_combine(ctypes.byref(p), stream)
    _lib.raise_for_status(status, "combine")
    return out, lse_out
