"""Context parallelism: ring attention over torch.distributed (NCCL on GPUs, gloo on CPU tensors).

Every rank of `group` holds one slice of the sequence (see `shard`) and calls the same function with
its local q, k, v. K/V blocks travel around the ring (rank r sends to r+1, receives from r-1) with
batched P2P (`batch_isend_irecv`), issued before the attention of the block in hand so the transfer
overlaps it; partial (out, lse) pairs are merged with an LSE-weighted sum. The backward rotates K/V
again, and the dK/dV accumulators travel with them, each visiting every rank once and ending at its
owner.

Sharding is zigzag: the global sequence is cut into 2W chunks and rank r holds chunks r and 2W-1-r
(in that order). With causal attention every rank then does the same work at every step: step 0 is
the own block (causal), and every other step is one full (non-causal) rectangle of half the block
area: all of q against the first half of K/V from an earlier rank, or the second half of q against
all of K/V from a later rank. The same scheme is used without causal (it costs nothing there), so
`shard`/`unshard` have one layout.

See docs/context-parallel.md for the design, scaling past one host and the per-hop
compute/communication ratio.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from .. import _lib
from .. import _ops  # noqa: F401  (registers torch.ops.flashattn.*)
from .. import interface as _itf

__all__ = [
    "ring_flash_attn_func",
    "ring_flash_attn_varlen_func",
    "shard",
    "unshard",
    "shard_varlen",
    "unshard_varlen",
]

def _backend_auto():
    return _lib.backend_id("auto")


def _bwd_backend(device):
    """The backward must compute P from the *given* (global) LSE and D from the global O. Every
    backend does: the GPU paths and the cpu backend (float32 LSE), and the reference backend, which
    "auto" picks for float64 CPU inputs, whenever its LSE is float64 (lse_fp64)."""
    return _lib.backend_id("auto")


# ---- group helpers ------------------------------------------------------------------------------


def _world(group):
    if not dist.is_available() or not dist.is_initialized():
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def _global_rank(group, rank):
    # P2POp takes global ranks; the ring is defined on the group's ranks.
    return rank if group is None else dist.get_global_rank(group, rank)


class _Ring:
    """Rank r sends to r+1 and receives from r-1. With NCCL the ops run on NCCL's own stream (the
    side stream): issuing them makes that stream wait for the current stream's work so far (the
    buffer being sent is ready), the attention launched afterwards runs beside the transfer, and
    `wait()` makes the current stream (not the host) wait for the received block. ProcessGroupNCCL
    keeps the tensors alive until its stream is done with them (no record_stream needed here). With
    gloo the ops are asynchronous host transfers."""

    def __init__(self, group, world, rank):
        self.group = group
        self.next = _global_rank(group, (rank + 1) % world)
        self.prev = _global_rank(group, (rank - 1) % world)

    def start(self, tensors):
        """Sends `tensors` to the next rank and receives same-shaped ones from the previous rank.
        Returns (received tensors, pending work)."""
        recv = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in recv]
        return recv, dist.batch_isend_irecv(ops)

    @staticmethod
    def wait(works):
        for w in works:
            w.wait()


# ---- zigzag sharding ------------------------------------------------------------------------------


def _zigzag_chunks(n, world, what):
    if n % (2 * world) != 0:
        raise ValueError(f"flashattn.distributed: {what} ({n}) must be divisible by 2 * world_size "
                         f"({2 * world}) for zigzag sharding")
    return n // (2 * world)


def shard(x: Tensor, group=None, dim: int = 1) -> Tensor:
    """This rank's zigzag slice of a global tensor `x` (the same on every rank): of 2W equal chunks
    along `dim`, rank r keeps chunks r and 2W-1-r, concatenated. The sequence length must be
    divisible by 2W (ValueError otherwise). Returns a contiguous tensor."""
    world, rank = _world(group)
    c = _zigzag_chunks(x.shape[dim], world, f"x.shape[{dim}] (the sequence length)")
    return torch.cat([x.narrow(dim, rank * c, c), x.narrow(dim, (2 * world - 1 - rank) * c, c)], dim=dim)


def unshard(x_local: Tensor, group=None, dim: int = 1) -> Tensor:
    """Inverse of `shard`: all-gathers the local slices and puts the chunks back in sequence order
    (every rank gets the global tensor). Not differentiable."""
    world, _ = _world(group)
    if world == 1:
        return x_local
    if x_local.shape[dim] % 2 != 0:
        raise ValueError(f"flashattn.distributed: x_local.shape[{dim}] ({x_local.shape[dim]}) must be even "
                         "(two zigzag chunks)")
    x_local = x_local.contiguous()
    parts = [torch.empty_like(x_local) for _ in range(world)]
    dist.all_gather(parts, x_local, group=group)
    c = x_local.shape[dim] // 2
    firsts = [p.narrow(dim, 0, c) for p in parts]
    seconds = [p.narrow(dim, c, c) for p in parts]
    return torch.cat(firsts + seconds[::-1], dim=dim)


def _varlen_lengths(cu_seqlens, world):
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    for i, n in enumerate(lens):
        _zigzag_chunks(n, world, f"sequence {i}'s length in cu_seqlens")
    return lens


def shard_varlen(x: Tensor, cu_seqlens: Tensor, group=None) -> Tensor:
    """Zigzag slice of packed [total, ...] `x` (global, cu_seqlens describing its sequences): every
    sequence is sharded as `shard` does, and the local slices are packed in order. Every sequence
    length must be divisible by 2W."""
    world, rank = _world(group)
    out = []
    starts = cu_seqlens[:-1].tolist()
    for start, n in zip(starts, _varlen_lengths(cu_seqlens, world)):
        out.append(shard(x.narrow(0, start, n), group, dim=0))
    return torch.cat(out, dim=0)


def unshard_varlen(x_local: Tensor, cu_seqlens: Tensor, group=None) -> Tensor:
    """Inverse of `shard_varlen` (cu_seqlens is the global one): every rank gets the packed global tensor."""
    world, _ = _world(group)
    lens = _varlen_lengths(cu_seqlens, world)
    # Gather the packed local slices, then rebuild every sequence from its W local pieces.
    x_local = x_local.contiguous()
    parts = [torch.empty_like(x_local) for _ in range(world)] if world > 1 else [x_local]
    if world > 1:
        dist.all_gather(parts, x_local, group=group)
    out, off = [], 0
    for n in lens:
        m = n // world
        pieces = [p.narrow(0, off, m) for p in parts]
        c = m // 2
        out.append(torch.cat([p.narrow(0, 0, c) for p in pieces] + [p.narrow(0, c, c) for p in pieces][::-1]))
        off += m
    return torch.cat(out, dim=0)


# ---- the sub-block layout: fixed length (views) or varlen (index gathers) ---------------------


class _Fixed:
    """q/k/v [b, s_local, h, d], LSE [b, h, s_local]; halves are views."""

    varlen = False

    def __init__(self, s_local):
        self.n = s_local
        self.h = s_local // 2

    def half(self, t, which):  # rows of the first (0) or second (1) zigzag chunk
        return t.narrow(1, which * self.h, self.h)

    def lse_half(self, lse, which):
        return lse.narrow(2, which * self.h, self.h)

    def add_half(self, acc, part, which):
        acc.narrow(1, which * self.h, self.h).add_(part)

    def set_half(self, acc, part, which):
        acc.narrow(1, which * self.h, self.h).copy_(part)

    def set_lse_half(self, acc, part, which):
        acc.narrow(2, which * self.h, self.h).copy_(part)

    def cu(self, full_q, full_k):  # (cu_q, cu_k, max_q, max_k) for the call
        return None, None, 0, 0


class _Varlen:
    """Packed q/k/v [total_local, h, d], LSE [h, total_local]; halves are gathered by index."""

    varlen = True

    def __init__(self, cu_global, max_seqlen, world):
        lens = _varlen_lengths(cu_global, world)
        dev = cu_global.device
        self.cu_full = (cu_global // world).to(torch.int32)
        self.cu_half = (cu_global // (2 * world)).to(torch.int32)
        self.max_full = max(lens) // world if lens else 0
        self.max_half = self.max_full // 2
        first, second, off = [], [], 0
        for n in lens:
            c = n // (2 * world)
            first.append(torch.arange(off, off + c))
            second.append(torch.arange(off + c, off + 2 * c))
            off += 2 * c
        self.n = off
        self.idx = [torch.cat(first).to(dev) if first else torch.empty(0, dtype=torch.long, device=dev),
                    torch.cat(second).to(dev) if second else torch.empty(0, dtype=torch.long, device=dev)]

    def half(self, t, which):
        return t.index_select(0, self.idx[which])

    def lse_half(self, lse, which):
        return lse.index_select(1, self.idx[which]).contiguous()

    # index_add_/index_copy_ need one dtype (the views' add_/copy_ in _Fixed convert): the GPU
    # kernels' 16-bit gradients go into fp32 accumulators.
    def add_half(self, acc, part, which):
        acc.index_add_(0, self.idx[which], part.to(acc.dtype))

    def set_half(self, acc, part, which):
        acc.index_copy_(0, self.idx[which], part.to(acc.dtype))

    def set_lse_half(self, acc, part, which):
        acc.index_copy_(1, self.idx[which], part.to(acc.dtype))

    def cu(self, full_q, full_k):
        cq, mq = (self.cu_full, self.max_full) if full_q else (self.cu_half, self.max_half)
        ck, mk = (self.cu_full, self.max_full) if full_k else (self.cu_half, self.max_half)
        return cq, ck, mq, mk


def _lse_rows_last(lse, layout):
    """LSE with the sequence as its last dim, as out's rows: [b, h, s] -> [b, s, h, 1]; [h, t] -> [t, h, 1]."""
    return (lse.transpose(1, 2) if not layout.varlen else lse.transpose(0, 1)).unsqueeze(-1)


