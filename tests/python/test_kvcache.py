"""flash_attn_with_kvcache and paged KV (flash_attn_varlen_func with block_table / seqused_k) on the host paths,
against a pure-torch float64 reference of flash_attn 2.x's semantics written here (kvcache_ref): the new rows
appended into a copy of the cache (rotated first), q rotated at its positions, each sequence's keys gathered
through the block table / cache_batch_idx from cache_leftpad[b] to cache_seqlens[b] + seqlen_new, then plain
attention with bottom-right masks relative to that length (ref.attention_ref). Outputs are poisoned with NaN
first (conftest: FLASHATTN_DEBUG_POISON=1). The CUDA paths refuse the KV cache for now: their test only checks
that the refusal is a clear NotImplementedError (skipped without CUDA)."""

import math

import pytest
import torch

import flashattn
from flashattn import _ops, flash_attn_varlen_func, flash_attn_with_kvcache
from flashattn._dropout import to_float32
from flashattn.rotary import apply_rotary_emb
from ref import ATOL, attention_ref, check, rand

DTYPES = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16}


def test_outputs_are_poisoned():
    assert _ops._POISON, "conftest sets FLASHATTN_DEBUG_POISON=1: outputs start as NaN"


# ---- the reference ---------------------------------------------------------------------------------------------


def _rotate(x, cos, sin, pos, interleaved):
    """x [n, heads, d] rotated at positions pos [n] (flashattn.h's formula), in x's dtype."""
    half = cos.shape[1]
    rd = 2 * half
    c, s = cos[pos][:, None, :], sin[pos][:, None, :]
    x = x.clone()
    i0 = torch.arange(0, rd, 2) if interleaved else torch.arange(half)
    i1 = i0 + 1 if interleaved else i0 + half
    x0, x1 = x[..., i0], x[..., i1]
    x[..., i0], x[..., i1] = x0 * c - x1 * s, x0 * s + x1 * c
    return x


def kvcache_ref(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None, causal=False,
                window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, alibi_slopes=None, dt=torch.float64):
    """flash_attn_with_kvcache in plain torch, computed in `dt`: (out, lse, k_cache', v_cache', written) where
    k_cache'/v_cache' are updated copies (in the cache's dtype) and written marks the cache rows appended."""
    b, sq, h, d = q.shape
    # The C ABI takes softmax_scale and softcap as float32 (flashattn.h): so does the reference.
    softmax_scale = to_float32(d ** -0.5 if softmax_scale is None else softmax_scale)
    softcap = to_float32(softcap)
    kc, vc = k_cache.clone(), v_cache.clone()
    written = torch.zeros(kc.shape[:2], dtype=torch.bool)
    paged = block_table is not None
    ps = kc.shape[1]
    cap = ps * block_table.shape[1] if paged else kc.shape[1]
    new = 0 if k is None else k.shape[1]
    if cache_seqlens is None:
        seqlens = [cap] * b
    elif isinstance(cache_seqlens, int):
        seqlens = [cache_seqlens] * b
    else:
        seqlens = cache_seqlens.tolist()
    leftpad = [0] * b if cache_leftpad is None else cache_leftpad.tolist()
    rot = rotary_cos is not None
    if rot:
        cos, sin = rotary_cos.to(dt), rotary_sin.to(dt)
    per_row = causal or window_size[0] >= 0 or window_size[1] >= 0

    def where(bi, rows):
        """(cache entry or page, row within it) of sequence bi's rows."""
        if paged:
            return block_table[bi].long()[rows // ps], rows % ps
        ent = int(cache_batch_idx[bi]) if cache_batch_idx is not None else bi
        return torch.full_like(rows, ent), rows

    outs, lses = [], []
    for bi in range(b):  # appends first: pages may be shared
        if new:
            rows = torch.arange(seqlens[bi], seqlens[bi] + new)
            kn = k[bi].to(dt)
            if rot:
                kn = _rotate(kn, cos, sin, rows, rotary_interleaved)
            e, r = where(bi, rows)
            kc[e, r] = kn.to(kc.dtype)
            vc[e, r] = v[bi]
            written[e, r] = True
    for bi in range(b):
        qb = q[bi].to(dt)
        if rot:
            pos = seqlens[bi] + (torch.arange(sq) if per_row else torch.zeros(sq, dtype=torch.long))
            qb = _rotate(qb, cos, sin, pos, rotary_interleaved)
        end = seqlens[bi] + new
        e, r = where(bi, torch.arange(leftpad[bi], end))
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[bi:bi + 1]
        o, lse = attention_ref(qb[None], kc[e, r][None], vc[e, r][None], causal=causal, window=window_size,
                               softcap=softcap, scale=softmax_scale, dtype=dt, alibi_slopes=slopes)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses), kc, vc, written


def test_reference_rotation_matches_apply_rotary_emb():
    x = torch.randn(2, 5, 3, 16, dtype=torch.float64)
    cos, sin = _rotary_tables(20, 12, torch.float64)
    for interleaved in (True, False):
        ours = torch.stack([_rotate(x[b], cos, sin, torch.arange(5) + 3 * b, interleaved) for b in range(2)])
        theirs = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=torch.tensor([0, 3]))
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


