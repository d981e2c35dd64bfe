"""torch.library custom ops over the C ABI: flashattn::fwd and flashattn::bwd.

The ops are functional (they allocate their outputs with torch), have fake (meta) kernels for
torch.compile, and flashattn::fwd has an autograd formula that calls flashattn::bwd. They run
on CPU tensors (host paths) and CUDA tensors (on the tensors' device and torch's current
stream). Scratch memory comes from torch's allocator, so calls are CUDA-graph capturable:
no host syncs, no cudaMalloc.

Layouts: fixed length q/k/v are [batch, seqlen, nheads, headdim]; varlen (cu_seqlens given)
are packed [total, nheads, headdim]. LSE is [batch, nheads, seqlen_q], or [nheads, total_q]:
float32, except float64 for float64 inputs (computed in fp64 on the reference backend, which
"auto" picks for them), so the LSE is exact too.
"""

from __future__ import annotations

import ctypes
import os
import struct
from typing import Optional, Tuple

import torch

from . import _lib

_DTYPES = {
    torch.float16: _lib.DTYPE_FP16,
    torch.bfloat16: _lib.DTYPE_BF16,
    torch.float32: _lib.DTYPE_FP32,
    torch.float64: _lib.DTYPE_FP64,
}

# Device kernels load 16-byte vectors: pointers and strides must allow that.
_DEVICE_ALIGN = 16

# Tests: outputs start as NaN, so a path that leaves an element unwritten fails loudly.
_POISON = os.environ.get("FLASHATTN_DEBUG_POISON", "") == "1"


def _alloc(shape, dtype, device, fill):
    """Output buffer: `fill` None = uninitialized (every element is written by the call)."""
    if _POISON:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    if fill is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.full(shape, fill, dtype=dtype, device=device)


def _dtype_id(dtype):
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"flashattn: dtype {dtype} is not supported (float16, bfloat16; float32/float64 on CPU)") from None


def _head_pad(t: torch.Tensor) -> int:
    """Columns to add so device kernels see a head dim that is a multiple of 16 bytes (as flash_attn pads)."""
    if t.device.type != "cuda":
        return 0
    vec = _DEVICE_ALIGN // t.element_size()
    return (-t.shape[-1]) % vec


def _usable(t: torch.Tensor) -> torch.Tensor:
    """t itself when the C ABI can take its strides, else a contiguous copy."""
    if t.numel() == 0:
        return t
    if t.stride(-1) != 1 and t.shape[-1] != 1:
        return t.contiguous()
    if t.device.type == "cuda":
        vec = _DEVICE_ALIGN // t.element_size()
        if t.data_ptr() % _DEVICE_ALIGN != 0:
            # contiguous() would return a contiguous-but-misaligned view itself: copy.
            return t.clone(memory_format=torch.contiguous_format)
        for size, stride in zip(t.shape[:-1], t.stride()[:-1]):
            if size > 1 and stride % vec != 0:
                return t.contiguous()
    return t


def _prep(t: torch.Tensor, pad: int) -> torch.Tensor:
    if pad:
        t = torch.nn.functional.pad(t, (0, pad))
    return _usable(t)


# flashattn_tensor {void* data; int64_t shape[4]; int64_t stride[4];}, written in place with one
# struct.pack_into (ctypes field-by-field assignment costs more than the C call's validation).
_TENSOR = struct.Struct("@P8q")
assert _TENSOR.size == ctypes.sizeof(_lib.Tensor)


def _put(params, field, t: torch.Tensor, varlen: bool):
    """Writes t as a flashattn_tensor into params.<field> ([b, s, h, d]; varlen [total, h, d] as [1, total, h, d])."""
    offset = getattr(type(params), field).offset
    ptr = t.data_ptr() if t.numel() else 0
    st = t.stride()
    # The stride of a size-1 last dim is irrelevant; the ABI wants 1.
    if varlen:
        total, h, d = t.shape
        _TENSOR.pack_into(params, offset, ptr, 1, total, h, d, total * st[0], st[0], st[1], 1)
    else:
        b, sq, h, d = t.shape
        _TENSOR.pack_into(params, offset, ptr, b, sq, h, d, st[0], st[1], st[2], 1)


_TEMPLATES = {}


def _new_params(kind):
    """A zeroed-and-initialized params struct (flashattn_*_params_init), copied from a cached one."""
    tpl = _TEMPLATES.get(kind)
    if tpl is None:
        lib = _lib.load()
        tpl = lib.flashattn_fwd_params_init() if kind == "fwd" else lib.flashattn_bwd_params_init()
        _TEMPLATES[kind] = tpl
    return type(tpl).from_buffer_copy(tpl)


def _stream(device: torch.device) -> Optional[int]:
    if device.type != "cuda":
        return None
    return torch.cuda.current_stream(device).cuda_stream


