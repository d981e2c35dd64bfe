"""Dropout and ALiBi through the PyTorch front end (issue 18).

CPU part (runs in CI): the pure-torch Philox of flashattn._dropout against the Philox4x32-10
known answers and a scalar transcription of src/common/dropout.h; the library's own keep mask read
back through its output (q = 0, V = identity: O[i, j] != 0 iff entry (i, j) was kept) against
_dropout.keep_mask built from the seed the call drew from torch's generator; outputs and gradients
against a float64 torch attention with the same mask (the FlashAttention tolerance rule); the drop
rate; seeding; fp64 gradcheck; varlen; torch.compile; argument errors; the C ABI struct layout.

CUDA part: the same checks on every GPU path the library has for the device (skipped with the
library's NOT_SUPPORTED message where a path has no dropout/ALiBi yet), and a CUDA graph of
forward + backward with dropout whose replays draw fresh masks.
"""

import ctypes
import math
import platform

import pytest
import torch

import flashattn
from flashattn import (
    _dropout,
    _lib,
    _ops,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from flashattn.interface import _flash_attn
from ref import attention_ref, check, rand, varlen_ref

M32, M64 = 0xFFFFFFFF, (1 << 64) - 1


# ---- helpers --------------------------------------------------------------------------------------


def _philox_scalar(c, k):
    """Philox4x32-10 on Python ints, transcribed from src/common/philox.h (independent of _dropout)."""
    c0, c1, c2, c3 = c
    k0, k1 = k
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c3 ^ k1) & M32, p0 & M32
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


def _r16_scalar(seed, offset, b, nheads, h, i, j):
    """Dropout::keep's 16-bit number of entry (b, h, i, j), from src/common/dropout.h."""
    stream = (offset + b * nheads + h) & M64
    urow = (i >> 4) * 8 + (i & 7)
    ucol = (j >> 4) * 4 + ((j & 7) >> 1)
    r = _philox_scalar((ucol, urow, stream & M32, stream >> 32), (seed & M32, seed >> 32))
    lane = ((i >> 3) & 1) * 4 + ((j >> 3) & 1) * 2 + (j & 1)
    return (r[lane >> 1] >> ((lane & 1) * 16)) & 0xFFFF


def _drawn(seed):
    """(seed, offset) a call with dropout draws right after torch.manual_seed(seed) on CPU: the documented
    contract, torch.randint(-2**63, 2**63 - 1, (2,), int64) from the default generator."""
    torch.manual_seed(seed)
    return _dropout.seed_offset(torch.randint(-2**63, 2**63 - 1, (2,), dtype=torch.int64))


def _drawn_on(seed, device):
    torch.manual_seed(seed)
    return _dropout.seed_offset(torch.randint(-2**63, 2**63 - 1, (2,), dtype=torch.int64, device=device))


def _slopes(kind, b, h, device="cpu"):
    if kind is None:
        return None
    base = torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], dtype=torch.float32)
    if kind == "2d":
        base = base[None, :] * torch.linspace(0.5, 1.5, b)[:, None]
    return base.to(device)


def _call(*args, backend="auto", **kw):
    """_flash_attn; on CUDA tensors, skips (with the library's message) where a GPU path does not implement
    dropout/ALiBi yet. The host paths implement both: there a NotImplementedError fails the test."""
    try:
        return _flash_attn(*args, backend=backend, **kw)
    except NotImplementedError as e:
        if args[0].device.type == "cuda" and ("dropout" in str(e) or "alibi" in str(e).lower()):
            pytest.skip(f"{backend}: {e}")
        raise


def _library_keep(b, sq, sk, h, hk, p, seed, device="cpu", backend="auto", dtype=torch.float32, **kw):
    """The keep mask [b, h, sq, sk] a call applied, read from its output: q = 0 makes P uniform over the
    allowed keys, V = identity (head dim = sk) puts P_ij Z_ij / (1 - p) in column j of row i."""
    q = torch.zeros(b, sq, h, sk, dtype=dtype, device=device)
    k = torch.randn(b, sk, hk, sk, dtype=dtype, device=device)
    v = torch.eye(sk, dtype=dtype, device=device)[None, :, None, :].expand(b, sk, hk, sk).contiguous()
    torch.manual_seed(seed)
    out = _call(q, k, v, dropout_p=p, backend=backend, **kw)
    return out.permute(0, 2, 1, 3) != 0


# ---- Philox and the unit map (pure torch) ---------------------------------------------------------