# ---- building caches ---------------------------------------------------------------------------------------------


def _rotary_tables(seqlen, rotary_dim, dtype):
    inv = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    ang = torch.arange(seqlen, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def _block_table(seqlens, new, ps, wide=False, share=True):
    """Random, non-contiguous page ids: each sequence gets the pages its rows need (at least one) in random order
    from one pool; unused entries are -1 (never read); the first full pages below two sequences' cache_seqlens
    are shared between them (read-only: appends go to rows >= cache_seqlens). wide: a view of a wider table
    (block_table.stride(0) > max_pages). Returns (block_table int32, num_pages)."""
    b = len(seqlens)
    need = [max(1, -(-(n + new) // ps)) for n in seqlens]
    max_pages = max(need) + 1  # one spare column of -1 for every sequence
    num_pages = sum(need) + 3  # a few pages never referenced
    perm = torch.randperm(num_pages).to(torch.int32)
    table = torch.full((b, max_pages + (3 if wide else 0)), -1, dtype=torch.int32)
    at = 0
    for bi in range(b):
        table[bi, :need[bi]] = perm[at:at + need[bi]]
        at += need[bi]
    if share:
        a = max(range(b), key=lambda i: seqlens[i])
        for bi in range(b):
            if bi != a:
                n = min(seqlens[bi], seqlens[a]) // ps
                n = min(n, 3)
                table[bi, :n] = table[a, :n]
    if wide:
        table = table[:, :max_pages]
        assert table.stride(0) > max_pages
    return table, num_pages


def _caches(shape, dtype, kv_packed):
    """(k_cache, v_cache) of `shape`; kv_packed: views into one [n, rows, 2, hk, d] tensor (strided rows)."""
    if kv_packed:
        kv = rand(shape[0], shape[1], 2, *shape[2:], dtype=dtype)
        return kv.unbind(2)
    return rand(*shape, dtype=dtype), rand(*shape, dtype=dtype)


# Cache lengths 0, 1, 7, 113, 799 (ragged, per batch, with 0), page sizes 1, 3, 16, 256 and contiguous caches,
# seqlen_q 1 / 4 / 7 with seqlen_new 0 / 1 / 2 / 3 / 4, GQA 8/2 and MQA, causal or not, windows, softcap, ALiBi,
# rotary (interleaved or halves, rotary_dim < d and = d), leftpad, cache_batch_idx into a larger cache.
CASES = {
    "paged1_decode_gqa": dict(paged=1, lens=[0, 1, 7, 113, 799], sq=1, new=1, h=8, hk=2, d=64, causal=True),
    "paged3_rotary_interleaved_leftpad": dict(paged=3, lens=[7, 0, 113], sq=4, new=4, h=8, hk=2, d=64, causal=True,
                                              rotary=32, interleaved=True, leftpad=True),
    "paged16_mqa_rotary_halves_kvpacked": dict(paged=16, lens=[799, 113, 1, 0], sq=4, new=2, h=4, hk=1, d=32,
                                               rotary=16, interleaved=False, kv_packed=True, wide=True),
    "paged256_window_softcap_alibi": dict(paged=256, lens=[113, 799, 0], sq=1, new=1, h=4, hk=2, d=32,
                                          window=(32, 0), softcap=5.0, alibi="h"),
    "paged256_read_only_within_a_page": dict(paged=256, lens=[113, 0, 7], sq=4, new=0, h=4, hk=2, d=32, causal=True,
                                             alibi="bh"),
    "paged16_read_only_beyond_a_page": dict(paged=16, lens=[799, 113, 1, 0], sq=1, new=0, h=8, hk=2, d=32,
                                            causal=True),
    "paged16_prefill_window_rotary_leftpad": dict(paged=16, lens=[0, 7, 113], sq=4, new=4, h=4, hk=4, d=48,
                                                  causal=True, window=(9, -1), rotary=48, interleaved=False,
                                                  leftpad=True),
    "batch_idx_permutation": dict(lens=[0, 7, 113, 1], batch_cache=7, batch_idx=True, sq=4, new=4, h=8, hk=2, d=64,
                                  causal=True, window=(16, -1), rotary=32, interleaved=True),
    "contiguous_leftpad_read_int_alibi": dict(lens=113, cache_len=120, sq=4, new=0, h=4, hk=2, d=32, leftpad=True,
                                              alibi="bh"),
    "contiguous_full_cache": dict(lens=None, cache_len=57, sq=7, new=0, h=4, hk=1, d=32, causal=True),
    "contiguous_int_seqlens_new3": dict(lens=799, cache_len=810, sq=1, new=3, h=2, hk=2, d=16, causal=True,
                                        rotary=16, interleaved=True, kv_packed=True),
    "contiguous_decode_noncausal_rotary": dict(lens=[1, 799], sq=1, new=1, h=8, hk=2, d=64, rotary=64,
                                               interleaved=False, softcap=3.0),
}


def _build(case, dtype):
    """(kwargs for flash_attn_with_kvcache, the caches before the call)."""
    c = dict(case)
    lens = c["lens"]
    per_seq = lens if isinstance(lens, list) else None
    b = len(per_seq) if per_seq else 3
    sq, new, h, hk, d = c["sq"], c["new"], c["h"], c["hk"], c["d"]
    seqlens = per_seq if per_seq else [c.get("cache_len", 0) if lens is None else lens] * b
    kw = dict(causal=c.get("causal", False), window_size=c.get("window", (-1, -1)), softcap=c.get("softcap", 0.0))
    kw["q"] = rand(b, sq, h, d, dtype=dtype)
    if c.get("paged"):
        ps = c["paged"]
        table, num_pages = _block_table(seqlens, new, ps, wide=c.get("wide", False))
        kw["k_cache"], kw["v_cache"] = _caches((num_pages, ps, hk, d), dtype, c.get("kv_packed", False))
        kw["block_table"] = table
    else:
        rows = c.get("cache_len", max(seqlens) + new + 5)
        entries = c.get("batch_cache", b)
        kw["k_cache"], kw["v_cache"] = _caches((entries, rows, hk, d), dtype, c.get("kv_packed", False))
        if c.get("batch_idx"):
            kw["cache_batch_idx"] = torch.randperm(entries)[:b].to(torch.int32)
    if lens is not None:
        kw["cache_seqlens"] = torch.tensor(per_seq, dtype=torch.int32) if per_seq else lens
    if new:
        kw["k"], kw["v"] = rand(b, new, hk, d, dtype=dtype), rand(b, new, hk, d, dtype=dtype)
    if c.get("rotary"):
        kw["rotary_cos"], kw["rotary_sin"] = _rotary_tables(max(seqlens) + max(new, sq) + 3, c["rotary"], dtype)
        kw["rotary_interleaved"] = c["interleaved"]
    if c.get("leftpad"):
        kw["cache_leftpad"] = torch.tensor([int(torch.randint(0, n + 1, ())) for n in seqlens], dtype=torch.int32)
    if c.get("alibi") == "h":
        kw["alibi_slopes"] = torch.rand(h, dtype=torch.float32) * 0.3
    elif c.get("alibi") == "bh":
        kw["alibi_slopes"] = torch.rand(b, h, dtype=torch.float32) * 0.3
    return kw


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("name", list(CASES))
def test_with_kvcache_matches_reference(name, dtype):
    kw = _build(CASES[name], dtype)
    before_k, before_v = kw["k_cache"].clone(), kw["v_cache"].clone()
    out, lse = flash_attn_with_kvcache(**kw, return_softmax_lse=True)
    after_k, after_v = kw["k_cache"], kw["v_cache"]

    ref_kw = dict(kw, k_cache=before_k, v_cache=before_v)
    o64, lse64, kc64, vc64, written = kvcache_ref(**ref_kw, dt=torch.float64)
    olp, lselp, _, _, _ = kvcache_ref(**ref_kw, dt=dtype)
    b, sq, h, _ = kw["q"].shape
    assert out.shape == kw["q"].shape and out.dtype == dtype
    assert lse.shape == (b, h, sq) and lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    check("out", out, olp, o64, dtype)
    check("lse", lse, lselp, lse64, dtype)

    # In place: the appended rows hold k/v (rotated), every other row is bitwise unchanged.
    assert not torch.equal(written, torch.zeros_like(written)) or "k" not in kw
    for got, want in ((after_k, kc64), (after_v, vc64)):
        assert torch.equal(got[~written], want[~written])
        if kw.get("rotary_cos") is not None and got is after_k:
            torch.testing.assert_close(got[written], want[written])  # rotated: fp32 vs fp64 rotation may round apart
        else:
            assert torch.equal(got[written], want[written])


def test_return_value_and_no_autograd():
    kw = _build(CASES["paged3_rotary_interleaved_leftpad"], torch.float32)
    kw["q"].requires_grad_()
    before = kw["k_cache"].clone(), kw["v_cache"].clone()
    out = flash_attn_with_kvcache(**kw)
    assert isinstance(out, torch.Tensor) and not out.requires_grad  # as flash_attn: no autograd
    out2, lse = flash_attn_with_kvcache(**dict(kw, k_cache=before[0], v_cache=before[1]), return_softmax_lse=True)
    assert torch.equal(out, out2) and not lse.requires_grad


def test_larger_cache_batch_without_batch_idx_uses_the_first_entries():
    q, k, v = rand(2, 1, 4, 32), rand(2, 1, 2, 32), rand(2, 1, 2, 32)
    kc, vc = rand(5, 16, 2, 32), rand(5, 16, 2, 32)
    before = kc.clone(), vc.clone()
    sl = torch.tensor([3, 9], dtype=torch.int32)
    out = flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=sl, causal=True)
    o64, _, kc64, vc64, _ = kvcache_ref(q, before[0][:2], before[1][:2], k, v, cache_seqlens=sl, causal=True)
    olp = kvcache_ref(q, before[0][:2], before[1][:2], k, v, cache_seqlens=sl, causal=True, dt=torch.float32)[0]
    check("out", out, olp, o64, torch.float32)
    assert torch.equal(kc[:2], kc64) and torch.equal(vc[:2], vc64)
    assert torch.equal(kc[2:], before[0][2:]) and torch.equal(vc[2:], before[1][2:])


def test_decode_loop_int_seqlens_equals_one_prefill():
    """Appending one token at a time (cache_seqlens an int, the cached int32 tensor path) builds the same cache as
    appending all at once, and each step's output is causal attention over the prefix."""
    b, h, hk, d, n = 2, 4, 2, 16, 6
    q, k, v = rand(b, n, h, d), rand(b, n, hk, d), rand(b, n, hk, d)
    kc1, vc1 = torch.zeros(b, 8, hk, d), torch.zeros(b, 8, hk, d)
    kc2, vc2 = kc1.clone(), vc1.clone()
    full = flash_attn_with_kvcache(q, kc2, vc2, k, v, cache_seqlens=0, causal=True)
    for t in range(n):
        o = flash_attn_with_kvcache(q[:, t:t + 1], kc1, vc1, k[:, t:t + 1], v[:, t:t + 1], cache_seqlens=t,
                                    causal=True)
        torch.testing.assert_close(o, full[:, t:t + 1], rtol=1e-5, atol=1e-5)
    assert torch.equal(kc1, kc2) and torch.equal(vc1, vc2)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_num_splits_changes_nothing_on_the_host(num_splits):
    kw = _build(CASES["contiguous_leftpad_read_int_alibi"], torch.float32)
    a = flash_attn_with_kvcache(**kw)
    assert torch.equal(flash_attn_with_kvcache(**kw, num_splits=num_splits), a)


# ---- flash_attn_varlen_func with block_table / seqused_k ------------------------------------------------------------


@pytest.mark.parametrize("ps", [1, 3, 16, 256])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_varlen_paged_matches_reference(ps, dtype):
    lens_q, lens_k = [1, 4, 7, 1], [0, 7, 113, 799]
    h, hk, d = 8, 2, 32
    table, num_pages = _block_table(lens_k, 0, ps, wide=ps == 3)
    kp, vp = rand(num_pages, ps, hk, d, dtype=dtype), rand(num_pages, ps, hk, d, dtype=dtype)
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    q = rand(int(cu_q[-1]), h, d, dtype=dtype)
    seqused = torch.tensor([0, 5, 113, 700], dtype=torch.int32)
    for used in (None, seqused):
        out, lse, probs = flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                                 return_attn_probs=True, block_table=table, seqused_k=used)
        assert probs is None and lse.shape == (h, q.shape[0])
        for bi in range(len(lens_q)):
            qs = q[None, cu_q[bi]:cu_q[bi + 1]]
            sl = torch.tensor([lens_k[bi] if used is None else int(used[bi])], dtype=torch.int32)
            args = (qs, kp, vp)
            kw = dict(cache_seqlens=sl, block_table=table[bi:bi + 1], causal=True)
            o64, l64 = kvcache_ref(*args, **kw)[:2]
            olp, llp = kvcache_ref(*args, **kw, dt=dtype)[:2]
            check(f"out[{bi}]", out[None, cu_q[bi]:cu_q[bi + 1]], olp, o64, dtype)
            check(f"lse[{bi}]", lse[None, :, cu_q[bi]:cu_q[bi + 1]], llp, l64, dtype)


def test_varlen_seqused_k_contiguous():
    cu_q = torch.tensor([0, 3, 5], dtype=torch.int32)
    cu_k = torch.tensor([0, 10, 30], dtype=torch.int32)
    q, k, v = rand(5, 4, 16), rand(30, 2, 16), rand(30, 2, 16)
    used = torch.tensor([4, 20], dtype=torch.int32)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 20, causal=True, seqused_k=used)
    cut = torch.cat([torch.arange(0, 4), torch.arange(10, 30)])
    want = flash_attn_varlen_func(q, k[cut], v[cut], cu_q, torch.tensor([0, 4, 24], dtype=torch.int32), 3, 20,
                                  causal=True)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)


