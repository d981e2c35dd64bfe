"""torch.library custom ops over the C ABI: flashattn::fwd and flashattn::bwd, and their
extended twins flashattn::fwd_ext / flashattn::bwd_ext with dropout and ALiBi.

The ops are functional (they allocate their outputs with torch), have fake (meta) kernels for
torch.compile, and flashattn::fwd (fwd_ext) has an autograd formula that calls flashattn::bwd
(bwd_ext). They run on CPU tensors (host paths) and CUDA tensors (on the tensors' device and
torch's current stream). Scratch memory comes from torch's allocator, so calls are CUDA-graph
capturable: no host syncs, no cudaMalloc.

Dropout's randomness: fwd_ext draws rng_state = torch.randint(int64 [2]) from torch's default
generator of the tensors' device (seed, offset as the bits of two uint64) and hands the library a
pointer to it, so the numbers are read when the call runs: torch.manual_seed reproduces a run, and
a captured CUDA graph draws fresh ones on every replay (torch's graph-safe Philox state). rng_state
is an output of fwd_ext (the op stays functional for torch.compile) and an input of bwd_ext, which
regenerates the same mask. fwd_ext is tagged nondeterministic_seeded where torch supports tags.

Layouts: fixed length q/k/v are [batch, seqlen, nheads, headdim]; varlen (cu_seqlens given)
are packed [total, nheads, headdim]. LSE is [batch, nheads, seqlen_q], or [nheads, total_q]:
float32, except float64 for float64 inputs (computed in fp64 on the reference backend, which
"auto" picks for them), so the LSE is exact too.
"""

from __future__ import annotations

import ctypes
import inspect
import numbers
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


# The per-call path packs each params struct's head (struct_size, dtype, the tensors, lse, options) with one
# struct.pack_into over a copy of the library's initialized template: no ctypes field assignment, no torch.device
# objects, each tensor's shape and strides read once.
_OPTIONS_FMT = "fiiiffiiii"  # flashattn_options: softmax_scale, causal, window_left/right, softcap, dropout_p,
#                              deterministic, backend, device, num_threads
_OPTIONS = struct.Struct("@" + _OPTIONS_FMT)
assert _OPTIONS.size == ctypes.sizeof(_lib.Options)
# fwd: struct_size, dtype, q, k, v, out, lse, options.
_FWD_HEAD = struct.Struct("@Ii" + "P8q" * 4 + "P" + _OPTIONS_FMT)
assert _FWD_HEAD.size == _lib.FwdParams.options.offset + ctypes.sizeof(_lib.Options)
assert struct.calcsize("@Ii" + "P8q" * 4 + "P") == _lib.FwdParams.options.offset
_FWD_SIZE = ctypes.sizeof(_lib.FwdParams)  # struct_size (load() checks the library agrees)
# bwd: struct_size, dtype, q, k, v, out, dout, lse, dq, dk, dv, options.
_BWD_HEAD = struct.Struct("@Ii" + "P8q" * 5 + "P" + "P8q" * 3 + _OPTIONS_FMT)
assert _BWD_HEAD.size == _lib.BwdParams.options.offset + ctypes.sizeof(_lib.Options)
assert struct.calcsize("@Ii" + "P8q" * 5) == _lib.BwdParams.lse.offset
_BWD_SIZE = ctypes.sizeof(_lib.BwdParams)

# Elements per 16 bytes (the device kernels' vector loads), by dtype.
_VEC = {torch.float16: 8, torch.bfloat16: 8, torch.float32: 4, torch.float64: 2}


def _vec(t: torch.Tensor) -> int:
    return _VEC.get(t.dtype) or _DEVICE_ALIGN // t.element_size()


def _abi(t: torch.Tensor, vec: int, varlen: bool, shape=None):
    """(t or the copy the C ABI can take (as _usable), and its 9 flashattn_tensor values (as _put writes them)).
    vec: elements per 16 bytes for CUDA tensors (_vec), 0 for host tensors. Reads shape and strides once.
    shape: t.shape when the caller has read it already (then it is not read again)."""
    if shape is None:
        shape = t.shape
    st = t.stride()
    if varlen:
        total, h, d = shape
        empty = not (total and h and d)  # 0 in shape (without the tuple search)
    else:
        b, sq, h, d = shape
        empty = not (b and sq and h and d)
    if empty:
        ptr = 0
    else:
        if st[-1] != 1 and d != 1:
            t = t.contiguous()
            st = t.stride()
            ptr = t.data_ptr()
        else:
            ptr = t.data_ptr()
            if vec:
                orig = t
                if ptr % _DEVICE_ALIGN != 0:
                    # contiguous() would return a contiguous-but-misaligned view itself: copy.
                    t = t.clone(memory_format=torch.contiguous_format)
                # A stride of a dim of size > 1 that is no multiple of vec: a contiguous copy.
                elif ((total > 1 and st[0] % vec or h > 1 and st[1] % vec) if varlen else
                      (b > 1 and st[0] % vec or sq > 1 and st[1] % vec or h > 1 and st[2] % vec)):
                    t = t.contiguous()
                if t is not orig:
                    st = t.stride()
                    ptr = t.data_ptr()
    if varlen:
        return t, (ptr, 1, total, h, d, total * st[0], st[0], st[1], 1)
    return t, (ptr, b, sq, h, d, st[0], st[1], st[2], 1)


def _options_values(cuda_index, softmax_scale, causal, window_left, window_right, softcap, deterministic, backend,
                    dropout_p=0.0):
    """The flashattn_options values as _fill_options sets them (cuda_index: the tensors' CUDA device, -1 on CPU)."""
    if cuda_index >= 0:
        return (softmax_scale, int(causal), window_left, window_right, softcap, dropout_p, int(deterministic), backend,
                cuda_index, 0)
    # Host paths run on torch's intra-op thread count (torch.set_num_threads), like SDPA.
    return (softmax_scale, int(causal), window_left, window_right, softcap, dropout_p, int(deterministic), backend, -1,
            torch.get_num_threads())


def _pack_head(packer, p, values, options):
    """packer.pack_into(p, 0, *values, *options); values out of the C types' range (a float beyond float32's,
    an int beyond int32's) are written as ctypes assignment writes them (inf, truncated), for the library to judge."""
    try:
        packer.pack_into(p, 0, *values, *options)
    except (OverflowError, struct.error):
        packer.pack_into(p, 0, *values, *((0.0, 0, 0, 0, 0.0, 0.0, 0, 0, 0, 0)))
        o = p.options
        (o.softmax_scale, o.causal, o.window_left, o.window_right, o.softcap, o.dropout_p, o.deterministic, o.backend,
         o.device, o.num_threads) = options


# Bound once: the per-call paths skip the module attribute lookups (dynamo knows the functions, not their names).
_is_compiling = torch.compiler.is_compiling
_get_num_threads = torch.get_num_threads

_TEMPLATES = {}
_FWD_TEMPLATE = None  # _TEMPLATES["fwd"], once made: the per-call path copies it without a dict lookup
_FWD_FROM = _lib.FwdParams.from_buffer_copy
_byref = ctypes.byref
_addressof = ctypes.addressof


def _template(kind):
    """The library's initialized params struct (flashattn_*_params_init), made once."""
    global _FWD_TEMPLATE
    tpl = _TEMPLATES.get(kind)
    if tpl is None:
        lib = _lib.load()
        tpl = lib.flashattn_fwd_params_init() if kind == "fwd" else lib.flashattn_bwd_params_init()
        _TEMPLATES[kind] = tpl
        if kind == "fwd":
            _FWD_TEMPLATE = tpl
    return tpl


