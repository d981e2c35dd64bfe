"""Plain-torch attention used as the oracle (float64) and as the "standard attention at the input
precision" that sets the tolerance: our max error must be <= 2 x that one's + atol (the
FlashAttention test rule)."""

import torch

ATOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-4, torch.bfloat16: 1e-3}


def allowed_mask(sq, sk, causal=False, window=(-1, -1), device="cpu"):
    """[sq, sk] bool: query i sees key j (bottom-right aligned, as flash_attn)."""
    left, right = window
    if causal:
        right = 0
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    off = sk - sq
    m = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        m &= j >= i + off - left
    if right >= 0:
        m &= j <= i + off + right
    return m


def attention_ref(q, k, v, causal=False, window=(-1, -1), softcap=0.0, scale=None, dtype=None, alibi_slopes=None,
                  keep=None, dropout_scale=1.0):
    """q [b, sq, h, d], k/v [b, sk, hk, d] -> (out [b, sq, h, d], lse [b, h, sq]), computed in `dtype`.
    alibi_slopes: [h] or [b, h], S -= slope * |i + sk - sq - j| after the softcap (flash_attn's ALiBi).
    keep: bool [b, h, sq, sk] dropout mask; kept probabilities are scaled by dropout_scale (the LSE is not)."""
    dt = dtype or q.dtype
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(h // hk, dim=2)
    v = v.repeat_interleave(h // hk, dim=2)
    scale = d ** -0.5 if scale is None else scale
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        rel = (torch.arange(sq, device=q.device)[:, None] + (sk - sq) - torch.arange(sk, device=q.device)[None, :])
        s = s - alibi_slopes.to(dt).view(-1, h, 1, 1) * rel.abs().to(dt)
    mask = allowed_mask(sq, sk, causal, window, q.device)
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s.float() if dt != torch.float64 else s, dim=-1)
    p = torch.softmax(s, dim=-1)
    p = torch.where(mask.any(-1)[:, None], p, torch.zeros((), dtype=p.dtype, device=p.device))
    if keep is not None:
        p = torch.where(keep.to(p.device), p * dropout_scale, torch.zeros((), dtype=p.dtype, device=p.device))
    out = torch.einsum("bhqk,bkhd->bqhd", p.to(dt), v)
    return out, lse


def varlen_ref(q, k, v, cu_q, cu_k, alibi_slopes=None, keep=None, **kw):
    """Packed q [tq, h, d], k/v [tk, hk, d]: the fixed-length reference per sequence. alibi_slopes [h] or
    [batch, h]; keep [batch, h, max_sq, max_sk] (sequence b uses keep[b, :, :len_q, :len_k])."""
    outs, lses = [], []
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        lq, lk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
        extra = {}
        if alibi_slopes is not None:
            extra["alibi_slopes"] = alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b:b + 1]
        if keep is not None:
            extra["keep"] = keep[b:b + 1, :, :lq, :lk]
        o, l = attention_ref(q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]], **kw,
                             **extra)
        outs.append(o[0])
        lses.append(l[0])
    return torch.cat(outs, 0), torch.cat(lses, 1)


def max_err(a, b):
    a, b = a.double(), b.double()
    both_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    d = torch.where(both_inf, torch.zeros_like(a), (a - b).abs())
    return d.max().item() if d.numel() else 0.0


def check(name, ours, lowp, oracle, dtype, atol=None):
    """The FlashAttention rule: max|ours - oracle| <= 2 max|lowp - oracle| + atol (NaN fails)."""
    assert ours.shape == oracle.shape, f"{name}: shape {tuple(ours.shape)} != {tuple(oracle.shape)}"
    atol = ATOL[dtype] if atol is None else atol
    finite = oracle[torch.isfinite(oracle)]
    scale = max(1.0, finite.abs().max().item()) if finite.numel() else 1.0
    atol = atol * scale  # relative to the magnitude of the values compared
    err = max_err(ours, oracle)
    ref = max_err(lowp, oracle)
    tol = 2 * ref + atol
    assert err <= tol, f"{name}: max error {err:.3g} > 2 x {ref:.3g} (torch at {dtype}) + {atol:g}"


def rand(*shape, dtype=torch.float32, device="cpu", outliers=True):
    """Normal values with a few outliers (x8), never all zeros."""
    x = torch.randn(*shape, device=device, dtype=torch.float32)
    if outliers and x.numel() > 8:
        idx = torch.randint(0, x.numel(), (max(1, x.numel() // 200),), device=device)
        x.view(-1)[idx] *= 8
    return x.to(dtype)


def run_case(b, sq, sk, h, hk, d, dtype, causal=False, window=(-1, -1), softcap=0.0, scale=None,
             backward=True, deterministic=False, device="cpu", backend="auto"):
    """Forward (+ backward through autograd) of flashattn vs the oracle, with the tolerance rule."""
    from flashattn.interface import _flash_attn

    q = rand(b, sq, h, d, dtype=dtype, device=device).requires_grad_()
    k = rand(b, sk, hk, d, dtype=dtype, device=device).requires_grad_()
    v = rand(b, sk, hk, d, dtype=dtype, device=device).requires_grad_()
    out, lse, probs = _flash_attn(q, k, v, softmax_scale=scale, causal=causal, window_size=window, softcap=softcap,
                                  deterministic=deterministic, return_attn_probs=True, backend=backend)
    assert probs is None
    assert out.dtype == dtype and out.shape == q.shape
    # float64 inputs get a float64 LSE (except on the tiled cpu backend); every other dtype float32.
    lse_dtype = torch.float64 if dtype == torch.float64 and backend != "cpu" else torch.float32
    assert lse.dtype == lse_dtype and lse.shape == (b, h, sq)
    kw = dict(causal=causal, window=window, softcap=softcap, scale=scale)
    leaves64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    leaves_lp = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o64, lse64 = attention_ref(*leaves64, **kw)
    olp, lselp = attention_ref(*leaves_lp, **kw)
    # fp64 inputs: the tiled CPU path accumulates in fp32 (only the reference backend, which
    # auto picks, accumulates in fp64), so expect fp32-level agreement; tests/python/
    # test_lse_fp64.py checks the fp64 path to fp64 precision.
    fp32_floor = ATOL[torch.float32] if dtype == torch.float64 else None
    check("out", out, olp, o64, dtype, atol=fp32_floor)
    check("lse", lse, lselp, lse64, dtype, atol=fp32_floor)
    if not backward:
        return
    dout = rand(*out.shape, dtype=dtype, device=device)
    g = torch.autograd.grad(out, (q, k, v), dout)
    g64 = torch.autograd.grad(o64, leaves64, dout.double())
    glp = torch.autograd.grad(olp, leaves_lp, dout)
    for name, a, lp, o in zip(("dq", "dk", "dv"), g, glp, g64):
        assert a.shape == o.shape
        check(name, a, lp, o, dtype, atol=fp32_floor)