def test_varlen_paged_backward_raises():
    table, num_pages = _block_table([5, 9], 0, 4)
    kp = rand(num_pages, 4, 2, 16).requires_grad_()
    vp = rand(num_pages, 4, 2, 16).requires_grad_()
    q = rand(3, 4, 16).requires_grad_()
    cu_q, cu_k = torch.tensor([0, 1, 3], dtype=torch.int32), torch.tensor([0, 5, 14], dtype=torch.int32)
    out = flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 2, 9, block_table=table)
    assert out.requires_grad and torch.isfinite(out).all()
    with pytest.raises(RuntimeError, match="inference-only"):
        out.sum().backward()
    with torch.no_grad():
        assert torch.equal(flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 2, 9, block_table=table), out.detach())
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 2, 9, dropout_p=0.1, block_table=table)
    # Compiled (the custom op and its autograd formula): the backward raises the same way.
    torch._dynamo.reset()
    f = torch.compile(lambda q, kp, vp: flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 2, 9, block_table=table),
                      backend="aot_eager", fullgraph=True)
    out_c = f(q, kp, vp)
    assert torch.equal(out_c.detach(), out.detach())
    with pytest.raises(RuntimeError, match="inference-only"):
        out_c.sum().backward()


# ---- errors -----------------------------------------------------------------------------------------------------