def _new_params(kind):
    """A zeroed-and-initialized params struct (flashattn_*_params_init), copied from a cached one."""
    tpl = _template(kind)
    return type(tpl).from_buffer_copy(tpl)


def _stream(device: torch.device) -> Optional[int]:
    if device.type != "cuda":
        return None
    return _raw_stream(device.index)


# torch's current stream of a CUDA device as a raw cudaStream_t, without building a torch.cuda.Stream object
# (what torch's own generated code calls); torch.cuda.current_stream where this torch lacks it.
_GET_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _raw_stream(index: int) -> int:
    if _GET_RAW_STREAM is not None:
        return _GET_RAW_STREAM(index)
    return torch.cuda.current_stream(index).cuda_stream


def _fill_options(o, device, softmax_scale, causal, window_left, window_right, softcap, deterministic, backend,
                  dropout_p=0.0):
    o.softmax_scale = softmax_scale
    o.causal = int(causal)
    o.window_left = window_left
    o.window_right = window_right
    o.softcap = softcap
    o.dropout_p = dropout_p
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


# Forward scratch reused across calls on one stream (split-KV partials, the causal scheduler's counter): keyed by
# (device, raw stream), allocated on that stream. Reuse is safe because every call that uses it enqueues its kernels
# on that stream, which orders them after the previous call's (the library's contract: the workspace arrives
# uninitialised, and each launch initializes what it needs). Not while a CUDA graph is captured: a graph gets scratch
# of its own from its pool, as before. Forward scratch only (the backward's can be large), up to _WS_REUSE_MAX_BYTES,
# for at most _WS_REUSE_STREAMS streams (the oldest entry is dropped: torch frees it in its stream's order).
_WS_REUSE: dict = {}
_WS_REUSE_MAX_BYTES = 16 << 20
_WS_REUSE_STREAMS = 8
_IS_CAPTURING = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)


def _reused_workspace(nbytes, like, index, stream):
    """A uint8 CUDA tensor of at least nbytes for this (device, stream), or None where reuse does not apply."""
    if nbytes > _WS_REUSE_MAX_BYTES or _IS_CAPTURING is None or _IS_CAPTURING():
        return None
    key = (index, stream)
    ws = _WS_REUSE.get(key)
    if ws is None or ws.numel() < nbytes:
        if ws is None and len(_WS_REUSE) >= _WS_REUSE_STREAMS:
            try:
                _WS_REUSE.pop(next(iter(_WS_REUSE)))
            except (StopIteration, KeyError, RuntimeError):  # another thread changed it meanwhile
                pass
        # At least 64 KB, doubling when it grows: a run of growing sizes reallocates a few times only.
        size = min(max(nbytes, 64 << 10, 2 * ws.numel() if ws is not None else 0), _WS_REUSE_MAX_BYTES)
        ws = like.new_empty(size, dtype=torch.uint8)
        _WS_REUSE[key] = ws
    return ws


def _workspace(kind, params, key, device, raise_for_status=None, like=None, glossary=None, stream=None):
    """(tensor or None, pointer, bytes) of the scratch this device call needs, from torch's allocator (key: the
    call's signature for CUDA tensors, None for host tensors). like: a tensor on `device` (device may then be None):
    the scratch comes from like.new_empty (cheaper than torch.empty with a device argument, same allocation).
    glossary: errors go through _raise_kv with it. stream: the raw stream a forward call runs on, with like: its
    scratch is then reused across calls on that stream (_WS_REUSE)."""
    if key is None:
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
        if glossary is not None:
            _raise_kv(status, f"{kind} (workspace size)", glossary)
        (raise_for_status or _lib.raise_for_status)(status, f"{kind} (workspace size)")
        nbytes = int(size.value)
        if len(_WS_CACHE) > 4096:
            _WS_CACHE.clear()
        _WS_CACHE[key] = nbytes
    if nbytes == 0:
        return None, None, 0
    if stream is not None and like is not None and kind == "fwd":
        ws = _reused_workspace(nbytes, like, like.get_device(), stream)
        if ws is not None:
            return ws, ws.data_ptr(), ws.numel()
    if like is not None:
        ws = like.new_empty(nbytes, dtype=torch.uint8)
    else:
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


def check_dropout_p(dropout_p) -> float:
    """dropout_p as a float in [0, 1) (a Python, numpy or 0-d torch real); ValueError naming it otherwise."""
    if type(dropout_p) is float and 0.0 <= dropout_p < 1.0:  # the usual Python float
        return dropout_p
    if isinstance(dropout_p, torch.Tensor):
        real = dropout_p.dim() == 0 and not dropout_p.dtype.is_complex and dropout_p.dtype != torch.bool
    else:
        real = isinstance(dropout_p, numbers.Real)
    if not real:
        raise ValueError(f"flashattn: dropout_p must be a real number in [0, 1), got {dropout_p!r}")
    p = float(dropout_p)
    if not 0.0 <= p < 1.0:  # also refuses NaN
        raise ValueError(f"flashattn: dropout_p={dropout_p!r} must be in [0, 1) (0 = no dropout)")
    return p


def check_alibi_slopes(alibi_slopes, q, batch):
    """alibi_slopes as the C ABI reads them: a contiguous float32 tensor [nheads_q] or [batch, nheads_q] on
    q's device (a non-contiguous one is copied). ValueError naming alibi_slopes otherwise."""
    if alibi_slopes is None:
        return None
    if not isinstance(alibi_slopes, torch.Tensor):
        raise ValueError(f"flashattn: alibi_slopes must be a torch.Tensor or None, got {type(alibi_slopes).__name__}")
    h = q.shape[-2]
    shapes = ((h,), (batch, h))
    if alibi_slopes.dtype != torch.float32:
        raise ValueError(f"flashattn: alibi_slopes must be float32, got {alibi_slopes.dtype}")
    if tuple(alibi_slopes.shape) not in shapes:
        raise ValueError(f"flashattn: alibi_slopes must have shape (nheads,) = {shapes[0]} or (batch, nheads) = "
                         f"{shapes[1]}, got {tuple(alibi_slopes.shape)}")
    if alibi_slopes.device != q.device:
        raise ValueError(f"flashattn: alibi_slopes must be on the same device as q (got {alibi_slopes.device}, "
                         f"q: {q.device})")
    if alibi_slopes.numel() and alibi_slopes.stride(-1) != 1:
        alibi_slopes = alibi_slopes.contiguous()
    elif alibi_slopes.dim() == 2 and alibi_slopes.shape[0] > 1 and alibi_slopes.stride(0) < h:
        alibi_slopes = alibi_slopes.contiguous()  # e.g. an expanded (stride 0) batch dim
    return alibi_slopes


def _alibi_batch_stride(alibi_slopes) -> int:
    if alibi_slopes.dim() == 1 or alibi_slopes.shape[0] == 1:
        return 0  # one row of slopes serves every sequence
    return alibi_slopes.stride(0)


def _draw_rng_state(device):
    """{seed, offset} for one call with dropout, from torch's default generator of `device` (graph safe)."""
    return torch.randint(-2**63, 2**63 - 1, (2,), dtype=torch.int64, device=device)


def _set_score_mods(p, dropout_p, rng_state, alibi_slopes):
    """Fills the dropout (options.dropout_p is set by _fill_options) and ALiBi fields of fwd/bwd params."""
    if dropout_p > 0:
        p.dropout_rng_state = rng_state.data_ptr()
    if alibi_slopes is not None:
        p.alibi_slopes = alibi_slopes.data_ptr()
        p.alibi_batch_stride = _alibi_batch_stride(alibi_slopes)


