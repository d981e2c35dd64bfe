"""Dropout's random numbers in pure torch: the keep mask every flashattn path applies.

A vectorized Philox4x32-10 (src/common/philox.h) and the unit map of src/common/dropout.h, so
Python can rebuild the exact mask a call used from its seed and offset (for
return_attn_probs=True, and for tests). uint32 arithmetic is emulated in int64 tensors: every
intermediate stays below 2^63 (a 32 x 32-bit product is formed from two 32 x 16-bit halves), so
nothing relies on integer overflow.

The policy (flashattn.h, "Dropout"): entry (b, h, i, j) of P is kept iff its 16-bit random number
r >= t, t = round(p * 65536) clamped to [1, 65535] (p as float32, rounded half away from zero);
kept entries are scaled by 65536 / (65536 - t). r comes from Philox keyed by the 64-bit seed, with
counter {unit column, unit row, stream low 32 bits, stream high 32 bits}, stream = offset +
b * nheads_q + h, and each Philox output feeds the 8-element unit {i0, i0 + 8} x {j0, j0 + 1,
j0 + 8, j0 + 9}: 16-bit lane l of the 128 output bits (word l // 2, half l % 2) belongs to the
entry with (i >> 3) & 1 = l // 4, (j >> 3) & 1 = (l // 2) % 2, j & 1 = l % 2.
"""

from __future__ import annotations

import math
from typing import Tuple, Union

import torch

__all__ = ["philox4x32_10", "to_float32", "threshold", "keep_scale", "effective_p", "seed_offset", "keep_mask"]

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
_PHILOX_M0, _PHILOX_M1 = 0xD2511F53, 0xCD9E8D57  # round multipliers
_PHILOX_W0, _PHILOX_W1 = 0x9E3779B9, 0xBB67AE85  # key schedule (Weyl) increments

IntLike = Union[int, torch.Tensor]