def _decode_args(paged=False):
    q, k, v = rand(2, 1, 4, 16), rand(2, 1, 2, 16), rand(2, 1, 2, 16)
    if paged:
        table, n = _block_table([5, 9], 1, 4)
        kc, vc = rand(n, 4, 2, 16), rand(n, 4, 2, 16)
        return dict(q=q, k_cache=kc, v_cache=vc, k=k, v=v, cache_seqlens=torch.tensor([5, 9], dtype=torch.int32),
                    block_table=table)
    kc, vc = rand(2, 12, 2, 16), rand(2, 12, 2, 16)
    return dict(q=q, k_cache=kc, v_cache=vc, k=k, v=v, cache_seqlens=torch.tensor([5, 9], dtype=torch.int32))


def _i32(*x):
    return torch.tensor(x, dtype=torch.int32)


ERRORS = [
    # Caught in Python: dtype / rank / shape / combination, each naming the argument.
    ("seqlens_int64", False, lambda a: a.update(cache_seqlens=a["cache_seqlens"].long()), ValueError,
     "cache_seqlens must be int32"),
    ("seqlens_shape", False, lambda a: a.update(cache_seqlens=_i32(1, 2, 3)), ValueError, "cache_seqlens must have shape"),
    ("seqlens_int_capacity", False, lambda a: a.update(cache_seqlens=12), ValueError, "cache_seqlens=12"),
    ("seqlens_missing_with_k", False, lambda a: a.update(cache_seqlens=None), ValueError, "cache_seqlens is required"),
    ("block_table_int64", True, lambda a: a.update(block_table=a["block_table"].long()), ValueError,
     "block_table must be int32"),
    ("block_table_rank", True, lambda a: a.update(block_table=a["block_table"][0]), ValueError,
     "block_table must have shape"),
    ("batch_idx_with_block_table", True, lambda a: a.update(cache_batch_idx=_i32(0, 1)), ValueError,
     "cache_batch_idx is not supported with block_table"),
    ("batch_idx_float", False, lambda a: a.update(cache_batch_idx=torch.zeros(2)), ValueError,
     "cache_batch_idx must be int32"),
    ("leftpad_shape", False, lambda a: a.update(cache_leftpad=_i32(0)), ValueError, "cache_leftpad must have shape"),
    ("k_without_v", False, lambda a: a.update(v=None), ValueError, "k is given without v"),
    ("v_without_k", False, lambda a: a.update(k=None), ValueError, "v is given without k"),
    ("k_heads", False, lambda a: a.update(k=rand(2, 1, 4, 16), v=rand(2, 1, 4, 16)), ValueError, "k must have shape"),
    ("k_v_shapes", False, lambda a: a.update(v=rand(2, 2, 2, 16)), ValueError, "k and v must have the same shape"),
    ("k_too_many_rows", False, lambda a: a.update(k=rand(2, 13, 2, 16), v=rand(2, 13, 2, 16)), ValueError,
     "k has 13 new rows"),
    ("rotary_without_k", False,
     lambda a: a.update(k=None, v=None, rotary_cos=torch.ones(16, 4), rotary_sin=torch.zeros(16, 4)), ValueError,
     "rotary_cos/rotary_sin need k and v"),
    ("rotary_only_cos", False, lambda a: a.update(rotary_cos=torch.ones(16, 4)), ValueError,
     "rotary_cos and rotary_sin"),
    ("rotary_dtype", False,
     lambda a: a.update(rotary_cos=torch.ones(16, 4, dtype=torch.float64), rotary_sin=torch.zeros(16, 4,
                                                                                                  dtype=torch.float64)),
     ValueError, "rotary_cos must have q's dtype"),
    ("rotary_dim", False, lambda a: a.update(rotary_cos=torch.ones(16, 9), rotary_sin=torch.zeros(16, 9)), ValueError,
     "rotary_cos must have shape"),
    ("v_cache_shape", False, lambda a: a.update(v_cache=rand(2, 11, 2, 16)), ValueError,
     "k_cache and v_cache must have the same shape"),
    ("k_cache_rank", False, lambda a: a.update(k_cache=rand(2, 12, 32), v_cache=rand(2, 12, 32)), ValueError,
     "k_cache must be 4-D"),
    ("cache_dtype", False, lambda a: a.update(k_cache=a["k_cache"].double(), v_cache=a["v_cache"].double()),
     ValueError, "same dtype"),
    ("cache_batch_too_small", False, lambda a: a.update(k_cache=rand(1, 12, 2, 16), v_cache=rand(1, 12, 2, 16)),
     ValueError, "cache_batch_idx"),
    ("cache_last_dim_strided", False,
     lambda a: a.update(k_cache=rand(2, 12, 2, 32)[..., ::2], v_cache=rand(2, 12, 2, 32)[..., ::2]), ValueError,
     "k_cache needs a contiguous last dim"),
    ("num_splits", False, lambda a: a.update(num_splits=-1), ValueError, "num_splits"),
    # Caught by the library's validation (the index arrays' contents): the message names the C field and the
    # argument.
    ("seqlens_beyond_capacity", False, lambda a: a.update(cache_seqlens=_i32(5, 12)), ValueError,
     r"kv_cache\.seqlens\[1\]: 12, plus 1 new rows.*cache_seqlens"),
    ("seqlens_negative", False, lambda a: a.update(cache_seqlens=_i32(-1, 3)), ValueError, "cache_seqlens"),
    ("page_out_of_range", True, lambda a: a["block_table"].__setitem__((1, 0), 10_000), ValueError,
     r"kv_cache\.block_table\[1\]\[0\]: page 10000.*is block_table"),
    ("page_negative", True, lambda a: a["block_table"].__setitem__((0, 1), -1), ValueError,
     r"kv_cache\.block_table\[0\]\[1\].*is block_table"),
    ("paged_beyond_capacity", True, lambda a: a.update(cache_seqlens=_i32(5, 4 * a["block_table"].shape[1])),
     ValueError, r"kv_cache\.seqlens\[1\].*cache_seqlens"),
    ("batch_idx_out_of_range", False, lambda a: a.update(cache_batch_idx=_i32(0, 2)), ValueError,
     r"kv_cache\.batch_idx\[1\]: 2.*cache_batch_idx"),
    ("leftpad_beyond_end", False, lambda a: a.update(cache_leftpad=_i32(0, 11)), ValueError,
     r"kv_cache\.leftpad\[1\]: 11.*cache_leftpad"),
    ("rotary_table_too_short", False, lambda a: a.update(rotary_cos=torch.ones(6, 4), rotary_sin=torch.zeros(6, 4)),
     ValueError, r"kv_cache\.rotary_seqlen.*rotary_cos\.shape\[0\]"),
]