KATS = [  # Random123's kat_vectors for philox4x32_10: counter, key -> output
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((M32,) * 4, (M32, M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def test_philox_known_answers():
    for c, k, want in KATS:
        assert tuple(int(x) for x in _dropout.philox4x32_10(*c, *k)) == want
        assert _philox_scalar(c, k) == want
    # Vectorized: all three at once, counters and keys as tensors.
    cols = [torch.tensor([kat[0][i] for kat in KATS]) for i in range(4)]
    keys = [torch.tensor([kat[1][i] for kat in KATS]) for i in range(2)]
    got = torch.stack(_dropout.philox4x32_10(*cols, *keys), 1).tolist()
    assert [tuple(r) for r in got] == [kat[2] for kat in KATS]


def test_to_float32_is_cs_float_conversion():
    import struct

    g = torch.Generator().manual_seed(0)
    xs = torch.rand(2000, generator=g, dtype=torch.float64).tolist() + [2.5 / 65536, 0.1, 1e-45, 3e-39, 1 - 1e-12]
    for x in xs:
        assert _dropout.to_float32(x) == struct.unpack("f", struct.pack("f", x))[0], x


def test_threshold_rounding_matches_dropout_make():
    # t = lround(double(float(p)) * 65536), clamped to [1, 65535]: half away from zero, p as float32.
    assert _dropout.threshold(0.0) == 0
    assert _dropout.threshold(0.1) == 6554  # 0.1f * 65536 = 6553.6001
    assert _dropout.threshold(2.5 / 65536) == 3  # a tie rounds away from zero (Python's round gives 2)
    assert _dropout.threshold(1e-9) == 1  # never rounds to "off"
    assert _dropout.threshold(0.99999999) == 65535  # nor to "drop everything"
    assert _dropout.effective_p(0.5) == 0.5
    assert _dropout.keep_scale(0.1) == pytest.approx(65536 / (65536 - 6554), rel=1e-7)


@pytest.mark.parametrize("seed,offset", [(0x0123456789ABCDEF, 0), (2**64 - 1, 2**32 - 3), (7, 2**64 - 5)],
                         ids=["plain", "offset_carry", "offset_wraps"])
def test_keep_mask_matches_dropout_h(seed, offset):
    b, h, sq, sk, p = 3, 5, 70, 90, 0.3
    t = _dropout.threshold(p)
    r = _dropout.random16(seed, offset, b, h, sq, sk)
    mask = _dropout.keep_mask(seed, offset, b, h, sq, sk, p)
    assert mask.shape == (b, h, sq, sk) and mask.dtype == torch.bool
    assert torch.equal(mask, r >= t)
    g = torch.Generator().manual_seed(1)
    idx = [torch.randint(0, n, (150,), generator=g).tolist() for n in (b, h, sq, sk)]
    idx = list(zip(*idx)) + [(b - 1, h - 1, sq - 1, sk - 1), (0, 0, 0, 0), (1, 2, 8, 9), (2, 4, 16, 17)]
    for bb, hh, i, j in idx:
        assert int(r[bb, hh, i, j]) == _r16_scalar(seed, offset, bb, h, hh, i, j), (bb, hh, i, j)
    # Tensor seed/offset (the int64 bits of the uint64s, as the rng state holds them): the same mask.
    signed = [x - 2**64 if x >= 2**63 else x for x in (seed, offset)]
    rng = torch.tensor(signed, dtype=torch.int64)
    assert _dropout.seed_offset(rng) == (seed, offset)
    assert torch.equal(_dropout.keep_mask(rng[0], rng[1], b, h, sq, sk, p), mask)
    # Sequence b is stream offset + b * h: a later batch entry is an earlier one with the offset advanced.
    assert torch.equal(_dropout.keep_mask(seed, (offset + 2 * h) & M64, 1, h, sq, sk, p)[0], mask[2])


# ---- the C ABI and the argument checks (no dropout kernel needed) ---------------------------------


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64") or ctypes.sizeof(ctypes.c_void_p) != 8,
                    reason="the layout numbers are x86-64's")
def test_abi_struct_layout():
    # FwdParams grew from 424 to 656 bytes with the inference fields (kv_cache at 424, num_splits at 648),
    # then to 696 with the FP8 scales (fp8 at 656), then to 704 with fp8_v_layout (at 696).
    assert ctypes.sizeof(_lib.FwdParams) == 704 and ctypes.sizeof(_lib.BwdParams) == 712
    assert _lib.FwdParams.dropout_seed.offset == 384 and _lib.BwdParams.dropout_seed.offset == 672
    assert _lib.FwdParams.kv_cache.offset == 424 and _lib.FwdParams.num_splits.offset == 648
    assert _lib.FwdParams.fp8.offset == 656 and ctypes.sizeof(_lib.Fp8Scales) == 40
    assert _lib.FwdParams.fp8_v_layout.offset == 696
    assert _lib.Fp8Scales.q_block_size.offset == 24 and _lib.Fp8Scales.out_dtype.offset == 32
    assert ctypes.sizeof(_lib.KvCache) == 224
    assert _lib.KvCache.k_new.offset == 48 and _lib.KvCache.rotary_cos.offset == 192
    for cls, tail in ((_lib.FwdParams, ["kv_cache", "num_splits", "fp8", "fp8_v_layout"]), (_lib.BwdParams, [])):
        names = [f[0] for f in cls._fields_]
        assert names[-6 - len(tail):] == ["lse_fp64", "dropout_seed", "dropout_offset", "dropout_rng_state",
                                          "alibi_slopes", "alibi_batch_stride"] + tail
    lib = _lib.load()
    assert lib.flashattn_fwd_params_init().struct_size == 704
    assert lib.flashattn_bwd_params_init().struct_size == 712


class _Recorder:
    """Stands in for the loaded library: records the dropout/ALiBi fields of every fwd/bwd call."""

    def __init__(self, lib):
        self._lib = lib
        self.seen = []

    def __getattr__(self, name):
        fn = getattr(self._lib, name)
        if name not in ("flashattn_fwd", "flashattn_bwd"):
            return fn

        def call(params, *rest):
            p = params._obj
            state = None
            if p.dropout_rng_state:
                state = tuple(ctypes.cast(p.dropout_rng_state, ctypes.POINTER(ctypes.c_uint64))[i] for i in range(2))
            self.seen.append(dict(fn=name, p=p.options.dropout_p, seed=p.dropout_seed, offset=p.dropout_offset,
                                  state_ptr=p.dropout_rng_state, state=state, alibi=p.alibi_slopes,
                                  alibi_stride=p.alibi_batch_stride))
            return fn(params, *rest)

        return call


@pytest.fixture
def recorder(monkeypatch):
    rec = _Recorder(_lib.load())
    monkeypatch.setattr(_ops._lib, "load", lambda: rec)
    return rec


def test_rng_and_alibi_reach_the_c_abi(recorder):
    """What the Python layer hands the library, whether or not a path implements it yet."""
    q, k, v = (rand(2, 24, 4, 32).requires_grad_() for _ in range(3))
    slopes = _slopes("2d", 2, 4)
    torch.manual_seed(99)
    flash_attn_func(q, k, v, dropout_p=0.25, alibi_slopes=slopes, causal=True).sum().backward()
    want = _drawn(99)
    fwd = recorder.seen[0]
    assert fwd["fn"] == "flashattn_fwd"
    assert fwd["p"] == pytest.approx(0.25) and fwd["seed"] == 0 and fwd["offset"] == 0
    assert fwd["state"] == want, "dropout_rng_state must hold torch.randint's {seed, offset}"
    assert fwd["alibi"] == slopes.data_ptr() and fwd["alibi_stride"] == 4
    bwd = recorder.seen[1]  # the backward: the same rng state and slopes
    assert bwd["fn"] == "flashattn_bwd" and bwd["state"] == want and bwd["p"] == pytest.approx(0.25)
    assert bwd["alibi"] == slopes.data_ptr() and bwd["alibi_stride"] == 4
    recorder.seen.clear()
    # [nheads] slopes: batch stride 0; no dropout: no rng state, and the generator is not advanced.
    flash_attn_func(q.detach(), k.detach(), v.detach(), alibi_slopes=slopes[0])
    rec = recorder.seen[0]
    assert rec["state_ptr"] is None and rec["p"] == 0.0 and rec["alibi_stride"] == 0
    recorder.seen.clear()
    # Plain calls keep the plain path: nothing set.
    flash_attn_func(q.detach(), k.detach(), v.detach())
    rec = recorder.seen[0]
    assert rec["state_ptr"] is None and rec["alibi"] is None and rec["p"] == 0.0


def test_no_dropout_draws_nothing():
    q = rand(1, 16, 2, 32)
    torch.manual_seed(3)
    flash_attn_func(q, q, q, alibi_slopes=_slopes("1d", 1, 2))
    after = torch.randint(0, 2**30, (4,))
    torch.manual_seed(3)
    assert torch.equal(after, torch.randint(0, 2**30, (4,))), "a call without dropout advanced torch's generator"


def test_bad_inputs_name_the_argument():
    q = rand(2, 8, 4, 32)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    for bad in (-0.1, 1.0, 1.5, float("nan"), float("inf"), "0.1", None, torch.tensor([0.1, 0.2])):
        with pytest.raises(ValueError, match="dropout_p"):
            flash_attn_func(q, q, q, dropout_p=bad)
    with pytest.raises(ValueError, match="dropout_p"):
        flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 5, 5, dropout_p=1.0)
    with pytest.raises(ValueError, match="dropout_p"):
        flash_attn_qkvpacked_func(torch.stack([q, q, q], 2), dropout_p=-1)
    bad_slopes = [
        torch.ones(4, dtype=torch.float64),  # dtype
        torch.ones(4, dtype=torch.float16),
        torch.ones(3),  # nheads
        torch.ones(3, 4),  # batch
        torch.ones(2, 4, 1),  # rank
        torch.ones(()),
        torch.ones(4, device="meta"),  # device
        [0.5] * 4,  # not a tensor
    ]
    for s in bad_slopes:
        with pytest.raises(ValueError, match="alibi_slopes"):
            flash_attn_func(q, q, q, alibi_slopes=s)
    with pytest.raises(ValueError, match="alibi_slopes"):
        flash_attn_kvpacked_func(q, torch.stack([q, q], 2), alibi_slopes=torch.ones(2, 2))
    # varlen: batch is the number of sequences (2 here), not q's first dim.
    with pytest.raises(ValueError, match="alibi_slopes"):
        flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 5, 5, alibi_slopes=torch.ones(8, 4))
    with pytest.raises(ValueError, match="alibi_slopes"):
        flash_attn_varlen_kvpacked_func(q[0], torch.stack([q[0], q[0]], 1), cu, cu, 5, 5,
                                        alibi_slopes=torch.ones(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="alibi_slopes"):
        flash_attn_varlen_qkvpacked_func(torch.stack([q[0], q[0], q[0]], 1), cu, 5, alibi_slopes=torch.ones(5))
    # The ops check too (a direct torch.ops call must not read past a short slopes tensor).
    with pytest.raises(ValueError, match="alibi_slopes"):
        _ops._fwd_ext_impl(q, q, q, None, None, 0, 0, 0.2, False, -1, -1, 0.0, 0.0, torch.ones(3), False, 0)
    with pytest.raises(ValueError, match="rng_state"):
        _ops._bwd_ext_impl(q, q, q, q, q, torch.zeros(2, 4, 8), None, None, 0, 0, 0.2, False, -1, -1, 0.0, 0.1,
                           None, None, False, 0)


def test_slopes_are_normalized_for_the_abi():
    q = rand(3, 4, 5, 8)
    s2 = torch.rand(5, 3).t()  # [3, 5], not contiguous in the last dim
    out = _ops.check_alibi_slopes(s2, q, 3)
    assert out.is_contiguous() and torch.equal(out, s2)
    wide = torch.rand(3, 12)[:, 2:7]  # rows 12 apart: passed as is, batch stride 12
    assert _ops.check_alibi_slopes(wide, q, 3) is wide and _ops._alibi_batch_stride(wide) == 12
    expanded = torch.rand(5).expand(3, 5)  # batch stride 0 < nheads: copied
    e = _ops.check_alibi_slopes(expanded, q, 3)
    assert e.stride(0) == 5 and torch.equal(e, expanded)
    assert _ops._alibi_batch_stride(torch.rand(5)) == 0
    assert _ops.check_dropout_p(0) == 0.0 and _ops.check_dropout_p(torch.tensor(0.25)) == 0.25


# ---- the library's mask, outputs and gradients (host paths) --------------------------------------

HOST_BACKENDS = ["cpu", "reference"]


@pytest.mark.parametrize("backend", HOST_BACKENDS)
def test_library_mask_is_the_philox_mask(backend):
    # Ragged lengths (not multiples of 16), GQA, two sequences: every coordinate of the unit map.
    b, sq, sk, h, hk, p = 2, 45, 200, 4, 2, 0.37
    got = _library_keep(b, sq, sk, h, hk, p, seed=21, backend=backend)
    seed, offset = _drawn(21)
    want = _dropout.keep_mask(seed, offset, b, h, sq, sk, p)
    assert torch.equal(got, want), f"{(got != want).sum().item()} of {want.numel()} entries differ"


def test_drop_rate_is_p():
    b, sq, sk, h, p = 2, 256, 256, 8, 0.3
    keep = _library_keep(b, sq, sk, h, h, p, seed=4)
    n = keep.numel()
    rate = 1.0 - keep.double().mean().item()
    p_eff = _dropout.effective_p(p)
    bound = 5 * math.sqrt(p_eff * (1 - p_eff) / n)
    assert abs(rate - p_eff) <= bound, f"drop rate {rate:.5f}, expected {p_eff:.5f} +- {bound:.5f} (5 sigma)"
    # Per (b, h) the rows differ (every head its own stream).
    assert not torch.equal(keep[0, 0], keep[0, 1]) and not torch.equal(keep[0, 0], keep[1, 0])


# (b, sq, sk, h, hk, d, causal, window, softcap, alibi, dropout_p)
CASES = [
    (2, 37, 53, 4, 2, 64, True, (-1, -1), 0.0, "1d", 0.17),
    (1, 64, 64, 2, 1, 32, False, (8, 4), 5.0, "2d", 0.3),
    (2, 19, 130, 3, 3, 48, False, (-1, -1), 0.0, None, 0.5),
    (1, 100, 33, 2, 2, 64, True, (-1, -1), 0.0, "2d", 0.1),  # sq > sk causal: rows that see no key
    (2, 29, 41, 4, 1, 32, True, (-1, -1), 10.0, "2d", 0.0),  # ALiBi alone
]
CASE_IDS = [f"b{c[0]}_q{c[1]}_k{c[2]}_h{c[3]}-{c[4]}_d{c[5]}{'_causal' if c[6] else ''}_w{c[7][0]},{c[7][1]}"
            f"_cap{c[8]:g}_alibi{c[9]}_p{c[10]:g}" for c in CASES]


def run_oracle_case(case, dtype, backend="auto", device="cpu", seed=1234):
    """One fixed-length call with dropout/ALiBi vs the float64 torch attention with the same keep mask."""
    b, sq, sk, h, hk, d, causal, window, softcap, alibi, p = case
    q = rand(b, sq, h, d, dtype=dtype, device=device).requires_grad_()
    k = rand(b, sk, hk, d, dtype=dtype, device=device).requires_grad_()
    v = rand(b, sk, hk, d, dtype=dtype, device=device).requires_grad_()
    slopes = _slopes(alibi, b, h, device)
    torch.manual_seed(seed)
    out, lse, s_dmask = _call(q, k, v, dropout_p=p, causal=causal, window_size=window, softcap=softcap,
                              alibi_slopes=slopes, return_attn_probs=True, backend=backend)
    seed_, offset = _drawn_on(seed, device)
    keep = _dropout.keep_mask(seed_, offset, b, h, sq, sk, p, device) if p > 0 else None
    # The C ABI takes softmax_scale as float32: so does the oracle (it matters at float64 precision).
    scale = _dropout.to_float32(d ** -0.5)
    kw = dict(causal=causal, window=window, softcap=softcap, scale=scale, alibi_slopes=slopes, keep=keep,
              dropout_scale=_dropout.keep_scale(p))
    l64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    llp = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o64, lse64 = attention_ref(*l64, **kw)
    olp, lselp = attention_ref(*llp, **kw)
    check("out", out, olp, o64, dtype)
    check("lse", lse, lselp, lse64, dtype)
    dout = rand(*out.shape, dtype=dtype, device=device)
    g = torch.autograd.grad(out, (q, k, v), dout)
    g64 = torch.autograd.grad(o64, l64, dout.double())
    glp = torch.autograd.grad(olp, llp, dout)
    for name, a, lp, o in zip(("dq", "dk", "dv"), g, glp, g64):
        check(name, a, lp, o, dtype)
    # S_dmask: as flash_attn, only with dropout; P (normalized with the LSE) with the dropped entries negated.
    if p == 0:
        assert s_dmask is None
        return
    assert s_dmask.shape == (b, h, sq, sk) and s_dmask.dtype == dtype and not s_dmask.requires_grad
    assert torch.equal(torch.signbit(s_dmask), ~keep), "S_dmask's signs are not the keep mask"
    probs = _probs_ref(q, k, causal, window, softcap, slopes, scale)
    atol = {torch.float64: 1e-9, torch.float32: 1e-5}.get(dtype, 2e-2)
    torch.testing.assert_close(s_dmask.abs().double(), probs, rtol=0, atol=atol)


def _probs_ref(q, k, causal, window, softcap, slopes, scale):
    """fp64 softmax probabilities [b, h, sq, sk] with the same masks and ALiBi as attention_ref."""
    from ref import allowed_mask

    q, k = q.detach().double(), k.detach().double()
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(h // hk, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if slopes is not None:
        rel = torch.arange(sq, device=q.device)[:, None] + (sk - sq) - torch.arange(sk, device=q.device)[None, :]
        s = s - slopes.double().view(-1, h, 1, 1) * rel.abs().double()
    mask = allowed_mask(sq, sk, causal, window, q.device)
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, -1)
    return torch.nan_to_num(p, nan=0.0)


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_fwd_bwd_vs_oracle(case, dtype, backend):
    run_oracle_case(case, dtype, backend=backend)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_fwd_bwd_vs_oracle_float64_reference(case):
    # The reference backend in float64 (LSE too): the same mask and scale to float64 precision.
    run_oracle_case(case, torch.float64, backend="reference")


def test_same_seed_same_result_other_seed_other_result():
    q, k, v = (rand(2, 40, 4, 32).requires_grad_() for _ in range(3))
    slopes = _slopes("1d", 2, 4)
    dout = rand(2, 40, 4, 32)

    def run(seed):
        torch.manual_seed(seed)
        out = flash_attn_func(q, k, v, dropout_p=0.2, alibi_slopes=slopes, causal=True)
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    a, b, c = run(7), run(7), run(8)
    for x, y in zip(a, b):
        assert torch.equal(x, y), "the same torch.manual_seed must reproduce outputs and gradients bitwise"
    assert not torch.equal(a[0], c[0]), "another seed must give another mask"
    # Two calls in a row draw two different masks.
    torch.manual_seed(7)
    first = flash_attn_func(q, k, v, dropout_p=0.2)
    second = flash_attn_func(q, k, v, dropout_p=0.2)
    assert not torch.equal(first, second)


def test_gradcheck_float64_dropout_alibi_causal_softcap_gqa():
    # float64 runs on the reference backend in float64 throughout; re-seeding inside the function fixes
    # the mask across gradcheck's calls.
    q = rand(1, 7, 4, 8, dtype=torch.float64, outliers=False).requires_grad_()
    k, v = (rand(1, 9, 2, 8, dtype=torch.float64, outliers=False).requires_grad_() for _ in range(2))
    slopes = _slopes("1d", 1, 4)

    def f(q, k, v):
        torch.manual_seed(11)
        return _call(q, k, v, dropout_p=0.25, alibi_slopes=slopes, causal=True, softcap=3.0)

    assert torch.autograd.gradcheck(f, (q, k, v))
    cu_q = torch.tensor([0, 3, 7], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 9], dtype=torch.int32)
    qv = rand(7, 4, 8, dtype=torch.float64, outliers=False).requires_grad_()
    kv, vv = (rand(9, 2, 8, dtype=torch.float64, outliers=False).requires_grad_() for _ in range(2))
    slopes2 = _slopes("2d", 2, 4)

    def g(q, k, v):
        torch.manual_seed(12)
        return _call(q, k, v, cu_q, cu_k, 4, 5, dropout_p=0.3, alibi_slopes=slopes2, window_size=(2, 1))

    assert torch.autograd.gradcheck(g, (qv, kv, vv))