def _mods_key(dropout_p, alibi_slopes):
    return (dropout_p > 0, None if alibi_slopes is None else _alibi_batch_stride(alibi_slopes))


_NO_MODS = (False, None)  # _mods_key(0.0, None)


# ---- the ops ---------------------------------------------------------------------------------


def _fwd_core(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
              window_right, softcap, dropout_p, alibi_slopes, deterministic, backend, want_rng=True, need_lse=True,
              reuse_scratch=False):
    """(out, lse, rng_state): rng_state is the int64 [2] {seed, offset} drawn for dropout, zeros without
    (None without dropout when not want_rng: flashattn::fwd has no such output). need_lse False (an eager call
    whose LSE nobody reads): lse is None, the library gets a NULL lse and computes none. reuse_scratch: an eager
    inference call's (never the ops', which torch.compile may run inside its CUDA-graph memory pools): the forward's
    scratch is then the stream's reused buffer (_WS_REUSE)."""
    varlen = cu_seqlens_q is not None
    dtype = q.dtype
    dtype_id = _DTYPES.get(dtype) or _dtype_id(dtype)
    qp, kp, vp = q, k, v
    pad = 0
    if q.is_cuda:
        index = q.get_device()
        vec = _vec(q)
        pad = (-q.shape[-1]) % vec
        if pad:
            qp, kp, vp = (torch.nn.functional.pad(t, (0, pad)) for t in (q, k, v))
    else:
        index, vec = -1, 0
    qp, qf = _abi(qp, vec, varlen)
    kp, kf = _abi(kp, vec, varlen)
    vp, vf = _abi(vp, vec, varlen)
    _, B, S, H, D = qf[:5]  # out is [B, S, H, D] contiguous (varlen: B = 1, S = total_q)
    lse_dtype = torch.float64 if dtype is torch.float64 and backend != _BACKEND_CPU else torch.float32  # _lse_dtype
    # Varlen: rows outside every sequence (cu_seqlens[-1] < total) are never written; define them.
    if varlen or _POISON:
        device = q.device
        out = _alloc(qp.shape, dtype, device, 0.0 if varlen else None)
        lse = _alloc(_lse_shape(q, varlen), lse_dtype, device, float("-inf") if varlen else None) if need_lse else None
    else:
        out = qp.new_empty(B, S, H, D)
        lse = qp.new_empty(B, H, S, dtype=lse_dtype) if need_lse else None
    n = B * S * H * D
    of = (out.data_ptr() if n else 0, B, S, H, D, S * H * D, H * D, D, 1)
    lse_ptr = lse.data_ptr() if need_lse and B * H * S else 0
    if dropout_p > 0:
        rng_state = _draw_rng_state(q.device)
    elif want_rng:
        rng_state = torch.zeros(2, dtype=torch.int64, device=q.device)
    else:
        rng_state = None
    if alibi_slopes is not None:
        alibi_slopes = check_alibi_slopes(alibi_slopes, q, cu_seqlens_q.numel() - 1 if varlen else q.shape[0])

    p = _FWD_FROM(_FWD_TEMPLATE or _template("fwd"))
    # flashattn_options (as _options_values): host paths run on torch's intra-op thread count, like SDPA.
    opts = (softmax_scale, int(causal), window_left, window_right, softcap, dropout_p, int(deterministic), backend,
            index, 0 if index >= 0 else torch.get_num_threads())
    fp64_lse = lse_dtype is torch.float64
    try:
        _FWD_HEAD.pack_into(p, 0, _FWD_SIZE, dtype_id, *qf, *kf, *vf, *of, 0 if fp64_lse else lse_ptr, *opts)
    except (OverflowError, struct.error):
        _pack_head(_FWD_HEAD, p, (_FWD_SIZE, dtype_id, *qf, *kf, *vf, *of, 0 if fp64_lse else lse_ptr), opts)
    if fp64_lse:
        p.lse_fp64 = lse_ptr
    if varlen:
        _fill_varlen(p.varlen, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if dropout_p > 0 or alibi_slopes is not None:
        _set_score_mods(p, dropout_p, rng_state, alibi_slopes)
    if index >= 0:
        key = ("fwd", qf[1:], kf[1:], vf[1:], dtype_id, max_seqlen_q, max_seqlen_k, varlen and cu_seqlens_q.numel(),
               opts, _NO_MODS if alibi_slopes is None and not dropout_p > 0 else _mods_key(dropout_p, alibi_slopes),
               need_lse)
        stream = _GET_RAW_STREAM(index) if _GET_RAW_STREAM is not None else _raw_stream(index)
        ws, ws_ptr, ws_bytes = _workspace("fwd", p, key, None, like=q, stream=stream if reuse_scratch else None)
    else:
        ws, ws_ptr, ws_bytes, stream = None, None, 0, None
    status = _lib.load().flashattn_fwd(_byref(p), ws_ptr, ws_bytes, stream)
    del ws  # stream-ordered: the allocator reuses it only after this stream's work
    if status:
        _lib.raise_for_status(status, "fwd")
    if pad:
        out = out[..., :-pad].contiguous()
    return out, lse, rng_state


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
    out, lse, _ = _fwd_core(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                            window_left, window_right, softcap, 0.0, None, deterministic, backend, False)
    return out, lse


def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
              window_right, softcap, deterministic, backend):
    varlen = cu_seqlens_q is not None
    out = q.new_empty(q.shape)
    lse = q.new_empty(_lse_shape(q, varlen), dtype=_lse_dtype(q.dtype, backend))
    return out, lse


def _fwd_ext_impl(
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
    dropout_p: float,
    alibi_slopes: Optional[torch.Tensor],
    deterministic: bool,
    backend: int,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention forward with dropout and ALiBi: (out, lse, rng_state). rng_state (int64 [2], the bits of
    uint64 {seed, offset}) is drawn from torch's generator when dropout_p > 0, zeros otherwise; pass it
    to bwd_ext."""
    return _fwd_core(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                     window_left, window_right, softcap, dropout_p, alibi_slopes, deterministic, backend)


def _fwd_ext_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
                  window_right, softcap, dropout_p, alibi_slopes, deterministic, backend):
    out, lse = _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                         window_left, window_right, softcap, deterministic, backend)
    return out, lse, q.new_empty((2,), dtype=torch.int64)


def _bwd_core(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
              window_left, window_right, softcap, dropout_p, rng_state, alibi_slopes, deterministic, backend):
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
    if dropout_p > 0:
        if (rng_state is None or rng_state.dtype != torch.int64 or tuple(rng_state.shape) != (2,)
                or rng_state.device != device):
            raise ValueError("flashattn bwd: rng_state must be the forward's int64 [2] tensor on the tensors' device "
                             f"(got {None if rng_state is None else (rng_state.dtype, tuple(rng_state.shape))})")
        rng_state = rng_state.contiguous()
    if alibi_slopes is not None:
        alibi_slopes = check_alibi_slopes(alibi_slopes, q, cu_seqlens_q.numel() - 1 if varlen else q.shape[0])
    fill = 0.0 if varlen else None
    dq, dk, dv = (_alloc(t.shape, q.dtype, device, fill) for t in (qp, kp, vp))

    p = _new_params("bwd")
    p.dtype = _dtype_id(q.dtype)
    for field, t in (("q", qp), ("k", kp), ("v", vp), ("out", outp), ("dout", doutp), ("dq", dq), ("dk", dk),
                     ("dv", dv)):
        _put(p, field, t, varlen)
    _set_lse(p, lse)
    _fill_options(p.options, device, softmax_scale, causal, window_left, window_right, softcap, deterministic, backend,
                  dropout_p)
    _fill_varlen(p.varlen, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    _set_score_mods(p, dropout_p, rng_state, alibi_slopes)
    key = None
    if device.type == "cuda":
        key = _key("bwd", (qp, kp, vp, outp, doutp), max_seqlen_q, max_seqlen_k, varlen and cu_seqlens_q.numel(),
                   softmax_scale, causal, window_left, window_right, softcap, deterministic, backend,
                   _mods_key(dropout_p, alibi_slopes))
    ws, ws_ptr, ws_bytes = _workspace("bwd", p, key, device)
    status = _lib.load().flashattn_bwd(ctypes.byref(p), ws_ptr, ws_bytes, _stream(device))
    del ws
    _lib.raise_for_status(status, "bwd")
    if pad:
        dq, dk, dv = (t[..., :d].contiguous() for t in (dq, dk, dv))
    return dq, dk, dv


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
    return _bwd_core(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                     causal, window_left, window_right, softcap, 0.0, None, None, deterministic, backend)


def _bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
              window_left, window_right, softcap, deterministic, backend):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _bwd_ext_impl(
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
    dropout_p: float,
    rng_state: Optional[torch.Tensor],
    alibi_slopes: Optional[torch.Tensor],
    deterministic: bool,
    backend: int,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention backward with dropout (rng_state: the forward's) and ALiBi: (dq, dk, dv)."""
    return _bwd_core(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                     causal, window_left, window_right, softcap, dropout_p, rng_state, alibi_slopes, deterministic,
                     backend)


def _bwd_ext_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                  causal, window_left, window_right, softcap, dropout_p, rng_state, alibi_slopes, deterministic,
                  backend):
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