@pytest.mark.parametrize("name,paged,mutate,exc,match", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_name_the_argument(name, paged, mutate, exc, match):
    args = _decode_args(paged)
    mutate(args)
    before = args["k_cache"].clone()
    with pytest.raises(exc, match=match):
        flash_attn_with_kvcache(**args)
    assert torch.equal(args["k_cache"], before)  # a refused call writes nothing


def test_paged_read_only_beyond_the_first_page():
    """5 cached rows in pages of 4, nothing appended (validation once bounded the rows by the page size)."""
    q, kc, vc = rand(1, 1, 2, 16), rand(3, 4, 2, 16), rand(3, 4, 2, 16)
    out = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=_i32(5), block_table=_i32(2, 0).view(1, 2))
    o64 = kvcache_ref(q, kc, vc, cache_seqlens=_i32(5), block_table=_i32(2, 0).view(1, 2))[0]
    torch.testing.assert_close(out.double(), o64, rtol=1e-5, atol=1e-5)


def test_paged_without_cache_seqlens_reads_the_whole_capacity():
    q, kc, vc = rand(2, 3, 4, 16), rand(5, 4, 2, 16), rand(5, 4, 2, 16)
    bt = _i32(2, 0, 4, 1, 3, 0).view(2, 3)  # page 0 shared
    out, lse = flash_attn_with_kvcache(q, kc, vc, block_table=bt, causal=True, return_softmax_lse=True)
    o64, l64 = kvcache_ref(q, kc, vc, block_table=bt, causal=True)[:2]
    olp, llp = kvcache_ref(q, kc, vc, block_table=bt, causal=True, dt=torch.float32)[:2]
    check("out", out, olp, o64, torch.float32)
    check("lse", lse, llp, l64, torch.float32)