def _cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


def run_varlen_case(dtype, backend="auto", device="cpu", causal=True, p=0.25):
    lens_q, lens_k = [1, 37, 0, 70, 16], [9, 37, 5, 50, 0]
    cu_q, cu_k = _cu(lens_q).to(device), _cu(lens_k).to(device)
    nseq, h, hk, d = len(lens_q), 4, 2, 64
    q = rand(sum(lens_q), h, d, dtype=dtype, device=device).requires_grad_()
    k = rand(sum(lens_k), hk, d, dtype=dtype, device=device).requires_grad_()
    v = rand(sum(lens_k), hk, d, dtype=dtype, device=device).requires_grad_()
    slopes = _slopes("2d", nseq, h, device)
    torch.manual_seed(77)
    out, lse, s_dmask = _call(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), dropout_p=p, causal=causal,
                              alibi_slopes=slopes, return_attn_probs=True, backend=backend)
    assert s_dmask is None  # never for varlen
    seed, offset = _drawn_on(77, device)
    keep = _dropout.keep_mask(seed, offset, nseq, h, max(lens_q), max(lens_k), p, device)
    kw = dict(causal=causal, alibi_slopes=slopes, keep=keep, dropout_scale=_dropout.keep_scale(p))
    l64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    llp = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o64, lse64 = varlen_ref(*l64, cu_q.cpu(), cu_k.cpu(), **kw)
    olp, lselp = varlen_ref(*llp, cu_q.cpu(), cu_k.cpu(), **kw)
    check("out", out, olp, o64, dtype)
    check("lse", lse, lselp, lse64, dtype)
    dout = rand(*out.shape, dtype=dtype, device=device)
    for name, a, lp, o in zip(("dq", "dk", "dv"), torch.autograd.grad(out, (q, k, v), dout),
                              torch.autograd.grad(olp, llp, dout), torch.autograd.grad(o64, l64, dout.double())):
        check(name, a, lp, o, dtype)