def _merge(out_a, lse_a, out_b, lse_b, layout):
    """(out, lse) of the union of two key sets from the two partial results, in the accumulation
    dtype. Rows with no visible key have lse -inf on a side: that side gets weight 0, and a row
    with -inf on both sides stays (0, -inf), never NaN."""
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    wa = torch.exp(lse_a - m)
    wb = torch.exp(lse_b - m)
    s = wa + wb
    lse = m + torch.log(s)
    s = torch.where(s == 0, torch.ones_like(s), s)
    ra = _lse_rows_last(wa / s, layout)
    rb = _lse_rows_last(wb / s, layout)
    return out_a * ra + out_b.to(out_a.dtype) * rb, lse


# ---- forward / backward of the ring ----------------------------------------------------------------


def _acc_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _fwd_call(q, k, v, layout, full_q, full_k, causal, args):
    scale, softcap, deterministic = args
    cq, ck, mq, mk = layout.cu(full_q, full_k)
    return torch.ops.flashattn.fwd(q, k, v, cq, ck, mq, mk, scale, causal, -1, 0 if causal else -1, softcap,
                                   deterministic, _backend_auto())


def _bwd_call(dout, q, k, v, out, lse, layout, full_q, full_k, causal, args):
    scale, softcap, deterministic = args
    cq, ck, mq, mk = layout.cu(full_q, full_k)
    return torch.ops.flashattn.bwd(dout, q, k, v, out, lse, cq, ck, mq, mk, scale, causal, -1,
                                   0 if causal else -1, softcap, deterministic, _bwd_backend(q.device))