def test_paged_without_cache_seqlens_checks_every_page():
    q, kc, vc = rand(2, 1, 2, 16), rand(5, 4, 2, 16), rand(5, 4, 2, 16)
    bt = _i32(2, 0, 4, 1, 3, 99).view(2, 3)
    with pytest.raises(ValueError, match=r"block_table\[1\]\[2\]"):
        flash_attn_with_kvcache(q, kc, vc, block_table=bt)


def test_varlen_paged_errors():
    table, n = _block_table([5, 9], 0, 4)
    kp, vp = rand(n, 4, 2, 16), rand(n, 4, 2, 16)
    q = rand(3, 4, 16)
    cu_q, cu_k = _i32(0, 1, 3), _i32(0, 5, 14)
    with pytest.raises(ValueError, match="block_table must be int32"):
        flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 2, 9, block_table=table.long())
    with pytest.raises(ValueError, match="k must be 4-D"):
        flash_attn_varlen_func(q, kp[0], vp[0], cu_q, cu_k, 2, 9, block_table=table)
    with pytest.raises(ValueError, match="seqused_k must have shape"):
        flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 2, 9, block_table=table, seqused_k=_i32(1))
    with pytest.raises(ValueError, match=r"cu_seqlens_k: sequence 1 has 25 keys.*cu_seqlens_k is cu_seqlens_k"):
        flash_attn_varlen_func(q, kp, vp, cu_q, _i32(0, 5, 30), 2, 25, block_table=table)
    bad = table.clone()
    bad[1, 2] = n
    with pytest.raises(ValueError, match=r"kv_cache\.block_table\[1\]\[2\].*is block_table"):
        flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 2, 9, block_table=bad)
    with pytest.raises(ValueError, match=r"kv_cache\.seqlens\[1\].*seqused_k"):
        flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 2, 9, block_table=table, seqused_k=_i32(5, 10))