@pytest.mark.parametrize("backend", HOST_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_varlen_alibi_dropout_vs_oracle(dtype, backend):
    run_varlen_case(dtype, backend=backend)


def test_varlen_mask_is_per_sequence_philox():
    # Sequence b is stream offset + b * nheads, rows and columns counted from the sequence's start.
    lens_q, lens_k = [5, 40, 18], [33, 17, 40]
    nseq, h, hk, p = len(lens_q), 2, 1, 0.4
    dk = max(lens_k)
    q = torch.zeros(sum(lens_q), h, dk)
    k = torch.randn(sum(lens_k), hk, dk)
    v = torch.zeros(sum(lens_k), hk, dk)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    for bb in range(nseq):
        v[cu_k[bb]:cu_k[bb + 1], :, :lens_k[bb]] = torch.eye(lens_k[bb])[:, None, :]
    torch.manual_seed(31)
    out = _call(q, k, v, cu_q, cu_k, max(lens_q), dk, dropout_p=p)
    seed, offset = _drawn(31)
    want = _dropout.keep_mask(seed, offset, nseq, h, max(lens_q), dk, p)
    for bb in range(nseq):
        got = out[cu_q[bb]:cu_q[bb + 1], :, :lens_k[bb]].permute(1, 0, 2) != 0
        assert torch.equal(got, want[bb, :, :lens_q[bb], :lens_k[bb]]), f"sequence {bb}"


def test_packed_variants_pass_dropout_and_alibi():
    b, s, h, d = 2, 33, 4, 32
    qkv = rand(b, s, 3, h, d)
    slopes = _slopes("2d", b, h)
    torch.manual_seed(5)
    out = _call(*qkv.unbind(2), dropout_p=0.3, alibi_slopes=slopes, causal=True)
    torch.manual_seed(5)
    assert torch.equal(flash_attn_qkvpacked_func(qkv, dropout_p=0.3, alibi_slopes=slopes, causal=True), out)
    torch.manual_seed(5)
    assert torch.equal(flash_attn_kvpacked_func(qkv[:, :, 0], qkv[:, :, 1:], dropout_p=0.3, alibi_slopes=slopes,
                                                causal=True), out)
    cu = _cu([s] * b)
    flat = qkv.reshape(b * s, 3, h, d)
    torch.manual_seed(5)
    ref = flash_attn_varlen_func(*flat.unbind(1), cu, cu, s, s, dropout_p=0.3, alibi_slopes=slopes, causal=True)
    torch.manual_seed(5)
    assert torch.equal(flash_attn_varlen_qkvpacked_func(flat, cu, s, dropout_p=0.3, alibi_slopes=slopes,
                                                        causal=True), ref)
    torch.manual_seed(5)
    assert torch.equal(flash_attn_varlen_kvpacked_func(flat[:, 0], flat[:, 1:], cu, cu, s, s, dropout_p=0.3,
                                                       alibi_slopes=slopes, causal=True), ref)
    # Equal-length varlen is the fixed-length call: the same streams (b * nheads + h), the same mask.
    torch.testing.assert_close(ref.view(b, s, h, d), out, rtol=1e-6, atol=1e-6)
    # Non-contiguous slopes are copied, with the same result.
    wide = torch.zeros(b, 2 * h)
    wide[:, ::2] = slopes
    torch.manual_seed(5)
    assert torch.equal(_call(*qkv.unbind(2), dropout_p=0.3, alibi_slopes=wide[:, ::2], causal=True), out)


# ---- torch.library / torch.compile -----------------------------------------------------------------


def test_opcheck_ext_ops():
    q = rand(2, 16, 4, 32).requires_grad_()
    k, v = rand(2, 24, 2, 32).requires_grad_(), rand(2, 24, 2, 32).requires_grad_()
    slopes = _slopes("2d", 2, 4)
    args = (q, k, v, None, None, 0, 0, 32 ** -0.5, True, -1, 0, 0.0, 0.0, slopes, False, 0)
    out, lse, rng = torch.ops.flashattn.fwd_ext(*args)
    assert torch.equal(rng, torch.zeros(2, dtype=torch.int64))  # no dropout: nothing drawn
    torch.library.opcheck(torch.ops.flashattn.fwd_ext.default, args)  # ALiBi alone: deterministic
    dout = rand(*out.shape)
    bargs = (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse, None, None, 0, 0, 32 ** -0.5, True, -1,
             0, 0.0, 0.0, rng, slopes, False, 0)
    torch.library.opcheck(torch.ops.flashattn.bwd_ext.default, bargs)
    # With dropout the forward draws new numbers each call: schema and fake kernel only.
    dargs = args[:12] + (0.2,) + args[13:]
    torch.library.opcheck(torch.ops.flashattn.fwd_ext.default, dargs, test_utils=("test_schema", "test_faketensor"))
    out, lse, rng = torch.ops.flashattn.fwd_ext(*dargs)
    assert rng.dtype == torch.int64 and rng.shape == (2,)
    torch.library.opcheck(torch.ops.flashattn.bwd_ext.default,
                          bargs[:4] + (out.detach(), lse) + bargs[6:15] + (0.2, rng) + bargs[17:])


def test_torch_compile_fullgraph_dropout_alibi():
    torch._dynamo.reset()
    h, d = 4, 32
    q, k, v = (rand(2, 40, n, d).requires_grad_() for n in (h, 2, 2))
    slopes = _slopes("1d", 2, h)

    def f(q, k, v, slopes):
        o, lse, s_dmask = flash_attn_func(q * 1.5, k, v, dropout_p=0.2, alibi_slopes=slopes, causal=True,
                                          softcap=20.0, return_attn_probs=True)
        return (o * 2).sin().sum(), s_dmask

    compiled = torch.compile(f, fullgraph=True, backend="inductor")
    torch.manual_seed(3)
    loss, sd = compiled(q, k, v, slopes)
    g = torch.autograd.grad(loss, (q, k, v))
    torch.manual_seed(3)
    loss_ref, sd_ref = f(q, k, v, slopes)
    g_ref = torch.autograd.grad(loss_ref, (q, k, v))
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sd, sd_ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(torch.signbit(sd), torch.signbit(sd_ref))
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # The compiled graph draws a fresh mask per call.
    torch.manual_seed(4)
    assert not torch.equal(compiled(q, k, v, slopes)[1], sd)


# ---- CUDA --------------------------------------------------------------------------------------------


def _gpu_backends():
    if not torch.cuda.is_available():
        return []
    compiled = set(flashattn.compiled_backends())
    cc = torch.cuda.get_device_capability()
    names = []
    if "sm80" in compiled and cc >= (8, 0):
        names.append("sm80")
    if "sm90" in compiled and cc == (9, 0):
        names.append("sm90")
    return names


GPU_BACKENDS = ["sm80", "sm90"]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device (torch.cuda.is_available() is False)")


def _need_gpu(backend):
    if backend not in _gpu_backends():
        pytest.skip(f"backend {backend} not compiled into {flashattn.library_path()} or not runnable on this GPU")


@needs_cuda
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_cuda_library_mask_is_the_philox_mask(backend):
    _need_gpu(backend)
    b, sq, sk, h, hk, p = 2, 77, 256, 4, 2, 0.37
    got = _library_keep(b, sq, sk, h, hk, p, seed=21, device="cuda", backend=backend, dtype=torch.bfloat16)
    seed, offset = _drawn_on(21, "cuda")
    want = _dropout.keep_mask(seed, offset, b, h, sq, sk, p, "cuda")
    assert torch.equal(got, want), f"{(got != want).sum().item()} of {want.numel()} entries differ"


@needs_cuda
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_cuda_fwd_bwd_vs_oracle(case, dtype, backend):
    _need_gpu(backend)
    run_oracle_case(case, dtype, backend=backend, device="cuda")


@needs_cuda
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_cuda_varlen_alibi_dropout_vs_oracle(backend):
    _need_gpu(backend)
    run_varlen_case(torch.bfloat16, backend=backend, device="cuda")


@needs_cuda
def test_cuda_graph_replays_draw_fresh_masks():
    if not _gpu_backends():
        pytest.skip("no GPU path in the loaded library")
    b, sq, sk, h, p = 2, 128, 128, 4, 0.25
    dev = "cuda"
    # q = 0, V = identity: the output is the keep mask times 1 / (sk (1 - p)), and with dout = 1,
    # dV[j] = sum over kept (i, j) of the same factor: both read the replay's mask.
    q = torch.zeros(b, sq, h, sk, dtype=torch.bfloat16, device=dev, requires_grad=True)
    k = torch.randn(b, sk, h, sk, dtype=torch.bfloat16, device=dev, requires_grad=True)
    v = torch.eye(sk, dtype=torch.bfloat16, device=dev)[None, :, None, :].expand(b, sk, h, sk).contiguous()
    v.requires_grad_()
    dout = torch.ones(b, sq, h, sk, dtype=torch.bfloat16, device=dev)

    def step():
        out = flash_attn_func(q, k, v, dropout_p=p)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
        return out, dv

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        try:
            for _ in range(2):
                step()
        except NotImplementedError as e:
            pytest.skip(str(e))
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_s, dv_s = step()
    masks = []
    factor = 1.0 / (sk * (1 - _dropout.effective_p(p)))
    p_eff = _dropout.effective_p(p)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        keep = out_s.permute(0, 2, 1, 3) != 0
        masks.append(keep)
        n = keep.numel()
        rate = 1.0 - keep.double().mean().item()
        assert abs(rate - p_eff) <= 5 * math.sqrt(p_eff * (1 - p_eff) / n), rate
        # The backward of this replay applied the same mask: dV[b, j, h, :] = factor * #kept rows of column j.
        col = keep.sum(2).permute(0, 2, 1).double()  # [b, sk, h]
        torch.testing.assert_close(dv_s[..., 0].double(), col * factor, rtol=2e-2, atol=1e-3)
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2]), \
        "CUDA-graph replays must draw fresh dropout masks"