def _step_kind(step, rank, world, causal):
    """Which sub-block rank `rank` computes at `step` (K/V from rank (rank - step) mod W):
    "own" (step 0: the local block, causal if causal), "full" (non-causal: everything),
    "k_first" (all q vs the first chunk of an earlier rank's K/V), "q_second" (the second chunk of
    q vs all of a later rank's K/V). Local rows are in global order within a rank, and our causal is
    aligned bottom-right, which for equal q/k lengths is the plain diagonal: so "own" is one causal call."""
    if step == 0:
        return "own"
    if not causal:
        return "full"
    return "k_first" if step <= rank else "q_second"


def _ring_forward(q, k, v, layout, group, world, rank, causal, args):
    ring = _Ring(group, world, rank)
    acc = _acc_dtype(q.dtype)
    kv = [k.contiguous(), v.contiguous()]
    out = lse = None
    for step in range(world):
        pending = None
        if step + 1 < world:
            nxt, pending = ring.start(kv)  # overlaps the attention below
        kind = _step_kind(step, rank, world, causal)
        kb, vb = kv
        if kind in ("own", "full"):
            o, l = _fwd_call(q, kb, vb, layout, True, True, kind == "own" and causal, args)
            if out is None:
                lse_dtype = l.dtype  # what the backward op takes back
                out, lse = o.to(acc), l.to(acc)
            else:
                out, lse = _merge(out, lse, o, l, layout)
        elif kind == "k_first":
            o, l = _fwd_call(q, layout.half(kb, 0), layout.half(vb, 0), layout, True, False, False, args)
            out, lse = _merge(out, lse, o, l, layout)
        else:  # q_second
            o, l = _fwd_call(layout.half(q, 1), kb, vb, layout, False, True, False, args)
            o2, l2 = _merge(layout.half(out, 1), layout.lse_half(lse, 1), o, l, layout)
            layout.set_half(out, o2, 1)
            layout.set_lse_half(lse, l2, 1)
        if pending is not None:
            _Ring.wait(pending)
            kv = nxt
    return out, lse.to(lse_dtype)