# ---- torch.compile and the custom ops ---------------------------------------------------------------------------


def _decode_step(q, kc, vc, k, v, sl, table, cos, sin):
    return flash_attn_with_kvcache(q, kc, vc, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=sl,
                                   block_table=table, causal=True, return_softmax_lse=True)


def test_compile_decode_step_fullgraph():
    try:
        torch._dynamo.reset()
        compiled = torch.compile(_decode_step, fullgraph=True)
        args = _decode_args(paged=True)
        cos, sin = _rotary_tables(32, 8, torch.float32)
        inputs = [args[n] for n in ("q", "k_cache", "v_cache", "k", "v", "cache_seqlens", "block_table")]
        eager_inputs = [t.clone() for t in inputs]
        out, lse = compiled(*inputs, cos, sin)
    except Exception as e:  # pragma: no cover - depends on the machine (inductor needs a C++ compiler)
        if "flashattn" in str(e):
            raise
        pytest.skip(f"torch.compile does not work on CPU here: {type(e).__name__}: {str(e)[:200]}")
    want, want_lse = _decode_step(*eager_inputs, cos, sin)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    assert torch.equal(inputs[1], eager_inputs[1]) and torch.equal(inputs[2], eager_inputs[2])  # appended in place
    # A second step (next token) reuses the graph and appends after the first.
    inputs[5] += 1
    eager_inputs[5] += 1
    out2, _ = compiled(*inputs, cos, sin)
    want2, _ = _decode_step(*eager_inputs, cos, sin)
    assert torch.equal(out2, want2) and torch.equal(inputs[1], eager_inputs[1])