def _mul32(c: torch.Tensor, m: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit words of c * m for c: int64 tensor of uint32 values, m: a uint32 constant."""
    m_lo, m_hi = m & 0xFFFF, m >> 16
    p_lo = c * m_lo  # < 2^48
    p_hi = c * m_hi  # < 2^48; c * m = p_hi * 2^16 + p_lo
    lo = (((p_hi & 0xFFFF) << 16) + p_lo) & _M32
    hi = (p_hi + (p_lo >> 16)) >> 16
    return hi, lo


def philox4x32_10(c0: IntLike, c1: IntLike, c2: IntLike, c3: IntLike, k0: IntLike, k1: IntLike):
    """Philox4x32-10 on uint32 values held in int64 tensors (or Python ints), broadcast together.
    Returns the 4 output words as int64 tensors of uint32 values."""
    ts = [x for x in (c0, c1, c2, c3, k0, k1) if isinstance(x, torch.Tensor)]
    device = ts[0].device if ts else "cpu"

    def t(x):
        if isinstance(x, torch.Tensor):
            return x.to(torch.int64) & _M32
        return torch.tensor(int(x) & _M32, dtype=torch.int64, device=device)

    c0, c1, c2, c3, k0, k1 = (t(x) for x in (c0, c1, c2, c3, k0, k1))
    for _ in range(10):
        hi0, lo0 = _mul32(c0, _PHILOX_M0)
        hi1, lo1 = _mul32(c2, _PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + _PHILOX_W0) & _M32
        k1 = (k1 + _PHILOX_W1) & _M32
    return c0, c1, c2, c3


def to_float32(x: float) -> float:
    """x rounded to the nearest float32 (ties to even), as C's float(x), for |x| below float32's max.
    Plain float arithmetic, so torch.compile folds it to a constant."""
    x = float(x)
    if x == 0.0 or not math.isfinite(x):
        return x
    m, e = math.frexp(x)  # x = m * 2^e, 0.5 <= |m| < 1
    if e < -125:  # float32 subnormals: a fixed quantum of 2^-149
        return math.ldexp(round(math.ldexp(x, 149)), -149)
    return math.ldexp(round(math.ldexp(m, 24)), e - 24)  # round(): ties to even, as the conversion


def threshold(dropout_p: float) -> int:
    """The 16-bit drop threshold t of Dropout::make (0 = no dropout): round(p * 65536) of p as float32,
    half away from zero, clamped to [1, 65535]."""
    p = to_float32(dropout_p)
    if not p > 0.0:
        return 0
    t = math.floor(p * 65536.0 + 0.5)  # p * 65536 is exact in double (a float32 times 2^16)
    return min(max(t, 1), 65535)


def effective_p(dropout_p: float) -> float:
    """The drop probability applied for dropout_p: threshold / 65536."""
    return threshold(dropout_p) / 65536.0


def keep_scale(dropout_p: float) -> float:
    """The factor kept entries are scaled by, as the library's float32: 65536 / (65536 - t)."""
    t = threshold(dropout_p)
    return to_float32(65536.0 / (65536 - t))


def seed_offset(rng_state: torch.Tensor) -> Tuple[int, int]:
    """(seed, offset) as Python uint64 from the int64 [2] rng state a call used."""
    s, o = (int(x) & _M64 for x in rng_state.detach().cpu().tolist())
    return s, o


def _as_int64(x: IntLike, device) -> torch.Tensor:
    """A uint64 (Python int, any value) or an int64 tensor (its bits) as a 0-d int64 tensor on device."""
    if isinstance(x, torch.Tensor):
        return x.to(device=device, dtype=torch.int64).reshape(())
    x = int(x) & _M64
    return torch.tensor(x - (1 << 64) if x >= (1 << 63) else x, dtype=torch.int64, device=device)


def random16(seed: IntLike, offset: IntLike, batch: int, nheads_q: int, seqlen_q: int, seqlen_k: int,
             device="cpu") -> torch.Tensor:
    """The 16-bit random numbers r [batch, nheads_q, seqlen_q, seqlen_k] (int64) of every entry.
    seed and offset: uint64 Python ints or int64 tensors holding their bits (no host sync then)."""
    device = torch.device(device)
    shape = (batch, nheads_q, seqlen_q, seqlen_k)
    if 0 in shape:
        return torch.zeros(shape, dtype=torch.int64, device=device)
    seed = _as_int64(seed, device)
    offset = _as_int64(offset, device)
    k0, k1 = seed & _M32, (seed >> 32) & _M32  # >> is arithmetic; the mask keeps the bits
    # stream = offset + b * nheads_q + h (mod 2^64), split into 32-bit words with the carry.
    idx = torch.arange(batch * nheads_q, dtype=torch.int64, device=device).view(batch, nheads_q, 1, 1)
    lo = (offset & _M32) + idx
    c2 = lo & _M32
    c3 = (((offset >> 32) & _M32) + (lo >> 32)) & _M32
    # Philox once per unit (the unit rows / columns the entries use), in chunks of (b, h) streams
    # so the int64 temporaries stay bounded.
    i = torch.arange(seqlen_q, dtype=torch.int64, device=device)
    j = torch.arange(seqlen_k, dtype=torch.int64, device=device)
    urow = (i >> 4) * 8 + (i & 7)
    ucol = (j >> 4) * 4 + ((j & 7) >> 1)
    # Unit rows / columns in use, from the last 16-block (no host sync, no graph break).
    lq, lk = (seqlen_q - 1) >> 4, (seqlen_k - 1) >> 4
    n_urow = lq * 8 + min(7, seqlen_q - 1 - 16 * lq) + 1
    n_ucol = lk * 4 + (min(7, seqlen_k - 1 - 16 * lk) >> 1) + 1
    ur = torch.arange(n_urow, dtype=torch.int64, device=device).view(1, n_urow, 1)
    uc = torch.arange(n_ucol, dtype=torch.int64, device=device).view(1, 1, n_ucol)
    lane = ((i[:, None] >> 3) & 1) * 4 + ((j[None, :] >> 3) & 1) * 2 + (j[None, :] & 1)  # [sq, sk]
    shift = (lane & 1) * 16
    c2, c3 = c2.reshape(-1, 1, 1), c3.reshape(-1, 1, 1)
    streams = batch * nheads_q
    step = max(1, (1 << 22) // (n_urow * n_ucol))
    out = []
    for s0 in range(0, streams, step):
        sl = slice(s0, min(streams, s0 + step))
        words = torch.stack(philox4x32_10(uc, ur, c2[sl], c3[sl], k0, k1), dim=-1)  # [n, n_urow, n_ucol, 4]
        words = words.expand(c2[sl].shape[0], n_urow, n_ucol, 4)
        w = words[:, urow[:, None], ucol[None, :], lane >> 1]  # [n, sq, sk]
        out.append((w >> shift) & 0xFFFF)
    return torch.cat(out, 0).view(shape)


def keep_mask(seed: IntLike, offset: IntLike, batch: int, nheads_q: int, seqlen_q: int, seqlen_k: int,
              dropout_p: float, device="cpu") -> torch.Tensor:
    """bool [batch, nheads_q, seqlen_q, seqlen_k]: True where the library keeps P (fixed-length layout;
    for varlen sequence b, take [b, :, :len_q, :len_k] of the mask built with the sequence count as
    batch and the max lengths). All True when dropout_p is 0."""
    t = threshold(dropout_p)
    if t == 0:
        return torch.ones(batch, nheads_q, seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    return random16(seed, offset, batch, nheads_q, seqlen_q, seqlen_k, device) >= t