def _fill_options(o, device, softmax_scale, causal, window_left, window_right, softcap, deterministic, backend):
    o.softmax_scale = softmax_scale
    o.causal = int(causal)
    o.window_left = window_left
    o.window_right = window_right
    o.softcap = softcap
    o.dropout_p = 0.0
    o.deterministic = int(deterministic)
    o.backend = backend
    if device.type == "cuda":
        o.device = device.index if device.index is not None else torch.cuda.current_device()
    else:
        o.device = -1
        # Host paths run on torch's intra-op thread count (torch.set_num_threads), like SDPA.
        o.num_threads = torch.get_num_threads()


def _fill_varlen(vl, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    if cu_seqlens_q is None and cu_seqlens_k is None:
        return
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu is None:
            raise ValueError(f"flashattn: {name} is None (give both cu_seqlens_q and cu_seqlens_k, or neither)")
        if cu.dtype != torch.int32 or cu.dim() != 1 or not cu.is_contiguous():
            raise ValueError(f"flashattn: {name} must be a contiguous 1-D int32 tensor (got {cu.dtype}, shape {tuple(cu.shape)})")
    vl.cu_seqlens_q = cu_seqlens_q.data_ptr()
    vl.cu_seqlens_k = cu_seqlens_k.data_ptr()
    vl.batch = cu_seqlens_q.numel() - 1
    vl.max_seqlen_q = max_seqlen_q
    vl.max_seqlen_k = max_seqlen_k


# Workspace sizes by problem signature: the size depends on shapes and options, never on data.
# Caching keeps one validation pass off the per-call path.
_WS_CACHE: dict = {}


def _workspace(kind, params, key, device):
    """(tensor or None, pointer, bytes) of the scratch this device call needs, from torch's allocator."""
    if device.type != "cuda":
        return None, None, 0  # host paths allocate their own (plain heap memory)
    nbytes = _WS_CACHE.get(key)
    if nbytes is None:
        lib = _lib.load()
        size = ctypes.c_size_t(0)
        fn = lib.flashattn_fwd_workspace_size if kind == "fwd" else lib.flashattn_bwd_workspace_size
        # The size query validates cu_seqlens by reading them on the legacy stream (a sync); while a
        # CUDA graph is being captured that would invalidate the capture, so trust them there (the
        # kernels clamp lengths; the real call re-validates outside capture).
        trust = params.varlen.cu_seqlens_q and torch.cuda.is_current_stream_capturing()
        old = os.environ.get("FLASHATTN_TRUST_CU_SEQLENS")
        if trust:
            os.environ["FLASHATTN_TRUST_CU_SEQLENS"] = "1"
        try:
            status = fn(ctypes.byref(params), ctypes.byref(size))
        finally:
            if trust:
                if old is None:
                    del os.environ["FLASHATTN_TRUST_CU_SEQLENS"]
                else:
                    os.environ["FLASHATTN_TRUST_CU_SEQLENS"] = old
        _lib.raise_for_status(status, f"{kind} (workspace size)")
        nbytes = int(size.value)
        if len(_WS_CACHE) > 4096:
            _WS_CACHE.clear()
        _WS_CACHE[key] = nbytes
    if nbytes == 0:
        return None, None, 0
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return ws, ws.data_ptr(), nbytes


def _key(kind, tensors, *rest):
    return (kind,) + tuple((tuple(t.shape), tuple(t.stride()), t.dtype, t.device) for t in tensors) + rest


def _lse_shape(q, varlen):
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


_BACKEND_CPU = _lib.backend_id("cpu")


def _lse_dtype(dtype, backend):
    """float64 for float64 inputs (the C ABI's lse_fp64), except on the tiled cpu backend, which keeps
    an fp32 LSE (it accumulates in fp32); float32 otherwise, as flash_attn."""
    return torch.float64 if dtype == torch.float64 and backend != _BACKEND_CPU else torch.float32


def _set_lse(p, lse):
    """Points params at the LSE buffer: lse (float*) or lse_fp64 (double*) by its dtype."""
    ptr = lse.data_ptr() if lse.numel() else None
    if lse.dtype == torch.float64:
        p.lse_fp64 = ptr
    else:
        p.lse = ptr


# ---- the ops ---------------------------------------------------------------------------------


def _fwd_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    backend: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention forward: (out, lse). `deterministic` is used by the backward only."""
    varlen = cu_seqlens_q is not None
    device = q.device
    d = q.shape[-1]
    pad = _head_pad(q)
    qp, kp, vp = (_prep(t, pad) for t in (q, k, v))
    # Varlen: rows outside every sequence (cu_seqlens[-1] < total) are never written; define them.
    out = _alloc(qp.shape, q.dtype, device, 0.0 if varlen else None)
    lse = _alloc(_lse_shape(q, varlen), _lse_dtype(q.dtype, backend), device, float("-inf") if varlen else None)

    p = _new_params("fwd")
    p.dtype = _dtype_id(q.dtype)
    for field, t in (("q", qp), ("k", kp), ("v", vp), ("out", out)):
        _put(p, field, t, varlen)
    _set_lse(p, lse)
    _fill_options(p.options, device, softmax_scale, causal, window_left, window_right, softcap, deterministic, backend)
    _fill_varlen(p.varlen, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    key = None
    if device.type == "cuda":
        key = _key("fwd", (qp, kp, vp), max_seqlen_q, max_seqlen_k, varlen and cu_seqlens_q.numel(),
                   softmax_scale, causal, window_left, window_right, softcap, backend)
    ws, ws_ptr, ws_bytes = _workspace("fwd", p, key, device)
    status = _lib.load().flashattn_fwd(ctypes.byref(p), ws_ptr, ws_bytes, _stream(device))
    del ws  # stream-ordered: the allocator reuses it only after this stream's work
    _lib.raise_for_status(status, "fwd")
    if pad:
        out = out[..., :d].contiguous()
    return out, lse


def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
              window_right, softcap, deterministic, backend):
    varlen = cu_seqlens_q is not None
    out = q.new_empty(q.shape)
    lse = q.new_empty(_lse_shape(q, varlen), dtype=_lse_dtype(q.dtype, backend))
    return out, lse


def _bwd_impl(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    backend: int,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention backward: (dq, dk, dv), shaped like q, k, v (GQA: dk/dv have k/v's heads)."""
    varlen = cu_seqlens_q is not None
    device = q.device
    d = q.shape[-1]
    pad = _head_pad(q)
    qp, kp, vp, outp, doutp = (_prep(t, pad) for t in (q, k, v, out, dout.to(q.dtype)))
    lse_dtype = _lse_dtype(q.dtype, backend)
    if lse.dtype != lse_dtype or tuple(lse.shape) != _lse_shape(q, varlen):
        raise ValueError(f"flashattn bwd: lse must be {lse_dtype} of shape {_lse_shape(q, varlen)} "
                         f"(got {lse.dtype}, {tuple(lse.shape)})")
    lse = lse.contiguous()
    fill = 0.0 if varlen else None
    dq, dk, dv = (_alloc(t.shape, q.dtype, device, fill) for t in (qp, kp, vp))

    p = _new_params("bwd")
    p.dtype = _dtype_id(q.dtype)
    for field, t in (("q", qp), ("k", kp), ("v", vp), ("out", outp), ("dout", doutp), ("dq", dq), ("dk", dk),
                     ("dv", dv)):
        _put(p, field, t, varlen)
    _set_lse(p, lse)
    _fill_options(p.options, device, softmax_scale, causal, window_left, window_right, softcap, deterministic, backend)
    _fill_varlen(p.varlen, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    key = None
    if device.type == "cuda":
        key = _key("bwd", (qp, kp, vp, outp, doutp), max_seqlen_q, max_seqlen_k, varlen and cu_seqlens_q.numel(),
                   softmax_scale, causal, window_left, window_right, softcap, deterministic, backend)
    ws, ws_ptr, ws_bytes = _workspace("bwd", p, key, device)
    status = _lib.load().flashattn_bwd(ctypes.byref(p), ws_ptr, ws_bytes, _stream(device))
    del ws
    _lib.raise_for_status(status, "bwd")
    if pad:
        dq, dk, dv = (t[..., :d].contiguous() for t in (dq, dk, dv))
    return dq, dk, dv


def _bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
              window_left, window_right, softcap, deterministic, backend):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# ---- registration ------------------------------------------------------------------------------
# The custom ops are what torch.compile traces (with the fake kernels) and what
# torch.ops.flashattn.* exposes. Eager calls skip the custom-op wrapper, whose argument handling
# costs ~50-100 us a call (more than the kernel at short sequence lengths), and go straight to
# the same implementations through a plain autograd.Function (interface.py picks).

fwd = torch.library.custom_op("flashattn::fwd", _fwd_impl, mutates_args=())
fwd.register_fake(_fwd_fake)
bwd = torch.library.custom_op("flashattn::bwd", _bwd_impl, mutates_args=())
bwd.register_fake(_bwd_fake)

_BACKEND_SM90 = _lib.backend_id("sm90")


def _bwd_backend(backend):
    """A backward after an sm90 forward runs on the automatic choice: sm90 where it has a backward for
    the call (head dims 64-256; deterministic up to 192), sm80 otherwise."""
    return _lib.backend_id("auto") if backend == _BACKEND_SM90 else backend


def _setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
     window_right, softcap, deterministic, backend) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    ctx.args = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
                deterministic, _bwd_backend(backend))
    # No gradient flows through the LSE (as in flash_attn): say so instead of ignoring one.
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    dq, dk, dv = torch.ops.flashattn.bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.args)
    return (dq, dk, dv) + (None,) * 11


fwd.register_autograd(_backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """Eager-mode twin of flashattn::fwd + its autograd formula, without the custom-op wrapper."""

    @staticmethod
    def forward(ctx, *inputs):
        out, lse = _fwd_impl(*inputs)
        _setup_context(ctx, inputs, (out, lse))
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
        dq, dk, dv = _bwd_impl(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.args)
        return (dq, dk, dv) + (None,) * 11


def attention(*inputs):
    """(out, lse) with autograd: the custom op while torch.compile traces, the direct path in eager."""
    if torch.compiler.is_compiling():
        return torch.ops.flashattn.fwd(*inputs)
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs[:3]):
        return _EagerAttention.apply(*inputs)
    return _fwd_impl(*inputs)