def test_opcheck_ops():
    args = _decode_args(paged=True)
    q, kc, vc, k, v, sl, table = (args[n] for n in ("q", "k_cache", "v_cache", "k", "v", "cache_seqlens",
                                                     "block_table"))
    cos, sin = _rotary_tables(32, 8, torch.float32)
    auto = 0
    torch.library.opcheck(torch.ops.flashattn.fwd_kvcache_append.default,
                          (q, kc, vc, k, v, cos, sin, sl, None, _i32(1, 0), table, None, 0.25, True, -1, 0, 0.0, True,
                           0, True, auto))
    torch.library.opcheck(torch.ops.flashattn.fwd_kvcache.default,
                          (q, kc, vc, _i32(3, 4), None, None, table, None, None, None, 0, 0, 0.25, False, -1, -1, 0.0,
                           0, False, auto))
    varlen = (q[:, 0].clone(), kc.clone(), vc.clone(), None, None, None, table, None, _i32(0, 1, 2), _i32(0, 5, 14),
              1, 9, 0.25, True, -1, 0, 0.0, 0, True, auto)
    torch.library.opcheck(torch.ops.flashattn.fwd_kvcache.default, varlen)
    # With inputs that require grad: the autograd registration (its backward raises, so aot_dispatch's
    # backward comparison cannot run: test_varlen_paged_backward_raises covers that).
    grads = (varlen[0].requires_grad_(), varlen[1].requires_grad_()) + varlen[2:]
    torch.library.opcheck(torch.ops.flashattn.fwd_kvcache.default, grads,
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


# ---- the drop-in and CUDA -------------------------------------------------------------------------------------


def test_exports():
    assert flashattn.flash_attn_with_kvcache is flash_attn_with_kvcache
    assert "flash_attn_with_kvcache" in flashattn.__all__ and "flash_attn_with_kvcache" in flashattn.interface.__all__


def _to_cuda(kw, dtype):
    """The call's tensors on the GPU, the floating ones in `dtype` (ALiBi slopes stay float32)."""
    return {n: (t.cuda().to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() and n != "alibi_slopes"
                else t.cuda() if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("num_splits", [0, 1, 3])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_cuda_matches_reference(name, dtype, num_splits):
    """The CUDA paths on the host matrix's cases (split-KV off, forced, heuristic), against the fp64 reference."""
    kw = _to_cuda(_build(CASES[name], torch.float32), dtype)
    if kw["q"].shape[-1] % 8:
        pytest.skip("head dim not a multiple of 8: the CUDA paths refuse it for a KV cache (test below)")
    before_k, before_v = kw["k_cache"].clone(), kw["v_cache"].clone()
    out, lse = flash_attn_with_kvcache(**kw, num_splits=num_splits, return_softmax_lse=True)
    torch.cuda.synchronize()
    ref_kw = {n: (t.cpu() if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    ref_kw.update(k_cache=before_k.cpu(), v_cache=before_v.cpu())
    o64, lse64, kc64, vc64, written = kvcache_ref(**ref_kw, dt=torch.float64)
    olp, lselp, _, _, _ = kvcache_ref(**ref_kw, dt=dtype)
    check("out", out.cpu(), olp, o64, dtype)
    check("lse", lse.cpu(), lselp, lse64, dtype)
    for got, want in ((kw["k_cache"].cpu(), kc64), (kw["v_cache"].cpu(), vc64)):
        assert torch.equal(got[~written], want[~written])
        torch.testing.assert_close(got[written], want[written])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_refuses_unpaddable_headdim():
    args = _to_cuda(_decode_args(paged=True), torch.float16)
    args12 = {n: (torch.nn.functional.pad(t, (0, -4)) if n in ("q", "k", "v", "k_cache", "v_cache") else t)
              for n, t in args.items()}
    with pytest.raises(NotImplementedError, match="headdim 12"):
        flash_attn_with_kvcache(**args12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_decode_loop():
    """A whole decode step (append + attention over a paged cache, cache_seqlens advanced on the device)
    captured once in a CUDA graph and replayed for several tokens with fresh q/k/v: the same outputs and
    caches as the eager loop (issue 17 item 5)."""
    torch.manual_seed(0)
    b, hq, hk, d, page, steps = 3, 8, 2, 128, 16, 5
    lens = [40, 0, 300]
    table, n = _block_table(lens, steps, page)
    table = table.cuda()
    kc = torch.randn(n, page, hk, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    cos, sin = (t.cuda().to(torch.bfloat16) for t in _rotary_tables(max(lens) + steps + 2, d, torch.float32))
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q, k, v = (torch.empty(b, 1, h, d, device="cuda", dtype=torch.bfloat16) for h in (hq, hk, hk))
    tokens = [tuple(torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16) for h in (hq, hk, hk))
              for _ in range(steps)]

    def step():
        out = flash_attn_with_kvcache(q, kc, vc, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
                                      block_table=table, causal=True, rotary_interleaved=False)
        seqlens.add_(1)
        return out

    # Eager on copies first.
    kc0, vc0, sl0 = kc.clone(), vc.clone(), seqlens.clone()
    want = []
    for t in tokens:
        for dst, src in zip((q, k, v), t):
            dst.copy_(src)
        want.append(step().clone())
    want_k, want_v = kc.clone(), vc.clone()
    kc.copy_(kc0)
    vc.copy_(vc0)
    seqlens.copy_(sl0)
    # Capture (after a warm-up on a side stream, as torch recommends), then replay per token.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for dst, src in zip((q, k, v), tokens[0]):
            dst.copy_(src)
        step()
    torch.cuda.current_stream().wait_stream(s)
    kc.copy_(kc0)
    vc.copy_(vc0)
    seqlens.copy_(sl0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    kc.copy_(kc0)  # capture does not run the work, but start from the same state either way
    vc.copy_(vc0)
    seqlens.copy_(sl0)
    for i, t in enumerate(tokens):
        for dst, src in zip((q, k, v), t):
            dst.copy_(src)
        graph.replay()
        torch.testing.assert_close(out, want[i], rtol=0, atol=0)
    torch.cuda.synchronize()
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    assert seqlens.tolist() == [x + steps for x in lens]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_split_scratch_reused_per_stream():
    """Split-KV decode calls reuse one scratch buffer per stream (_ops._WS_REUSE): calls of two sizes back to back
    on one stream, interleaved with the same calls on a second stream, each equal (bit for bit) to the call with
    scratch of its own (reuse off); the stream's buffer survives the calls; a graph captured meanwhile takes
    scratch of its own and its replays, after eager calls that reuse the stream's buffer, give the eager result."""
    from flashattn import _ops

    torch.manual_seed(1)

    def problem(b, s):
        kc, vc = (torch.randn(b, s, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        return dict(q=torch.randn(b, 1, 8, 128, device="cuda", dtype=torch.bfloat16), k_cache=kc, v_cache=vc,
                    cache_seqlens=torch.tensor([s - 3 * i for i in range(b)], dtype=torch.int32, device="cuda"),
                    num_splits=5)

    calls = [problem(1, 700), problem(3, 4097)]
    saved = _ops._WS_REUSE_MAX_BYTES
    _ops._WS_REUSE_MAX_BYTES = 0  # scratch of its own per call
    try:
        want = [flash_attn_with_kvcache(**c) for c in calls]
    finally:
        _ops._WS_REUSE_MAX_BYTES = saved
    _ops._WS_REUSE.clear()
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    side.wait_stream(main)
    got, buffers = [], []
    for _ in range(3):
        for i, c in enumerate(calls):
            got.append((i, flash_attn_with_kvcache(**c)))
            with torch.cuda.stream(side):
                got.append((i, flash_attn_with_kvcache(**c)))
        buffers.append(sorted((k, v.data_ptr()) for k, v in _ops._WS_REUSE.items()))
    main.wait_stream(side)
    assert len(buffers[0]) == 2 and buffers[0] == buffers[1] == buffers[2]  # one per stream, kept
    for i, out in got:
        assert torch.equal(out, want[i])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = flash_attn_with_kvcache(**calls[0])
    assert sorted((k, v.data_ptr()) for k, v in _ops._WS_REUSE.items()) == buffers[0]
    for _ in range(2):
        flash_attn_with_kvcache(**calls[1])
        graph.replay()
        assert torch.equal(captured, want[0])