def _ring_backward(dout, q, k, v, out, lse, layout, group, world, rank, causal, args):
    ring = _Ring(group, world, rank)
    acc = _acc_dtype(q.dtype)
    kv = [k.contiguous(), v.contiguous()]
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dkv_pending = dkv_recv = None
    for step in range(world):
        kv_pending = None
        if step + 1 < world:
            nxt, kv_pending = ring.start(kv)
        kind = _step_kind(step, rank, world, causal)
        kb, vb = kv
        if kind in ("own", "full"):
            dq_i, dk_i, dv_i = _bwd_call(dout, q, kb, vb, out, lse, layout, True, True, kind == "own" and causal, args)
            dq.add_(dq_i)
            half_k = False
        elif kind == "k_first":
            dq_i, dk_i, dv_i = _bwd_call(dout, q, layout.half(kb, 0), layout.half(vb, 0), out, lse, layout, True,
                                         False, False, args)
            dq.add_(dq_i)
            half_k = True
        else:  # q_second
            dq_i, dk_i, dv_i = _bwd_call(layout.half(dout, 1), layout.half(q, 1), kb, vb, layout.half(out, 1),
                                         layout.lse_half(lse, 1), layout, False, True, False, args)
            layout.add_half(dq, dq_i, 1)
            half_k = False
        # The dK/dV accumulator of this K/V block arrives from the previous rank (sent after its
        # step - 1, so the transfer ran beside the attention above); add ours and pass it on.
        if step == 0:
            dk = torch.zeros(k.shape, dtype=acc, device=k.device)
            dv = torch.zeros(v.shape, dtype=acc, device=v.device)
        else:
            _Ring.wait(dkv_pending)
            dk, dv = dkv_recv
        if half_k:
            layout.add_half(dk, dk_i, 0)
            layout.add_half(dv, dv_i, 0)
        else:
            dk.add_(dk_i)
            dv.add_(dv_i)
        # After the last step this send delivers every block's accumulator to its owner. That hop
        # has no attention beside it, so it goes in the inputs' dtype: the owner rounds to it anyway
        # (the same rounding on either side), and 16-bit halves the exposed transfer.
        if step + 1 == world:
            dk, dv = dk.to(k.dtype), dv.to(v.dtype)
        dkv_recv, dkv_pending = ring.start([dk, dv])
        if kv_pending is not None:
            _Ring.wait(kv_pending)
            kv = nxt
    _Ring.wait(dkv_pending)
    dk, dv = dkv_recv
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, layout, group, world, rank, causal, args):
        out, lse = _ring_forward(q, k, v, layout, group, world, rank, causal, args)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.meta = (layout, group, world, rank, causal, args)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(dout.contiguous(), q, k, v, out, lse, *ctx.meta)
        return dq, dk, dv, None, None, None, None, None, None


# ---- checks -----------------------------------------------------------------------------------------

_DTYPE_CODE = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3, torch.float64: 4}
_FIELDS = ("batch/total", "seqlen_local", "nheads_q", "nheads_k", "headdim", "dtype", "seqlen_local_k",
           "causal", "softmax_scale*1e6", "softcap*1e6", "varlen batch")


def _check_across_ranks(group, world, rank, q, k, causal, scale, softcap, nseq):
    """One small all_gather of this call's signature: a rank whose shapes or options differ from
    the others would otherwise hang or exchange wrong-sized blocks. Raises on every rank, naming the
    field and the ranks. FLASHATTN_RING_CHECK=0 skips it (it costs one tiny collective and, on
    CUDA, a host sync per call)."""
    if os.environ.get("FLASHATTN_RING_CHECK", "1") == "0":
        return
    if q.dim() == 4:
        sig = [q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], _DTYPE_CODE.get(q.dtype, 0), k.shape[1]]
    else:
        sig = [q.shape[0], q.shape[0], q.shape[1], k.shape[1], q.shape[2], _DTYPE_CODE.get(q.dtype, 0), k.shape[0]]
    sig += [int(causal), round(scale * 1e6), round(softcap * 1e6), nseq]
    dev = q.device if q.device.type == "cuda" else torch.device("cpu")
    mine = torch.tensor(sig, dtype=torch.int64, device=dev)
    allsig = torch.empty(world, len(sig), dtype=torch.int64, device=dev)
    dist.all_gather_into_tensor(allsig, mine, group=group) if dev.type == "cuda" else \
        dist.all_gather(list(allsig.unbind(0)), mine, group=group)
    rows = allsig.tolist()
    for j, name in enumerate(_FIELDS):
        vals = [r[j] for r in rows]
        if len(set(vals)) != 1:
            raise ValueError(f"flashattn.distributed: {name} differs across the ranks of the group "
                             f"(rank -> value: {dict(enumerate(vals))}; this is rank {rank}): every rank must pass "
                             "same-shaped local slices and the same options")