# fwd_ext draws from torch's generator: tagged as a seeded random op (no CSE of two equal calls, kept
# in program order), where this torch's custom_op takes tags (2.5+). Its dropout_p argument lets
# torch see that a call with dropout_p = 0 draws nothing.
_RNG_TAGS = ({"tags": (torch.Tag.nondeterministic_seeded,)}
             if "tags" in inspect.signature(torch.library.custom_op).parameters else {})
fwd_ext = torch.library.custom_op("flashattn::fwd_ext", _fwd_ext_impl, mutates_args=(), **_RNG_TAGS)
fwd_ext.register_fake(_fwd_ext_fake)
bwd_ext = torch.library.custom_op("flashattn::bwd_ext", _bwd_ext_impl, mutates_args=())
bwd_ext.register_fake(_bwd_ext_fake)

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
    """Eager-mode twin of flashattn::fwd + its autograd formula, without the custom-op wrapper. Takes
    (q, k, v, cu_seqlens_q, cu_seqlens_k, rest) with rest = the op's other (non-tensor) arguments as one
    tuple: autograd's per-input bookkeeping is what a call through apply pays for."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, rest):
        out, lse = _fwd_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, *rest)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
        (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, deterministic,
         backend) = rest
        ctx.args = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
                    deterministic, _bwd_backend(backend))
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
        dq, dk, dv = _bwd_impl(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.args)
        return dq, dk, dv, None, None, None


def _setup_context_ext(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
     window_right, softcap, dropout_p, alibi_slopes, deterministic, backend) = inputs
    out, lse, rng_state = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, rng_state, alibi_slopes)
    ctx.args = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, dropout_p)
    ctx.args2 = (deterministic, _bwd_backend(backend))
    ctx.mark_non_differentiable(lse, rng_state)


def _backward_ext(ctx, dout, dlse, drng):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, rng_state, alibi_slopes = ctx.saved_tensors
    dq, dk, dv = torch.ops.flashattn.bwd_ext(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.args,
                                             rng_state, alibi_slopes, *ctx.args2)
    return (dq, dk, dv) + (None,) * 13


fwd_ext.register_autograd(_backward_ext, setup_context=_setup_context_ext)


class _EagerAttentionExt(torch.autograd.Function):
    """Eager-mode twin of flashattn::fwd_ext + its autograd formula."""

    @staticmethod
    def forward(ctx, *inputs):
        output = _fwd_ext_impl(*inputs)
        _setup_context_ext(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx, dout, dlse, drng):
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, rng_state, alibi_slopes = ctx.saved_tensors
        dq, dk, dv = _bwd_ext_impl(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.args, rng_state,
                                   alibi_slopes, *ctx.args2)
        return (dq, dk, dv) + (None,) * 13


def attention_ext(*inputs):
    """(out, lse, rng_state) with autograd, for calls with dropout or ALiBi (the arguments of flashattn::fwd_ext)."""
    if torch.compiler.is_compiling():
        return torch.ops.flashattn.fwd_ext(*inputs)
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs[:3]):
        return _EagerAttentionExt.apply(*inputs)
    return _fwd_ext_impl(*inputs)


def attention(*inputs, need_lse=True):
    """(out, lse) with autograd: the custom op while torch.compile traces, the direct path in eager.
    need_lse False: the caller returns out only; an eager call without autograd then gives lse None (no LSE
    allocated or computed)."""
    if torch.compiler.is_compiling():
        return torch.ops.flashattn.fwd(*inputs)
    if torch.is_grad_enabled() and (inputs[0].requires_grad or inputs[1].requires_grad or inputs[2].requires_grad):
        return _EagerAttention.apply(*inputs[:5], inputs[5:])
    if need_lse:
        return _fwd_impl(*inputs)
    out, lse, _ = _fwd_core(*inputs[:12], 0.0, None, *inputs[12:], False, False, True)
    return out, lse


# ---- FP8 (E4M3) attention, forward only ------------------------------------------------------------------------
# flashattn::fwd_fp8: q, k, v torch.float8_e4m3fn with float32 block scales, contiguous [batch, nheads,
# nblocks] (interface.py turns per-tensor and per-head scales into that layout); out in out_dtype (bfloat16
# or float16), lse float32. No autograd formula: FP8 attention is for inference, and interface.py refuses
# inputs that require grad before calling it. Host tensors run on the reference backend (the exact
# attention of the dequantized inputs); CUDA tensors the sm90 kernel (other GPUs refuse FP8 by name).
# v_layout (flashattn_fwd_params.fp8_v_layout): _lib.FP8_V_ROWS or _lib.FP8_V_ROWS_AUTO (v in rows; AUTO lets the
# library copy it to V^T in the workspace where that pays), or _lib.FP8_V_KEYS_PERMUTED16 with v as
# flashattn.fp8.keys_permuted16 returns it (V^T storage behind a [b, s, h, d] view whose stride(1) is 1).

_FP8_OUT_DTYPES = {torch.bfloat16: _lib.DTYPE_BF16, torch.float16: _lib.DTYPE_FP16}
# flashattn_fp8_scales {q_scale, k_scale, v_scale, q_block_size, k_block_size, out_dtype}, one struct.pack_into.
_FP8_FIELDS = struct.Struct("@PPPiii")
assert _FP8_FIELDS.size <= ctypes.sizeof(_lib.Fp8Scales) and _lib.Fp8Scales.out_dtype.offset == 3 * 8 + 8
_FP8_OFFSET = _lib.FwdParams.fp8.offset


def _v_keys_permuted16(v: torch.Tensor, pad: int) -> torch.Tensor:
    """A keys_permuted16 v as the C ABI takes it: v itself, or a copy of its V^T storage in the same layout when the
    head dim gets `pad` zero columns (CUDA, as q and k) or a CUDA pointer or stride is no multiple of 16 bytes.
    Never v.contiguous() (as _prep would do: stride(3) != 1): that copies the view's elements, not the V^T rows,
    whose last group of keys lies past the view. ValueError when v's storage ends before its rows do."""
    b, s, h, d = v.shape
    if v.numel() == 0:
        return v
    sb, _, sh, row_len = v.stride()
    # The kernel reads each row up to seqlen_k rounded up to 16 (the permuted last group and its zero padding).
    end = v.storage_offset() + (b - 1) * sb + (h - 1) * sh + (d - 1) * row_len + -(-s // 16) * 16
    if end > v.untyped_storage().nbytes():
        raise ValueError(f"flashattn: v_layout='keys_permuted16': v's storage ({v.untyped_storage().nbytes()} "
                         f"bytes) ends before its V^T rows do ({end} bytes): pass v as flashattn.fp8.keys_permuted16 "
                         "returns it")
    misaligned = v.device.type == "cuda" and bool(
        v.data_ptr() % _DEVICE_ALIGN or b > 1 and sb % _DEVICE_ALIGN or h > 1 and sh % _DEVICE_ALIGN)
    if not pad and not misaligned:
        return v
    rows = torch.as_strided(v, (b, h, d, row_len), (sb, sh, row_len, 1)).view(torch.uint8)  # [b, h, d, L]
    dp = d + pad
    out = torch.empty((b, h, dp, row_len), dtype=torch.uint8, device=v.device)
    out[:, :, d:].zero_()
    out[:, :, :d].copy_(rows)
    return torch.as_strided(out.view(torch.float8_e4m3fn), (b, s, h, dp), (h * dp * row_len, 1, dp * row_len, row_len))


def _fwd_fp8_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_scale: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    q_block_size: int,
    k_block_size: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    alibi_slopes: Optional[torch.Tensor],
    out_dtype: torch.dtype,
    backend: int,
    v_layout: int = 0,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """FP8 attention forward: (out, lse). q/k/v float8_e4m3fn; q_scale float32 [batch, nheads, ceil(seqlen_q /
    q_block_size)], k_scale/v_scale [batch, nheads_k, ceil(seqlen_k / k_block_size)] (varlen: batch = the number
    of sequences, seqlen = max_seqlen); value = float(code) * scale[b, h, row // block_size], rows counted from
    each sequence's start. v_layout: the C fp8_v_layout (0 rows, 1 keys_permuted16: v from
    flashattn.fp8.keys_permuted16, fixed length only). out (q's shape) in out_dtype, lse float32."""
    scales = [t if t.is_contiguous() else t.contiguous() for t in (q_scale, k_scale, v_scale)]
    return _fwd_fp8_core(q, k, v, *scales, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q_block_size,
                         k_block_size, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                         out_dtype, backend, v_layout, True)


def _fwd_fp8_core(q, k, v, q_scale, k_scale, v_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                  q_block_size, k_block_size, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                  out_dtype, backend, v_layout, need_lse, reuse_scratch=False):
    """_fwd_fp8_impl with the scales contiguous already. need_lse False (an eager call whose LSE nobody reads): lse
    is None and the library gets a NULL lse, as _fwd_core does; reuse_scratch as _fwd_core's."""
    if out_dtype not in _FP8_OUT_DTYPES:
        raise ValueError(f"flashattn: out_dtype must be torch.bfloat16 or torch.float16 for FP8 attention, got {out_dtype}")
    varlen = cu_seqlens_q is not None
    v_keys_permuted = v_layout == _lib.FP8_V_KEYS_PERMUTED16
    if v_keys_permuted and varlen:
        raise NotImplementedError("flashattn: v_layout='keys_permuted16' is for fixed-length batches (no cu_seqlens)")
    # The per-call path packs the params as _fwd_core does (one struct.pack_into over a template copy, each
    # tensor's shape and strides read once); the FP8 fields with one more.
    d = q.shape[-1]
    if q.is_cuda:
        index = q.get_device()
        vec = _DEVICE_ALIGN  # elements per 16 bytes: one byte each
        pad = (-d) % vec
    else:
        index, vec, pad = -1, 0, 0
    qp, qf = _abi(torch.nn.functional.pad(q, (0, pad)) if pad else q, vec, varlen)
    kp, kf = _abi(torch.nn.functional.pad(k, (0, pad)) if pad else k, vec, varlen)
    if v_keys_permuted:  # v's real strides (V^T storage), not the rows layout's
        vp = _v_keys_permuted16(v, pad)
        vf = (_ptr(vp), *vp.shape, *vp.stride())
    else:
        vp, vf = _abi(torch.nn.functional.pad(v, (0, pad)) if pad else v, vec, varlen)
    _, B, S, H, D = qf[:5]  # out is [B, S, H, D] contiguous (varlen: B = 1, S = total_q)
    if varlen or _POISON:
        device = q.device
        out = _alloc(qp.shape, out_dtype, device, 0.0 if varlen else None)
        lse = _alloc(_lse_shape(q, varlen), torch.float32, device, float("-inf") if varlen else None) if need_lse else None
    else:
        out = qp.new_empty(B, S, H, D, dtype=out_dtype)
        lse = qp.new_empty(B, H, S, dtype=torch.float32) if need_lse else None
    of = (out.data_ptr() if B * S * H * D else 0, B, S, H, D, S * H * D, H * D, D, 1)
    lse_ptr = lse.data_ptr() if need_lse and lse.numel() else 0
    if alibi_slopes is not None:
        alibi_slopes = check_alibi_slopes(alibi_slopes, q, cu_seqlens_q.numel() - 1 if varlen else q.shape[0])

    p = _FWD_FROM(_FWD_TEMPLATE or _template("fwd"))
    opts = (softmax_scale, int(causal), window_left, window_right, softcap, 0.0, 0, backend, index,
            0 if index >= 0 else _get_num_threads())
    head = (_FWD_SIZE, _lib.DTYPE_FP8_E4M3, *qf, *kf, *vf, *of, lse_ptr)
    try:
        _FWD_HEAD.pack_into(p, 0, *head, *opts)
    except (OverflowError, struct.error):
        _pack_head(_FWD_HEAD, p, head, opts)
    if varlen or cu_seqlens_k is not None:  # (one of the two alone: _fill_varlen raises)
        _fill_varlen(p.varlen, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if alibi_slopes is not None:
        _set_score_mods(p, 0.0, None, alibi_slopes)
    fp8_values = (_ptr(q_scale), _ptr(k_scale), _ptr(v_scale), q_block_size, k_block_size, _FP8_OUT_DTYPES[out_dtype])
    try:
        _FP8_FIELDS.pack_into(p, _FP8_OFFSET, *fp8_values)
    except (OverflowError, struct.error):  # block sizes beyond int32: as ctypes assignment writes them
        f = p.fp8
        f.q_scale, f.k_scale, f.v_scale, f.q_block_size, f.k_block_size, f.out_dtype = fp8_values
    p.fp8_v_layout = v_layout
    if index >= 0:
        key = ("fwd_fp8", qf[1:], kf[1:], vf[1:], q_scale.shape, k_scale.shape, max_seqlen_q, max_seqlen_k,
               varlen and cu_seqlens_q.numel(), q_block_size, k_block_size, out_dtype, opts,
               _NO_MODS if alibi_slopes is None else _mods_key(0.0, alibi_slopes), v_layout, need_lse)
        stream = _GET_RAW_STREAM(index) if _GET_RAW_STREAM is not None else _raw_stream(index)
        ws, ws_ptr, ws_bytes = _workspace("fwd", p, key, None, like=q, stream=stream if reuse_scratch else None)
    else:
        ws, ws_ptr, ws_bytes, stream = None, None, 0, None
    status = _lib.load().flashattn_fwd(_byref(p), ws_ptr, ws_bytes, stream)
    del ws
    if status:
        _lib.raise_for_status(status, "fwd (fp8)")
    if pad:
        out = out[..., :d].contiguous()
    return out, lse


def _fwd_fp8_fake(q, k, v, q_scale, k_scale, v_scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                  q_block_size, k_block_size, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                  out_dtype, backend, v_layout=0):
    out = q.new_empty(q.shape, dtype=out_dtype)
    lse = q.new_empty(_lse_shape(q, cu_seqlens_q is not None), dtype=torch.float32)
    return out, lse


fwd_fp8 = torch.library.custom_op("flashattn::fwd_fp8", _fwd_fp8_impl, mutates_args=())
fwd_fp8.register_fake(_fwd_fp8_fake)


def fp8_attention(*inputs, need_lse=True):
    """(out, lse) of flashattn::fwd_fp8 (arguments as the op, the scales contiguous): the op while torch.compile
    traces, the direct path in eager, where need_lse False gives lse None and skips computing it. No autograd (the
    caller refuses inputs that require grad)."""
    if torch.compiler.is_compiling():
        return torch.ops.flashattn.fwd_fp8(*inputs)
    return _fwd_fp8_core(*inputs, need_lse, True)


# ---- KV cache / paged KV (flash_attn_with_kvcache; flash_attn_varlen_func with block_table) ----------------------
# Two ops, so that mutation is declared exactly when it happens (a declared mutation makes torch.compile's
# functionalization clone or copy back the whole cache):
#   flashattn::fwd_kvcache         reads the cache (paged and/or through cache_seqlens, leftpad, batch_idx);
#                                  also the forward of the varlen functions with block_table / seqused_k.
#   flashattn::fwd_kvcache_append  first writes k/v (rotated when rotary_cos/sin are given) into k_cache/v_cache
#                                  at rows [cache_seqlens[b], cache_seqlens[b] + seqlen_new), in place, then
#                                  attends: mutates_args=("k_cache", "v_cache").
# Both return (out, lse); lse is an empty tensor unless return_lse (the C call then gets NULL and writes none).
# Neither has a backward: fwd_kvcache's autograd formula raises a clear error (paged KV is inference-only);
# fwd_kvcache_append mutates, so torch cannot take an autograd formula for it, and flash_attn_with_kvcache
# calls it without grad (its outputs never require grad, as flash_attn's).

# flashattn_kv_cache {block_table, block_table_stride, max_pages, seqlens, leftpad, batch_idx, k_new, v_new,
# rotary_cos, rotary_sin, rotary_seqlen, rotary_dim, rotary_interleaved}, written with one struct.pack_into.
_KV_CACHE = struct.Struct("@PqiPPP" + "P8q" * 2 + "PPqii")
assert _KV_CACHE.size == ctypes.sizeof(_lib.KvCache)
_KV_CACHE_OFFSET = _lib.FwdParams.kv_cache.offset
_SEQLENS_FIELD = struct.Struct("@P")
_SEQLENS_OFFSET = _KV_CACHE_OFFSET + _lib.KvCache.seqlens.offset
_NO_TENSOR = (0,) * 9

# The C fields' names as flash_attn_with_kvcache / flash_attn_varlen_func call them, appended to the library's
# messages (which name the C field) so an error names the argument the caller passed.
_GLOSSARY_KVCACHE = (
    (r"kv_cache\.seqlens", "kv_cache.seqlens is cache_seqlens"),
    (r"kv_cache\.leftpad", "kv_cache.leftpad is cache_leftpad"),
    (r"kv_cache\.batch_idx", "kv_cache.batch_idx is cache_batch_idx"),
    (r"kv_cache\.block_table", "kv_cache.block_table is block_table"),
    (r"kv_cache\.max_pages", "kv_cache.max_pages is block_table.shape[1]"),
    (r"kv_cache\.k_new", "kv_cache.k_new is k"),
    (r"kv_cache\.v_new", "kv_cache.v_new is v"),
    (r"kv_cache\.rotary_(cos|sin|seqlen|dim)", "kv_cache.rotary_cos/sin are rotary_cos/sin, rotary_seqlen is "
                                               "rotary_cos.shape[0], rotary_dim is 2 * rotary_cos.shape[1]"),
    (r"(?<![\w.])k\.", "k is k_cache"),
    (r"(?<![\w.])v\.", "v is v_cache"),
)
_GLOSSARY_PAGED = (
    (r"kv_cache\.seqlens", "kv_cache.seqlens is seqused_k"),
    (r"kv_cache\.block_table", "kv_cache.block_table is block_table"),
    (r"kv_cache\.max_pages", "kv_cache.max_pages is block_table.shape[1]"),
    (r"varlen\.cu_seqlens_k", "varlen.cu_seqlens_k is cu_seqlens_k"),
)


def _raise_kv(status, what, glossary):
    """raise_for_status, with the caller's names of the C fields the message mentions."""
    if status == _lib.SUCCESS:
        return
    import re

    msg = _lib.last_error()
    notes = [note for pattern, note in glossary if re.search(pattern, msg)]
    if notes:
        _lib.raise_for_status(status, what, suffix=f" (here {'; '.join(notes)})")
    _lib.raise_for_status(status, what)


def _ptr(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None or t.numel() == 0 else t.data_ptr()


def _index(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """An int32 index array as the C ABI reads it: contiguous (a no-op for the usual contiguous tensor)."""
    if t is None or t.is_contiguous():
        return t
    return t.contiguous()


def _cache_layout_error(name: str, t: torch.Tensor):
    """The cache itself is never copied (appends write into it, and a copy of a large cache per call is no
    option), so a layout the ABI cannot take (_abi would copy it) is an error."""
    need = "16-byte aligned data and strides (CUDA)" if t.device.type == "cuda" else "a contiguous last dim"
    raise ValueError(f"flashattn: {name} needs {need} (got strides {tuple(t.stride())}); it is used in place, "
                     "never copied")


def _kvcache_core(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                  block_table, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                  causal, window_left, window_right, softcap, rotary_interleaved, num_splits, return_lse, backend,
                  lse_out=True, shapes=None, reuse_scratch=False):
    """(out, lse) of both KV-cache ops. Without return_lse, lse is an empty tensor (the ops' contract), or None
    when not lse_out (eager calls, whose caller drops it: no allocation). shapes: (q.shape, k_cache.shape,
    k.shape or None) as the caller read them, having checked v_cache.shape == k_cache.shape and v.shape == k.shape
    (flash_attn_with_kvcache): not read again; None: read here. reuse_scratch: as _fwd_core's (the eager entries')."""
    varlen = cu_seqlens_q is not None
    paged = block_table is not None
    dtype = q.dtype
    qs, kcs, kns = (None, None, None) if shapes is None else shapes
    if q.is_cuda:
        index = q.get_device()
        vec = _vec(q)
        if (q.shape if qs is None else qs)[-1] % vec:
            # The other ops pad such head dims (a padded copy); the cache is used in place and cannot be padded.
            raise NotImplementedError(
                f"flashattn: headdim {q.shape[-1]} with a KV cache on CUDA: the CUDA paths need a head dim that is a "
                f"multiple of {_DEVICE_ALIGN // q.element_size()} here (the cache is used in place and cannot be "
                "padded); pad the head dim of q, the cache and k/v yourself (zero columns, and pass softmax_scale)")
    else:
        index, vec = -1, 0
    qp, qf = _abi(q, vec, varlen, qs)
    kv_packed = varlen and not paged  # varlen without pages: k/v are packed [total_k, nheads_k, d]
    u, kcf = _abi(k_cache, vec, kv_packed, kcs)
    if u is not k_cache:
        _cache_layout_error("k_cache", k_cache)
    u, vcf = _abi(v_cache, vec, kv_packed, kcs)  # (kcs is v_cache's shape too, see shapes)
    if u is not v_cache:
        _cache_layout_error("v_cache", v_cache)
    kp, knf = (None, _NO_TENSOR) if k is None else _abi(k, vec, False, kns)
    vp, vnf = (None, _NO_TENSOR) if v is None else _abi(v, vec, False, kns)
    cos = None if rotary_cos is None else rotary_cos.contiguous()
    sin = None if rotary_sin is None else rotary_sin.contiguous()
    # The int32 index arrays as the C ABI reads them: contiguous (_index; a no-op for the usual contiguous tensor).
    if cache_seqlens is not None and not cache_seqlens.is_contiguous():
        cache_seqlens = cache_seqlens.contiguous()
    if cache_batch_idx is not None:
        cache_batch_idx = _index(cache_batch_idx)
    if cache_leftpad is not None:
        cache_leftpad = _index(cache_leftpad)
    if paged and block_table.dim() == 2 and block_table.shape[1] > 1 and block_table.stride(1) != 1:
        block_table = block_table.contiguous()
    if alibi_slopes is not None:
        alibi_slopes = check_alibi_slopes(alibi_slopes, q, cu_seqlens_q.numel() - 1 if varlen else q.shape[0])

    dtype_id = _DTYPES.get(dtype) or _dtype_id(dtype)
    _, B, S, H, D = qf[:5]  # out is [B, S, H, D] contiguous (varlen: B = 1, S = total_q)
    lse_dtype = torch.float64 if dtype is torch.float64 and backend != _BACKEND_CPU else torch.float32  # _lse_dtype
    if varlen or _POISON:
        device = q.device
        out = _alloc(qp.shape, dtype, device, 0.0 if varlen else None)
        if return_lse:
            lse = _alloc(_lse_shape(q, varlen), lse_dtype, device, float("-inf") if varlen else None)
        else:
            lse = torch.empty(0, dtype=lse_dtype, device=device) if lse_out else None
    else:
        out = qp.new_empty(B, S, H, D)
        if return_lse:
            lse = qp.new_empty(B, H, S, dtype=lse_dtype)
        else:
            lse = qp.new_empty(0, dtype=lse_dtype) if lse_out else None
    of = (out.data_ptr() if B * S * H * D else 0, B, S, H, D, S * H * D, H * D, D, 1)
    lse_ptr = lse.data_ptr() if return_lse and B * H * S else 0
    fp64_lse = lse_dtype is torch.float64

    p = _FWD_FROM(_FWD_TEMPLATE or _template("fwd"))
    # flashattn_options (as _options_values): host paths run on torch's intra-op thread count, like SDPA.
    opts = (softmax_scale, int(causal), window_left, window_right, softcap, 0.0, 0, backend, index,
            0 if index >= 0 else _get_num_threads())
    try:
        _FWD_HEAD.pack_into(p, 0, _FWD_SIZE, dtype_id, *qf, *kcf, *vcf, *of, 0 if fp64_lse else lse_ptr, *opts)
    except (OverflowError, struct.error):
        _pack_head(_FWD_HEAD, p, (_FWD_SIZE, dtype_id, *qf, *kcf, *vcf, *of, 0 if fp64_lse else lse_ptr), opts)
    if fp64_lse:
        p.lse_fp64 = lse_ptr
    if varlen:
        _fill_varlen(p.varlen, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if alibi_slopes is not None:
        _set_score_mods(p, 0.0, None, alibi_slopes)
    if paged or cache_leftpad is not None or cache_batch_idx is not None or k is not None or cos is not None:
        # (_ptr of each, inline: the usual append leaves all but cache_seqlens None)
        _KV_CACHE.pack_into(
            p, _KV_CACHE_OFFSET,
            0 if block_table is None else _ptr(block_table), block_table.stride(0) if paged else 0,
            block_table.shape[1] if paged else 0,
            cache_seqlens.data_ptr() if cache_seqlens is not None and cache_seqlens.numel() else 0,
            0 if cache_leftpad is None else _ptr(cache_leftpad), 0 if cache_batch_idx is None else _ptr(cache_batch_idx),
            *knf, *vnf,
            *((0, 0, 0, 0, 0) if cos is None else
              (_ptr(cos), _ptr(sin), cos.shape[0], 2 * cos.shape[1], int(bool(rotary_interleaved)))))
    elif cache_seqlens is not None and cache_seqlens.numel():
        # Only kv_cache.seqlens set (the usual decode step): the template's kv_cache is all zeros.
        _SEQLENS_FIELD.pack_into(p, _SEQLENS_OFFSET, cache_seqlens.data_ptr())
    if num_splits:
        p.num_splits = num_splits  # the template's is 0
    glossary = _GLOSSARY_PAGED if varlen else _GLOSSARY_KVCACHE
    if index >= 0:
        key = ("fwd_kvcache", qf[1:], kcf[1:], vcf[1:], knf[1:], vnf[1:], dtype_id,
               None if cos is None else (tuple(cos.shape), tuple(cos.stride())),
               None if block_table is None else (tuple(block_table.shape), tuple(block_table.stride())),
               max_seqlen_q, max_seqlen_k, varlen and cu_seqlens_q.numel(), cache_seqlens is not None,
               cache_leftpad is not None, cache_batch_idx is not None, bool(rotary_interleaved), num_splits, return_lse,
               opts, _NO_MODS if alibi_slopes is None else _mods_key(0.0, alibi_slopes))
        stream = _GET_RAW_STREAM(index) if _GET_RAW_STREAM is not None else _raw_stream(index)
        ws, ws_ptr, ws_bytes = _workspace("fwd", p, key, None, like=q, glossary=glossary,
                                          stream=stream if reuse_scratch else None)
    else:
        ws, ws_ptr, ws_bytes, stream = None, None, 0, None
    lib = _lib._LIB  # loaded by now (the template came from it); load() otherwise
    # The address as an int: flashattn_fwd takes a void* (_lib), cheaper to convert than a byref's pointer type.
    status = (lib if lib is not None else _lib.load()).flashattn_fwd(_addressof(p), ws_ptr, ws_bytes, stream)
    del ws
    if status:
        _raise_kv(status, "fwd", glossary)
    return out, lse


def _fwd_kvcache_impl(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: Optional[torch.Tensor],
    cache_batch_idx: Optional[torch.Tensor],
    cache_leftpad: Optional[torch.Tensor],
    block_table: Optional[torch.Tensor],
    alibi_slopes: Optional[torch.Tensor],
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    num_splits: int,
    return_lse: bool,
    backend: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention over a KV cache, read only: (out, lse). Fixed length: q [batch, seqlen_q, nheads, d], k_cache /
    v_cache [batch_cache, seqlen_cache, nheads_k, d] or paged [num_pages, page_size, nheads_k, d] with block_table
    int32 [batch, max_pages]. Varlen (cu_seqlens_q/k): q packed [total_q, nheads, d]; k/v paged, or packed
    [total_k, nheads_k, d]; cache_seqlens (seqused_k) then bounds each sequence's keys."""
    return _kvcache_core(q, k_cache, v_cache, None, None, None, None, cache_seqlens, cache_batch_idx, cache_leftpad,
                         block_table, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         softmax_scale, causal, window_left, window_right, softcap, False, num_splits, return_lse,
                         backend)


def _kvcache_fake_out(q, varlen, return_lse, backend):
    out = q.new_empty(q.shape)
    lse_dtype = _lse_dtype(q.dtype, backend)
    lse = q.new_empty(_lse_shape(q, varlen) if return_lse else (0,), dtype=lse_dtype)
    return out, lse


def _fwd_kvcache_fake(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, alibi_slopes,
                      cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
                      window_right, softcap, num_splits, return_lse, backend):
    return _kvcache_fake_out(q, cu_seqlens_q is not None, return_lse, backend)


def _fwd_kvcache_append_impl(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rotary_cos: Optional[torch.Tensor],
    rotary_sin: Optional[torch.Tensor],
    cache_seqlens: torch.Tensor,
    cache_batch_idx: Optional[torch.Tensor],
    cache_leftpad: Optional[torch.Tensor],
    block_table: Optional[torch.Tensor],
    alibi_slopes: Optional[torch.Tensor],
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    rotary_interleaved: bool,
    num_splits: int,
    return_lse: bool,
    backend: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Appends k/v [batch, seqlen_new, nheads_k, d] into k_cache/v_cache in place at rows cache_seqlens[b] + j
    (rotated first when rotary_cos/sin are given; q is rotated for the attention, not written), then attends over
    rows [cache_leftpad[b], cache_seqlens[b] + seqlen_new): (out, lse)."""
    return _kvcache_core(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                         cache_leftpad, block_table, alibi_slopes, None, None, 0, 0, softmax_scale, causal,
                         window_left, window_right, softcap, rotary_interleaved, num_splits, return_lse, backend)


def _fwd_kvcache_append_fake(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                             cache_leftpad, block_table, alibi_slopes, softmax_scale, causal, window_left,
                             window_right, softcap, rotary_interleaved, num_splits, return_lse, backend):
    return _kvcache_fake_out(q, False, return_lse, backend)


fwd_kvcache = torch.library.custom_op("flashattn::fwd_kvcache", _fwd_kvcache_impl, mutates_args=())
fwd_kvcache.register_fake(_fwd_kvcache_fake)
fwd_kvcache_append = torch.library.custom_op("flashattn::fwd_kvcache_append", _fwd_kvcache_append_impl,
                                             mutates_args=("k_cache", "v_cache"))
fwd_kvcache_append.register_fake(_fwd_kvcache_append_fake)

_NO_BACKWARD = ("flashattn: no backward through a paged or bounded KV cache (block_table, seqused_k, "
                "flash_attn_with_kvcache): paged KV is inference-only, as in flash_attn. Call it under "
                "torch.no_grad(), or without block_table/seqused_k for training")


def _no_backward_impl(dout: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor,
                                                                                        torch.Tensor]:
    raise RuntimeError(_NO_BACKWARD)


def _no_backward_fake(dout, k, v):
    return dout.new_empty(dout.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# fwd_kvcache's backward is this op, which raises when it runs: raising in the formula itself would fail
# torch.compile's forward already (AOTAutograd traces the backward at compile time, with the fake kernel here).
# It takes dout so that the partitioner cannot move it into the forward graph.
no_backward = torch.library.custom_op("flashattn::kvcache_no_backward", _no_backward_impl, mutates_args=())
no_backward.register_fake(_no_backward_fake)


def _kvcache_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[1:3])
    ctx.mark_non_differentiable(output[1])


def _kvcache_backward(ctx, dout, dlse):
    k, v = ctx.saved_tensors
    return torch.ops.flashattn.kvcache_no_backward(dout, k, v) + (None,) * 17


fwd_kvcache.register_autograd(_kvcache_backward, setup_context=_kvcache_setup_context)


class _EagerKvCache(torch.autograd.Function):
    """Eager twin of flashattn::fwd_kvcache's autograd: the forward runs, a backward raises."""

    @staticmethod
    def forward(ctx, *inputs):
        out, lse = _fwd_kvcache_impl(*inputs)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        raise RuntimeError(_NO_BACKWARD)


def kvcache_attention(*inputs):
    """(out, lse) of flashattn::fwd_kvcache (arguments as it): the op while torch.compile traces, the direct
    path in eager; with inputs that require grad, out does too and its backward raises."""
    if torch.compiler.is_compiling():
        return torch.ops.flashattn.fwd_kvcache(*inputs)
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs[:3]):
        return _EagerKvCache.apply(*inputs)
    return _fwd_kvcache_impl(*inputs)


def with_kvcache(append, *inputs):
    """(out, lse) of flashattn::fwd_kvcache_append (append) or flashattn::fwd_kvcache (arguments as the op), without
    autograd: the outputs never require grad, as flash_attn_with_kvcache's."""
    if torch.compiler.is_compiling():
        with torch.no_grad():
            if append:
                return torch.ops.flashattn.fwd_kvcache_append(*inputs)
            return torch.ops.flashattn.fwd_kvcache(*inputs)
    return (_fwd_kvcache_append_impl if append else _fwd_kvcache_impl)(*inputs)


# flash_attn_with_kvcache's eager entries (explicit arguments: no *inputs tuple to build and unpack per call).
def with_kvcache_append_out(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                            cache_leftpad, block_table, alibi_slopes, softmax_scale, causal, window_left,
                            window_right, softcap, rotary_interleaved, num_splits, return_lse, backend, shapes=None):
    """with_kvcache(True, ...) for a caller that drops the LSE unless it asked for it (return_lse): in eager, no
    empty LSE is allocated then, and lse is None. shapes: as _kvcache_core's (the op ignores it)."""
    if return_lse or _is_compiling():
        return with_kvcache(True, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                            cache_leftpad, block_table, alibi_slopes, softmax_scale, causal, window_left,
                            window_right, softcap, rotary_interleaved, num_splits, return_lse, backend)
    return _kvcache_core(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                         cache_leftpad, block_table, alibi_slopes, None, None, 0, 0, softmax_scale, causal,
                         window_left, window_right, softcap, rotary_interleaved, num_splits, False, backend, False,
                         shapes, True)


def with_kvcache_read_out(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                          alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                          window_left, window_right, softcap, num_splits, return_lse, backend, shapes=None):
    """with_kvcache(False, ...) for a caller that drops the LSE unless it asked for it, as with_kvcache_append_out."""
    if return_lse or _is_compiling():
        return with_kvcache(False, q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                            alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                            causal, window_left, window_right, softcap, num_splits, return_lse, backend)
    return _kvcache_core(q, k_cache, v_cache, None, None, None, None, cache_seqlens, cache_batch_idx, cache_leftpad,
                         block_table, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                         softmax_scale, causal, window_left, window_right, softcap, False, num_splits, False, backend,
                         False, shapes, True)


# cache_seqlens given as an int: an int32 [batch] tensor, cached per (value, batch, device, stream) so that a
# decode loop does not allocate one per call (read-only: the library never writes it).
_SEQLENS: dict = {}


def seqlens_tensor(value: int, batch: int, device: torch.device) -> torch.Tensor:
    if torch.compiler.is_compiling():
        return torch.full((batch,), value, dtype=torch.int32, device=device)
    key = (value, batch, device, _stream(device))
    t = _SEQLENS.get(key)
    if t is None:
        t = torch.full((batch,), value, dtype=torch.int32, device=device)
        if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
            if len(_SEQLENS) >= 1024:
                _SEQLENS.clear()
            _SEQLENS[key] = t
    return t
