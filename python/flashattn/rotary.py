"""Rotary position embedding with flash_attn 2.x's `flash_attn.layers.rotary.apply_rotary_emb` API.

Pure torch (flash_attn uses a Triton kernel): correct on any device and differentiable through
autograd, not fused. Computed in float32 (float64 for float64 input), as the kernel does, and
returned in x's dtype.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

__all__ = ["apply_rotary_emb", "apply_rotary_emb_func"]


def _positions(x: torch.Tensor, seqlen_offsets, cu_seqlens, max_seqlen, seqlen_ro: int) -> torch.Tensor:
    """Rotary table row of every token: (batch, seqlen) fixed length, (total,) varlen."""
    dev = x.device
    if cu_seqlens is None:
        batch, seqlen = x.shape[0], x.shape[1]
        pos = torch.arange(seqlen, device=dev).expand(batch, seqlen)
    else:
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 \
                or cu_seqlens.is_floating_point():
            raise ValueError("flashattn: cu_seqlens must be a 1-D integer tensor of batch + 1 >= 2 entries")
        if max_seqlen is None:
            raise ValueError("flashattn: max_seqlen must be given with cu_seqlens (as flash_attn requires)")
        cu = cu_seqlens.to(device=dev, dtype=torch.long)
        batch, total = cu.numel() - 1, x.shape[0]
        if int(cu[-1]) > total:
            raise ValueError(f"flashattn: cu_seqlens[-1] = {int(cu[-1])} exceeds x's {total} rows")
        lengths = cu[1:] - cu[:-1]
        if int(lengths.max()) > int(max_seqlen):
            raise ValueError(f"flashattn: max_seqlen={max_seqlen} is less than the longest sequence in "
                             f"cu_seqlens ({int(lengths.max())})")
        # Rows past cu_seqlens[-1] belong to no sequence: they pass through unrotated (position -1).
        row = torch.arange(total, device=dev)
        seq = torch.searchsorted(cu[1:], row, right=True).clamp(max=batch - 1)
        pos = torch.where(row < cu[-1], row - cu[seq], torch.full_like(row, -1))
    if isinstance(seqlen_offsets, torch.Tensor):
        if seqlen_offsets.shape != (batch,) or seqlen_offsets.is_floating_point():
            raise ValueError(f"flashattn: seqlen_offsets must be an int or an integer tensor of shape (batch,) = "
                             f"({batch},), got {seqlen_offsets.dtype} of shape {tuple(seqlen_offsets.shape)}")
        off = seqlen_offsets.to(device=dev, dtype=torch.long)
        off = off[:, None] if cu_seqlens is None else off[seq]
    else:
        off = int(seqlen_offsets)
    valid = pos >= 0
    pos = torch.where(valid, pos + off, pos)
    if valid.any() and (int(pos[valid].min()) < 0 or int(pos[valid].max()) >= seqlen_ro):
        raise ValueError(f"flashattn: seqlen_offsets + position reaches row {int(pos[valid].max())} (or below 0), "
                         f"outside cos/sin's {seqlen_ro} rows")
    return pos


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x (..., rotary_dim) rotated by cos/sin (..., rotary_dim / 2), broadcast over heads."""
    if not interleaved:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def apply_rotary_emb(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool = False,
    inplace: bool = False,
    seqlen_offsets: Union[int, torch.Tensor] = 0,
    cu_seqlens: Optional[torch.Tensor] = None,
    max_seqlen: Optional[int] = None,
) -> torch.Tensor:
    """Rotates the first rotary_dim = 2 * cos.shape[-1] channels of x; the rest pass through.

    x: (batch, seqlen, nheads, headdim), or (total, nheads, headdim) with cu_seqlens (batch + 1,)
    and max_seqlen. cos, sin: (seqlen_ro, rotary_dim / 2). interleaved: rotate pairs (0, 1), (2, 3),
    ... (GPT-J) instead of halves (GPT-NeoX). seqlen_offsets: int or (batch,) tensor; token i of
    sequence b uses row i + offset[b] of cos/sin (decoding with a KV cache). inplace: write into x
    and return it.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"flashattn: x must be a torch.Tensor, got {type(x).__name__}")
    want = 4 if cu_seqlens is None else 3
    if x.dim() != want:
        layout = "(batch, seqlen, nheads, headdim)" if want == 4 else "(total, nheads, headdim) with cu_seqlens"
        raise ValueError(f"flashattn: x must be {want}-D {layout}, got shape {tuple(x.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"flashattn: {name} must be a 2-D tensor (seqlen_ro, rotary_dim / 2)")
    if cos.shape != sin.shape:
        raise ValueError(f"flashattn: cos and sin must have the same shape, got {tuple(cos.shape)} and "
                         f"{tuple(sin.shape)}")
    seqlen_ro, half = cos.shape
    rotary_dim = 2 * half
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"flashattn: rotary_dim = 2 * cos.shape[-1] = {rotary_dim} exceeds headdim {x.shape[-1]}")
    pos = _positions(x, seqlen_offsets, cu_seqlens, max_seqlen, seqlen_ro)

    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    # A row of cos = 1, sin = 0 (index seqlen_ro) leaves unowned varlen rows unchanged.
    cos_t = torch.cat((cos.to(x.device, compute), cos.new_ones((1, half), device=x.device, dtype=compute)))
    sin_t = torch.cat((sin.to(x.device, compute), sin.new_zeros((1, half), device=x.device, dtype=compute)))
    pos = torch.where(pos >= 0, pos, torch.full_like(pos, seqlen_ro))
    c = cos_t[pos].unsqueeze(-2)  # broadcast over heads
    s = sin_t[pos].unsqueeze(-2)
    rotated = _rotate(x[..., :rotary_dim].to(compute), c, s, interleaved).to(x.dtype)
    if inplace:
        x[..., :rotary_dim] = rotated
        return x
    if rotary_dim == x.shape[-1]:
        return rotated
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


# flash_attn's older name for the same function.
apply_rotary_emb_func = apply_rotary_emb