def _check_options(window_size, causal, softcap, softmax_scale, d):
    left, right = _itf._check_window(window_size)
    if causal:
        right = 0
    if left != -1 or right not in (-1, 0) or (right == 0 and not causal):
        raise NotImplementedError(
            f"flashattn.distributed: window_size={tuple(window_size)!r}: sliding-window attention is not "
            "implemented for ring attention (use window_size=(-1, -1), with causal=True for causal)")
    if softcap is None:
        softcap = 0.0
    if softcap < 0:
        raise ValueError(f"flashattn.distributed: softcap={softcap} must be >= 0 (0 = off)")
    return _itf._check_softmax_scale(softmax_scale, d), float(softcap)


def ring_flash_attn_func(q: Tensor, k: Tensor, v: Tensor, group=None, causal: bool = False,
                         window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                         softmax_scale: Optional[float] = None, deterministic: bool = False,
                         return_attn_probs: bool = False):
    """Ring attention over the ranks of `group` (default: the default group).

    q [b, s_local, h, d], k/v [b, s_local, h_k, d] are this rank's zigzag slices (`shard`) of the
    global sequence; the result is this rank's slice of the global attention output (`unshard`
    gathers it). GQA (h a multiple of h_k), softcap and softmax_scale as flash_attn_func. The LSE
    returned with return_attn_probs=True ([b, h, s_local], the ops' LSE dtype) is the global one. With one
    rank (or no process group) it is the plain flash_attn_func call. deterministic=True: the ring
    order is fixed already, and the kernels' deterministic backward is used.
    """
    world, rank = _world(group)
    if world == 1:
        return _itf.flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                                    softcap=softcap, deterministic=deterministic, return_attn_probs=return_attn_probs)
    _itf._check_inputs(q, k, v, 4)
    scale, softcap = _check_options(window_size, causal, softcap, softmax_scale, q.shape[-1])
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"flashattn.distributed: q and k must have the same local seqlen (got q: {q.shape[1]}, "
                         f"k: {k.shape[1]})")
    if causal and q.shape[1] % 2 != 0:
        raise ValueError(f"flashattn.distributed: the local seqlen ({q.shape[1]}) must be even with causal=True "
                         "(two zigzag chunks per rank: see shard())")
    _check_across_ranks(group, world, rank, q, k, causal, scale, softcap, 0)
    args = (scale, softcap, bool(deterministic))
    out, lse = _RingAttention.apply(q, k, v, _Fixed(q.shape[1]), group, world, rank, bool(causal), args)
    return (out, lse, None) if return_attn_probs else out


def ring_flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, group=None,
                                causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                                softmax_scale: Optional[float] = None, deterministic: bool = False,
                                return_attn_probs: bool = False):
    """Varlen ring attention: q/k/v packed [total_local, h, d] are this rank's `shard_varlen` slices;
    `cu_seqlens` (int32, the same on every rank) and `max_seqlen` describe the *global* sequences,
    each of a length divisible by 2 * world_size (ValueError otherwise). q and k share the sequences
    (self-attention). The result is this rank's packed slice of the output; the LSE
    (return_attn_probs=True) is [h, total_local]."""
    world, rank = _world(group)
    if world == 1:
        return _itf.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                           softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                                           softcap=softcap, deterministic=deterministic,
                                           return_attn_probs=return_attn_probs)
    _itf._check_inputs(q, k, v, 3)
    _itf._check_cu_seqlens(q, cu_seqlens, cu_seqlens)
    scale, softcap = _check_options(window_size, causal, softcap, softmax_scale, q.shape[-1])
    layout = _Varlen(cu_seqlens, max_seqlen, world)
    if q.shape[0] != layout.n or k.shape[0] != layout.n:
        raise ValueError(f"flashattn.distributed: q and k must have cu_seqlens[-1] / world_size = {layout.n} rows "
                         f"(this rank's shard_varlen slice), got q: {q.shape[0]}, k: {k.shape[0]}")
    _check_across_ranks(group, world, rank, q, k, causal, scale, softcap, cu_seqlens.numel() - 1)
    args = (scale, softcap, bool(deterministic))
    out, lse = _RingAttention.apply(q, k, v, layout, group, world, rank, bool(causal), args)
    return (out, lse, None) if return_attn_probs else out
