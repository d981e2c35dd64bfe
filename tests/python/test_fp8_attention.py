"""FP8 (E4M3) attention through the Python API (issue 16, host part).

flash_attn_func / flash_attn_varlen_func on torch.float8_e4m3fn q, k, v with float32 scales must equal
float64 attention of the inputs dequantized here in pure torch (code * scale of its block), rounded
once to the output dtype. flashattn.fp8.flash_attn_fp8_func (quantize with the Hadamard transform,
then attend) must approximate attention of the unquantized inputs within the error model stated in
test_fp8_func_error_within_the_model; a mismatched transform must break that bound. Forward only:
autograd, dropout and the KV cache are refused by name; so are bad scales. Fresh random inputs per
run: FLASHATTN_TEST_SEED=<seed> reproduces a failure.
"""

import math
import os

import pytest
import torch

from flashattn import flash_attn_func, flash_attn_varlen_func, fp8
from flashattn.interface import _flash_attn, _Fp8Args
from ref import attention_ref, varlen_ref

SEED = int(os.environ.get("FLASHATTN_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
E4M3 = torch.float8_e4m3fn
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def _gen(tag):
    return torch.Generator().manual_seed(SEED * 1000 + tag)


def _codes(shape, g):
    """E4M3 tensors spanning the format: N(0, 60) rounded (saturating at 448, a few subnormals)."""
    return (torch.randn(shape, generator=g) * 60).clamp(-448, 448).to(E4M3)


def _scales(b, h, nblocks, g):
    """Scales spread over 2^5 (as the C++ test): reading another block's or head's scale shows."""
    u = 0.5 + 0.5 * torch.rand(b, h, nblocks, generator=g)
    e = torch.randint(-2, 3, (b, h, nblocks), generator=g).float()
    return (u * torch.exp2(e) / 60).float()


def _dequantize(x, scale, block):
    """Pure torch: [b, s, h, d] codes * scale[b, h, row // block] in float64 (exact)."""
    s = x.shape[1]
    per_row = scale.double()[:, :, torch.arange(s) // block]  # [b, h, s]
    return x.double() * per_row.permute(0, 2, 1).unsqueeze(-1)


def _expect_one_rounding(out, want, dtype):
    """out == want rounded to dtype: |out - want| <= u |want| (+ fp16's subnormal half-step, + fp64 noise)."""
    assert out.dtype == dtype
    err = (out.double() - want).abs()
    tol = UNIT_ROUNDOFF[dtype] * want.abs() * (1 + 1e-9) + (2.0**-25 if dtype == torch.float16 else 0) + 1e-12
    bad = err > tol
    assert not torch.isnan(out).any()
    assert not bad.any(), f"seed {SEED}: {int(bad.sum())} elements off by more than one rounding (max err {err.max():.3g})"


def _case_inputs(case, seed):
    """Random E4M3 codes q, k, v and their block scales for a CASES / VT_CASES row."""
    b, sq, sk, hq, hk, d, qb, kb = case[:8]
    g = _gen(seed)
    q, k, v = _codes((b, sq, hq, d), g), _codes((b, sk, hk, d), g), _codes((b, sk, hk, d), g)
    nq, nk = -(-sq // qb), -(-sk // kb)
    return q, k, v, _scales(b, hq, nq, g), _scales(b, hk, nk, g), _scales(b, hk, nk, g)


CASES = [
    # (batch, sq, sk, hq, hk, d, q_block, k_block, causal, window, softcap, out_dtype)
    (2, 7, 113, 4, 2, 64, 1, 7, False, (-1, -1), 0.0, torch.bfloat16),
    (1, 113, 7, 2, 2, 32, 128, 1, True, (-1, -1), 0.0, torch.float16),
    (1, 1, 799, 3, 1, 64, 1000, 128, False, (-1, -1), 5.0, torch.bfloat16),
    (2, 113, 40, 2, 1, 16, 7, 2**31 - 1, False, (16, 4), 0.0, torch.bfloat16),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"sq{c[1]}-sk{c[2]}-qb{c[6]}-kb{c[7]}")
def test_equals_fp64_attention_of_the_dequantized_inputs(case):
    b, sq, sk, hq, hk, d, qb, kb, causal, window, softcap, out_dtype = case
    q, k, v, qs, ks, vs = _case_inputs(case, seed=1)
    out, lse, probs = flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap, q_scale=qs,
                                      k_scale=ks, v_scale=vs, q_block_size=qb, k_block_size=kb, out_dtype=out_dtype,
                                      return_attn_probs=True)
    want, want_lse = attention_ref(_dequantize(q, qs, qb), _dequantize(k, ks, kb), _dequantize(v, vs, kb),
                                   causal=causal, window=window, softcap=softcap, scale=float(torch.tensor(d ** -0.5)),
                                   dtype=torch.float64)
    _expect_one_rounding(out, want, out_dtype)
    assert lse.dtype == torch.float32 and probs is None
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    torch.testing.assert_close(lse[finite].double(), want_lse[finite], rtol=2.0**-23, atol=1e-12)


def test_scale_forms_and_fa3_names():
    """Per-tensor (() / (1,)), per-head ((b, h), (b, h, 1)), FA3's q_descale (b, nheads_k) for GQA, and block
    scales mixed with per-head ones inside the k/v pair: each equals the oracle on the scales it stands for."""
    g = _gen(2)
    b, sq, sk, hq, hk, d = 2, 33, 20, 4, 2, 32
    q, k, v = _codes((b, sq, hq, d), g), _codes((b, sk, hk, d), g), _codes((b, sk, hk, d), g)
    t = torch.tensor(0.013)
    per_group = _scales(b, hk, 1, g)[..., 0]  # FA3: one q scale per (batch, kv head)
    k_blocks = _scales(b, hk, -(-sk // 8), g)
    v_head = _scales(b, hk, 1, g)[..., 0]
    out = flash_attn_func(q, k, v, q_descale=per_group, k_descale=k_blocks, v_descale=v_head, k_block_size=8)
    q_full = per_group.repeat_interleave(hq // hk, dim=1).unsqueeze(-1)
    want, _ = attention_ref(_dequantize(q, q_full, sq), _dequantize(k, k_blocks, 8),
                            _dequantize(v, v_head.unsqueeze(-1), sk), dtype=torch.float64,
                            scale=float(torch.tensor(d ** -0.5)))
    _expect_one_rounding(out, want, torch.bfloat16)
    for q_scale in (t, t.reshape(1), t.expand(b, hq), t.expand(b, hq, 1)):
        out = flash_attn_func(q, k, v, q_scale=q_scale, k_scale=t.reshape(1), v_scale=t, out_dtype=torch.float16)
        want, _ = attention_ref(q.double() * float(t), k.double() * float(t), v.double() * float(t),
                                dtype=torch.float64, scale=float(torch.tensor(d ** -0.5)))
        _expect_one_rounding(out, want, torch.float16)


def _fast_and_checked_calls(device):
    """The same FP8 attention through the per-call fast path (block scales already in the C layout, no LSE asked
    for: the library gets a NULL lse) and through the checked path (the same scales as a non-contiguous view, LSE
    returned): the outputs must agree bit for bit. Also per-head scales in the C layout ((b, h, 1)) against (b, h)."""
    g = _gen(21)
    b, sq, sk, hq, hk, d, qb, kb = 2, 150, 300, 4, 2, 64, 64, 128  # block sizes the sm90 kernel takes
    q, k, v = (t.to(device) for t in (_codes((b, sq, hq, d), g), _codes((b, sk, hk, d), g), _codes((b, sk, hk, d), g)))
    qs, ks, vs = (t.to(device) for t in (_scales(b, hq, -(-sq // qb), g), _scales(b, hk, -(-sk // kb), g),
                                         _scales(b, hk, -(-sk // kb), g)))
    kw = dict(causal=True, q_block_size=qb, k_block_size=kb)
    fast = flash_attn_func(q, k, v, q_scale=qs, k_scale=ks, v_scale=vs, **kw)

    def strided(t):  # the same values behind a non-contiguous view
        return t.transpose(0, 1).contiguous().transpose(0, 1)

    assert not strided(qs).is_contiguous()
    checked, lse, _ = flash_attn_func(q, k, v, q_scale=strided(qs), k_scale=strided(ks), v_scale=strided(vs),
                                      return_attn_probs=True, **kw)
    assert torch.equal(fast, checked) and torch.isfinite(lse).all()
    head_q, head_k, head_v = (t[..., :1].contiguous() for t in (qs, ks, vs))
    fast = flash_attn_func(q, k, v, q_scale=head_q, k_scale=head_k, v_scale=head_v)
    checked = flash_attn_func(q, k, v, q_scale=head_q[..., 0], k_scale=head_k[..., 0], v_scale=head_v[..., 0])
    assert torch.equal(fast, checked)
    # A scale the fast path does not take (float64) gets the checked path's error naming it.
    with pytest.raises(ValueError, match="k_scale must be float32"):
        flash_attn_func(q, k, v, q_scale=qs, k_scale=ks.double(), v_scale=vs, **kw)


def test_fast_path_equals_the_checked_path():
    _fast_and_checked_calls("cpu")


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs an sm90 GPU")
def test_cuda_fast_path_equals_the_checked_path():
    _fast_and_checked_calls("cuda")


def test_varlen_blocks_start_at_each_sequence():
    g = _gen(3)
    lens_q, lens_k, hq, hk, d, qb, kb = [1, 7, 113], [113, 7, 40], 2, 1, 32, 7, 16
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    q, k, v = _codes((1, sum(lens_q), hq, d), g)[0], _codes((1, sum(lens_k), hk, d), g)[0], _codes((1, sum(lens_k), hk, d), g)[0]
    nb, mq, mk = len(lens_q), max(lens_q), max(lens_k)
    qs, ks, vs = _scales(nb, hq, -(-mq // qb), g), _scales(nb, hk, -(-mk // kb), g), _scales(nb, hk, -(-mk // kb), g)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True, q_scale=qs, k_scale=ks, v_scale=vs,
                                 q_block_size=qb, k_block_size=kb)
    # Dequantize each sequence with its own row of scales, blocks counted from its first row.
    deq = []
    for x, cu, sc, blk in ((q, cu_q, qs, qb), (k, cu_k, ks, kb), (v, cu_k, vs, kb)):
        parts = [_dequantize(x[cu[i]:cu[i + 1]].unsqueeze(0), sc[i:i + 1], blk)[0] for i in range(nb)]
        deq.append(torch.cat(parts))
    want, _ = varlen_ref(*deq, cu_q, cu_k, causal=True, dtype=torch.float64, scale=float(torch.tensor(d ** -0.5)))
    _expect_one_rounding(out, want, torch.bfloat16)


def _model_rmse(q, k, v, rho, out_unit_roundoff, softmax_scale):
    """The error model of quantized attention (see test_fp8_func_error_within_the_model), from the exact
    attention of the unquantized inputs: sqrt(mean over (b, i, h, c) of
        sum_j P_ij^2 (var(dS_ij) (v_jc - O_ic)^2 + rho^2 v_jc^2) + (u O_ic)^2 / 3),
    var(dS_ij) = 2 rho^2 softmax_scale^2 (|q_i|^2 |k_j|^2 + 2 (q_i . k_j)^2) / (d + 2)."""
    q, k, v = q.double(), k.double(), v.double()
    h, hk, d = q.shape[2], k.shape[2], q.shape[3]
    k, v = k.repeat_interleave(h // hk, dim=2), v.repeat_interleave(h // hk, dim=2)
    dot = torch.einsum("bqhd,bkhd->bhqk", q, k)
    p = torch.softmax(dot * softmax_scale, dim=-1)
    o = torch.einsum("bhqk,bkhd->bhqd", p, v)
    qq, kk = q.pow(2).sum(-1).permute(0, 2, 1), k.pow(2).sum(-1).permute(0, 2, 1)  # [b, h, s]
    var_s = 2 * rho**2 * softmax_scale**2 * (qq[..., :, None] * kk[..., None, :] + 2 * dot.pow(2)) / (d + 2)
    vt = v.permute(0, 2, 1, 3)  # [b, h, sk, d]
    p2 = p.pow(2)
    # sum_j p2 var_s (v_j - o)^2 = sum_j p2 var_s v_j^2 - 2 o sum_j p2 var_s v_j + o^2 sum_j p2 var_s
    w = p2 * var_s
    score_term = (torch.einsum("bhqk,bhkd->bhqd", w, vt.pow(2)) - 2 * o * torch.einsum("bhqk,bhkd->bhqd", w, vt)
                  + o.pow(2) * w.sum(-1, keepdim=True))
    v_term = rho**2 * torch.einsum("bhqk,bhkd->bhqd", p2, vt.pow(2))
    out_term = (out_unit_roundoff * o).pow(2) / 3
    return math.sqrt(float((score_term + v_term + out_term).mean()))


def _fp8_case(tag, b=2, s=256, h=2, d=64):
    g = _gen(tag)
    return [torch.randn(b, s, h, d, generator=g, dtype=torch.float64) for _ in range(3)]


def test_fp8_func_error_within_the_model():
    """flash_attn_fp8_func(q, k, v) (Hadamard, block 128) against attention of the unquantized inputs.

    The model: a quantized element is x (1 + e) with |e| <= 2^-4 (half an E4M3 step; block scaling keeps
    every element of these inputs in the normal range), so e has RMS rho <= 2^-4 / sqrt(3), independently
    per element. In the transformed domain (orthogonal: q' . k' = q . k) a score moves by
    dS = scale * sum_c (e_qc + e_kc) q'_c k'_c, of variance 2 rho^2 scale^2 sum_c q'_c^2 k'_c^2, which a
    random Hadamard rotation spreads to 2 rho^2 scale^2 (|q|^2 |k|^2 + 2 (q . k)^2) / (d + 2) on average.
    To first order O_i moves by sum_j P_ij (dS_ij (v_j - O_i) + dv_j), so its mean square is the sum in
    _model_rmse, plus the output's rounding (RMS u |O| / sqrt 3). The measured RMSE must stay within
    1.5 x the model's (measured/model is about 0.72 for fp8 and for bf16 alike: rho is an upper bound), both against fp64 attention and
    against bf16 attention of the originals (whose own error adds the same model with rho = 2^-8 / sqrt 3).
    """
    q, k, v = _fp8_case(4)
    d = q.shape[-1]
    with torch.no_grad():
        out = fp8.flash_attn_fp8_func(q, k, v, hadamard=True, block_size=128, seed=7)
        exact = flash_attn_func(q, k, v)
        bf16 = flash_attn_func(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert out.dtype == torch.bfloat16
    rho8, rho16 = 2.0**-4 / math.sqrt(3), 2.0**-8 / math.sqrt(3)
    model = _model_rmse(q, k, v, rho8, 2.0**-8, d ** -0.5)
    model_bf16 = _model_rmse(q, k, v, rho16, 2.0**-8, d ** -0.5)
    rmse = float((out.double() - exact).pow(2).mean().sqrt())
    rmse_vs_bf16 = float((out.double() - bf16.double()).pow(2).mean().sqrt())
    assert rmse <= 1.5 * model, f"seed {SEED}: RMSE {rmse:.3g} > 1.5 x model {model:.3g}"
    assert rmse_vs_bf16 <= 1.5 * (model + model_bf16), f"seed {SEED}: RMSE vs bf16 {rmse_vs_bf16:.3g}"
    # Not vacuous: quantization did happen (FP8 is clearly worse than bf16's own error) ...
    assert rmse > 4 * float((bf16.double() - exact).pow(2).mean().sqrt())
    # ... and a K transformed with another seed (its transform no longer cancels Q's) breaks the bound.
    with torch.no_grad():
        qf, qs = fp8.quantize(q, block_size=128, hadamard=True, seed=7)
        kf, ks = fp8.quantize(k, block_size=128, hadamard=True, seed=8)
        vf, vs = fp8.quantize(v, block_size=128)
        wrong = flash_attn_func(qf, kf, vf, q_scale=qs, k_scale=ks, v_scale=vs)
    assert float((wrong.double() - exact).pow(2).mean().sqrt()) > 1.5 * model


def test_fp8_func_equals_the_dequantized_attention():
    """flash_attn_fp8_func = attention of flashattn.fp8.dequantize's output (the transform undone: the scores
    are those of the transformed, quantized Q and K), to the output's rounding and fp32 dequantization."""
    q, k, v = _fp8_case(5, b=1, s=77, h=2, d=32)
    out, lse, _ = fp8.flash_attn_fp8_func(q, k, v, block_size=16, seed=3, causal=True, out_dtype=torch.float16,
                                          return_attn_probs=True)
    qf, qs = fp8.quantize(q, block_size=16, hadamard=True, seed=3)
    kf, ks = fp8.quantize(k, block_size=16, hadamard=True, seed=3)
    vf, vs = fp8.quantize(v, block_size=16)
    # Dequantized in the transformed domain (exact), where the dot products are those the kernel sees.
    want, want_lse = attention_ref(_dequantize(qf, qs, 16), _dequantize(kf, ks, 16), _dequantize(vf, vs, 16),
                                   causal=True, dtype=torch.float64, scale=float(torch.tensor(32 ** -0.5)))
    _expect_one_rounding(out, want, torch.float16)
    torch.testing.assert_close(lse.double(), want_lse, rtol=2.0**-23, atol=1e-12)


# ---- refused calls ---------------------------------------------------------------------------------


def _small(g=None, dtype=E4M3):
    g = g or _gen(6)
    q, k, v = _codes((1, 9, 2, 16), g), _codes((1, 12, 1, 16), g), _codes((1, 12, 1, 16), g)
    if dtype != E4M3:
        q, k, v = (t.to(dtype) for t in (q, k, v))
    one = torch.ones(1, 2, 1), torch.ones(1, 1, 1), torch.ones(1, 1, 1)
    return (q, k, v), dict(zip(("q_scale", "k_scale", "v_scale"), one))


@pytest.mark.parametrize("change, exc, match", [
    (lambda a, kw: kw.pop("q_scale"), ValueError, "q_scale .FA3: q_descale. is required"),
    (lambda a, kw: kw.pop("v_scale"), ValueError, "v_scale"),
    (lambda a, kw: kw.update(k_scale=torch.ones(1, 1, 5)), ValueError, "k_scale has shape"),
    (lambda a, kw: kw.update(q_scale=torch.ones(1, 3)), ValueError, "q_scale has shape"),
    (lambda a, kw: kw.update(q_scale=torch.ones(1, 2, 1, dtype=torch.float16)), ValueError, "q_scale must be float32"),
    (lambda a, kw: kw.update(v_scale=1.0), ValueError, "v_scale must be a float32 torch.Tensor"),
    (lambda a, kw: kw.update(q_descale=torch.ones(1, 2, 1)), ValueError, "q_scale and q_descale"),
    (lambda a, kw: kw.update(out_dtype=torch.float32), ValueError, "out_dtype"),
    (lambda a, kw: kw.update(q_block_size=0), ValueError, "q_block_size"),
    (lambda a, kw: kw.update(k_block_size=1.5), ValueError, "k_block_size"),
    (lambda a, kw: kw.update(dropout_p=0.1), NotImplementedError, "dropout_p"),
    (lambda a, kw: a.__setitem__(1, a[1].bfloat16()), ValueError, "float8_e4m3fn"),
])
def test_refused_arguments_are_named(change, exc, match):
    args, kw = _small()
    args = list(args)
    change(args, kw)
    with pytest.raises(exc, match=match):
        flash_attn_func(*args, **kw)


def test_fp8_arguments_with_16_bit_inputs_are_refused():
    (q, k, v), kw = _small(dtype=torch.bfloat16)
    for name in ("q_scale", "k_descale", "out_dtype"):
        with pytest.raises(ValueError, match=f"{name.replace('descale', 'scale')} is for float8_e4m3fn inputs"):
            flash_attn_func(q, k, v, **{name: torch.bfloat16 if name == "out_dtype" else torch.ones(1)})


def test_forward_only():
    (q, k, v), kw = _small()
    kw["q_scale"].requires_grad_(True)
    with pytest.raises(RuntimeError, match="forward-only"):
        flash_attn_func(q, k, v, **kw)
    with torch.no_grad():
        out = flash_attn_func(q, k, v, **kw)
    assert not out.requires_grad
    x = torch.randn(1, 9, 2, 16, requires_grad=True)
    with pytest.raises(RuntimeError, match="forward-only"):
        fp8.flash_attn_fp8_func(x, x, x)


def test_cpu_backend_refuses_fp8_by_name():
    (q, k, v), kw = _small()
    with pytest.raises(NotImplementedError, match="dtype: fp8_e4m3 is not supported by the cpu backend"):
        _flash_attn(q, k, v, backend="cpu", fp8=_Fp8Args(**kw))


def test_opcheck_fwd_fp8():
    (q, k, v), kw = _small()
    args = (q, k, v, kw["q_scale"], kw["k_scale"], kw["v_scale"], None, None, 0, 0, 9, 12, 0.25, True, -1, 0, 0.0,
            None, torch.float16, 0)
    # test_schema multiplies the inputs, which torch does not implement for float8 tensors.
    torch.library.opcheck(torch.ops.flashattn.fwd_fp8.default, args, test_utils=("test_faketensor",))


# ---- v_layout="keys_permuted16": V^T with the keys permuted in groups of 16 ----------------------------


def _perm16(k):
    """The definition in flashattn.h: key k = 8 k3 + 4 k2 + 2 k1 + k0 of a group sits at 8 k2 + 4 k1 + 2 k3 + k0."""
    k3, k2, k1, k0 = (k >> 3) & 1, (k >> 2) & 1, (k >> 1) & 1, k & 1
    return 8 * k2 + 4 * k1 + 2 * k3 + k0


def _nonzero_codes(shape, g):
    """_codes without zero codes, so that a zero in the layout can only be padding."""
    x = _codes(shape, g).view(torch.uint8)
    return torch.where((x & 0x7F) == 0, torch.full_like(x, 0x38), x).view(E4M3)  # 0x38: 1.0


def _vt_rows(vt):
    """The V^T storage behind a keys_permuted16 view: uint8 [b, h, d, L] (L = vt.stride(3))."""
    b, _, h, d = vt.shape
    L = vt.stride(3)
    return torch.as_strided(vt, (b, h, d, L), (vt.stride(0), vt.stride(2), L, 1)).view(torch.uint8)


def test_perm16_examples():
    # Hand-checked against the bit formula: k1 -> 4, k2 -> 8, k3 -> 2, k0 stays.
    assert [_perm16(k) for k in range(16)] == [0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15]


@pytest.mark.parametrize("s", [1, 7, 16, 113])
@pytest.mark.parametrize("row_len", [None, "+32"])
def test_keys_permuted16_layout_is_the_definition(s, row_len):
    g = _gen(7)
    b, h, d = 2, 3, 5
    # A strided input (a transposed [b, h, s, d] buffer): the helper reads v through its strides.
    v = _nonzero_codes((b, h, s, d), g).transpose(1, 2)
    L = -(-s // 16) * 16 + (32 if row_len else 0)
    vt = fp8.keys_permuted16(v, row_len=L if row_len else None)
    assert vt.dtype == E4M3 and vt.shape == v.shape and vt.device == v.device
    assert vt.stride() == (h * d * L, 1, d * L, L)
    rows, codes = _vt_rows(vt), v.view(torch.uint8)
    assert rows.shape == (b, h, d, L)
    # A few elements by index.
    for (bi, j, hi, c) in [(0, 0, 0, 0), (1, s - 1, 2, 4), (0, s // 2, 1, 3), (1, min(s - 1, 9), 0, 1)]:
        assert rows[bi, hi, c, 16 * (j // 16) + _perm16(j % 16)] == codes[bi, j, hi, c], (bi, j, hi, c)
    # Every key, and zeros everywhere else.
    want = torch.zeros(b, h, d, L, dtype=torch.uint8)
    for j in range(s):
        want[:, :, :, 16 * (j // 16) + _perm16(j % 16)] = codes[:, j]
    assert torch.equal(rows, want)
    holds_key = {16 * (j // 16) + _perm16(j % 16) for j in range(s)}
    assert len(holds_key) == s  # a permutation: no two keys share a position
    pads = [p for p in range(L) if p not in holds_key]
    assert (rows[..., pads] == 0).all()


def test_keys_permuted16_refuses_bad_arguments():
    v = _nonzero_codes((1, 20, 1, 16), _gen(8))
    for bad in (16, 40, 33.0, True):  # 16 < 20 rounded up to 32; 40 is no multiple of 16
        with pytest.raises(ValueError, match="row_len"):
            fp8.keys_permuted16(v, row_len=bad)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8.keys_permuted16(v.float())
    with pytest.raises(ValueError, match="4 dims"):
        fp8.keys_permuted16(v[0])


_QUANT_DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _QUANT_DEVICES)
@pytest.mark.parametrize("s, d, block, dtype", [(1, 64, 128, torch.bfloat16), (7, 16, 7, torch.float32),
                                                (113, 64, 16, torch.float16), (300, 128, 128, torch.bfloat16),
                                                (799, 40, 256, torch.bfloat16)])
def test_quantize_keys_permuted16_is_the_conversion_of_rows(device, s, d, block, dtype):
    """quantize(x, layout="keys_permuted16") writes in one pass what keys_permuted16(quantize(x)) writes in two: the
    same storage bytes (keyless positions 0), the same scales, the handle's strides; dequantize reads it back to the
    rows' values."""
    g = _gen(30)
    b, h = 2, 3
    x = (torch.randn(b, s, h, d, generator=g) * 3).to(dtype).to(device)
    rows, sc_rows = fp8.quantize(x, block_size=block)
    vt, sc_vt = fp8.quantize(x, block_size=block, layout="keys_permuted16")
    L = -(-s // 16) * 16
    assert vt.dtype == E4M3 and vt.shape == x.shape and vt.stride() == (h * d * L, 1, d * L, L)
    assert torch.equal(sc_vt, sc_rows)
    assert torch.equal(_vt_rows(vt), _vt_rows(fp8.keys_permuted16(rows)))
    # Dequantized on the host (a copy of the handle would read positions, not keys: move its storage).
    vt_host = torch.as_strided(_vt_rows(vt).cpu().view(E4M3), vt.shape, vt.stride())
    back = fp8.dequantize(vt_host, sc_vt.cpu(), block, layout="keys_permuted16")
    assert torch.equal(back, fp8.dequantize(rows.cpu(), sc_rows.cpu(), block))
    assert not torch.isnan(back).any()


def test_quantize_layout_is_checked_by_name():
    x = torch.randn(1, 20, 2, 16)
    for bad in ("cols", "keys_permuted", 1, None):
        with pytest.raises(ValueError, match="quantize: layout must be"):
            fp8.quantize(x, layout=bad)
        with pytest.raises(ValueError, match="dequantize: layout must be"):
            fp8.dequantize(fp8.quantize(x)[0], fp8.quantize(x)[1], 128, layout=bad)
    # A rows tensor passed as keys_permuted16: its strides are refused by the C call, by name.
    q, sc = fp8.quantize(x)
    with pytest.raises(ValueError, match="x_fp8.stride"):
        fp8.dequantize(q, sc, 128, layout="keys_permuted16")


VT_CASES = [
    # (batch, sq, sk, hq, hk, d, q_block, k_block, causal, window, softcap, out_dtype)
    (2, 7, 1, 4, 2, 32, 128, 128, False, (-1, -1), 0.0, torch.bfloat16),
    (1, 113, 7, 6, 2, 16, 7, 3, True, (-1, -1), 0.0, torch.float16),
    (2, 33, 113, 4, 1, 64, 16, 7, False, (20, 3), 5.0, torch.bfloat16),
    (1, 1, 113, 2, 2, 24, 1, 2**31 - 1, False, (-1, -1), 0.0, torch.float16),
]


@pytest.mark.parametrize("case", VT_CASES, ids=lambda c: f"sq{c[1]}-sk{c[2]}-h{c[3]}/{c[4]}-d{c[5]}")
def test_keys_permuted16_gives_the_rows_result_bit_for_bit(case):
    b, sq, sk, hq, hk, d, qb, kb, causal, window, softcap, out_dtype = case
    q, k, v, qs, ks, vs = _case_inputs(case, seed=9)
    kw = dict(causal=causal, window_size=window, softcap=softcap, q_scale=qs, k_scale=ks, v_scale=vs,
              q_block_size=qb, k_block_size=kb, out_dtype=out_dtype, return_attn_probs=True)
    out, lse, _ = flash_attn_func(q, k, v, **kw)
    for row_len in (None, -(-sk // 16) * 16 + 48):
        vt = fp8.keys_permuted16(v, row_len=row_len)
        out_t, lse_t, _ = flash_attn_func(q, k, vt, v_layout="keys_permuted16", **kw)
        assert torch.equal(out_t, out), f"seed {SEED}: row_len {row_len}"
        assert torch.equal(lse_t, lse), f"seed {SEED}: row_len {row_len}"
    assert not torch.isnan(out).any()


def test_keys_permuted16_padded_head_dim_copy():
    """The CUDA path pads the head dim (to 16 bytes) as for q and k: the V^T copy keeps the layout, adds zero
    columns, and keeps the keys past the view's seqlen (a .contiguous() of the view would drop them)."""
    from flashattn import _ops

    v = _nonzero_codes((2, 7, 3, 5), _gen(10))
    vt = fp8.keys_permuted16(v)
    padded = _ops._v_keys_permuted16(vt, 11)
    assert padded.shape == (2, 7, 3, 16) and padded.stride() == (3 * 16 * 16, 1, 16 * 16, 16)
    rows = _vt_rows(padded)
    assert torch.equal(rows[:, :, :5], _vt_rows(vt)) and (rows[:, :, 5:] == 0).all()
    assert _ops._v_keys_permuted16(vt, 0) is vt  # host tensors, nothing to pad: v itself


def test_keys_permuted16_refusals_name_v_layout():
    (q, k, v), kw = _small()
    vt = fp8.keys_permuted16(v)
    with pytest.raises(ValueError, match="v_layout='keys_permuted16' needs v as flashattn.fp8.keys_permuted16"):
        flash_attn_func(q, k, v, v_layout="keys_permuted16", **kw)  # a plain contiguous v
    # V^T (keys contiguous) but with rows of 12 keys: no multiple of 16, and shorter than seqlen_k rounded up.
    rows12 = v.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    assert rows12.stride(1) == 1 and rows12.stride(3) == 12
    with pytest.raises(ValueError, match=r"v_layout='keys_permuted16' needs v .* v.stride\(\) = \(192, 1, 192, 12\)"):
        flash_attn_func(q, k, rows12, v_layout="keys_permuted16", **kw)
    for bad in ("keys_permuted", "ROWS", 1):
        with pytest.raises(ValueError, match="v_layout must be None, .rows. or .keys_permuted16."):
            flash_attn_func(q, k, vt, v_layout=bad, **kw)
    (qb, kb, vb), _ = _small(dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="v_layout is for float8_e4m3fn inputs"):
        flash_attn_func(qb, kb, vb, v_layout="keys_permuted16")
    with pytest.raises(ValueError, match="v_layout must be None, .rows. or .keys_permuted16."):
        flash_attn_func(qb, kb, vb, v_layout="columns")
    # A view whose storage ends before its last V^T row does (the kernel reads seqlen_k rounded up to 16).
    short = torch.as_strided(torch.ones(7, dtype=torch.uint8).view(E4M3), (1, 7, 1, 1), (16, 1, 16, 16))
    q1, k1 = _codes((1, 3, 1, 1), _gen(11)), _codes((1, 7, 1, 1), _gen(12))
    one = torch.ones(())
    with pytest.raises(ValueError, match="v_layout='keys_permuted16': v's storage"):
        flash_attn_func(q1, k1, short, q_scale=one, k_scale=one, v_scale=one, v_layout="keys_permuted16")
    # On the host the default (None) is the rows layout, which accepts "rows" spelled out.
    assert torch.equal(flash_attn_func(q, k, v, v_layout="rows", **kw), flash_attn_func(q, k, v, **kw))
    assert torch.equal(flash_attn_func(q, k, v, v_layout=None, **kw), flash_attn_func(q, k, v, **kw))


def test_opcheck_fwd_fp8_keys_permuted16():
    (q, k, v), kw = _small()
    args = (q, k, fp8.keys_permuted16(v), kw["q_scale"], kw["k_scale"], kw["v_scale"], None, None, 0, 0, 9, 12, 0.25,
            True, -1, 0, 0.0, None, torch.float16, 0, 1)
    torch.library.opcheck(torch.ops.flashattn.fwd_fp8.default, args, test_utils=("test_faketensor",))


def test_torch_compile_keeps_the_keys_permuted16_strides():
    """Under torch.compile the op gets v as given: a copy to another layout would lose keys (wrong output)."""
    torch._dynamo.reset()
    (q, k, v), kw = _small()
    vt = fp8.keys_permuted16(v)

    def f(q, k, vt):
        return flash_attn_func(q, k, vt, causal=True, v_layout="keys_permuted16", **kw)

    compiled = torch.compile(f, fullgraph=True, backend="inductor")
    assert torch.equal(compiled(q, k, vt), flash_attn_func(q, k, v, causal=True, **kw))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_fp8_runs_on_sm90_and_is_refused_elsewhere():
    """sm90: the FP8 kernel, within its E4M3 bound of the dequantized fp64 attention (the bound of
    tests/gpu/test_gpu_fp8_attention.cpp: P rounded to E4M3 moves O by <= 2^-4 sum_j P_ij |v_j|, the
    tensor cores' score accumulation by <= sum_j P_ij ds_ij (|v_j| + |O|)); other GPUs refuse by name."""
    (q, k, v), kw = _small()
    qc, kc, vc = (t.cuda() for t in (q, k, v))
    kwc = {n: t.cuda() for n, t in kw.items()}
    if torch.cuda.get_device_capability() != (9, 0):
        with pytest.raises(NotImplementedError, match="dtype: fp8_e4m3"):
            flash_attn_func(qc, kc, vc, **kwc)
        return
    out = flash_attn_func(qc, kc, vc, **kwc).cpu().double()
    want, bound = _sm90_fp8_bound(q, k, v)
    assert not torch.isnan(out).any()
    err = (out - want).abs()
    assert (err <= bound).all(), f"max err/bound {float((err / bound).max()):.3g}"


def _sm90_fp8_bound(q, k, v):
    """(the fp64 attention of FP8 q, k, v with scales 1, the sm90 kernel's error bound around it)."""
    qd, kd, vd = (t.double() for t in (q, k, v))
    g = q.shape[2] // k.shape[2]
    kd, vd = kd.repeat_interleave(g, dim=2), vd.repeat_interleave(g, dim=2)  # GQA
    scale = 1 / math.sqrt(q.shape[-1])
    s = torch.einsum("bihd,bjhd->bhij", qd, kd) * scale
    p = torch.softmax(s, dim=-1)
    want = torch.einsum("bhij,bjhd->bihd", p, vd)
    pv_abs = torch.einsum("bhij,bjhd->bihd", p, vd.abs())
    ds = torch.einsum("bihd,bjhd->bhij", qd.abs(), kd.abs()) * scale * 2.0**-9  # tests/fp8_problem.h
    ds_pv = torch.einsum("bhij,bjhd->bihd", p * ds, vd.abs()) + torch.einsum("bhij->bih", p * ds)[..., None] * want.abs()
    # p below E4M3's normal range is off by up to min(P, 2^-18 / l) absolute (tests/fp8_problem.h,
    # p_flush); 1 / l = max_j P_ij.
    p_flush = torch.einsum("bhij,bjhd->bihd", torch.minimum(p, 2.0**-18 * p.amax(dim=-1, keepdim=True)), vd.abs())
    return want, 2.0**-4 * pv_abs + ds_pv + 2.0**-8 * want.abs() + p_flush + 1e-6


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs an sm90 GPU")
@pytest.mark.parametrize("sk, d", [(113, 64), (7, 40), (256, 128)])
def test_cuda_keys_permuted16_within_the_bound(sk, d):
    """sm90 with v in keys_permuted16 (d = 40: the head dim padded to 48 in the V^T copy): within the FP8 bound
    of the dequantized fp64 attention, as the rows layout (printed: whether the two agree bit for bit)."""
    g = _gen(13)
    q, k, v = _codes((2, 33, 4, d), g), _codes((2, sk, 2, d), g), _codes((2, sk, 2, d), g)
    one = torch.ones((), device="cuda")
    qc, kc, vc = (t.cuda() for t in (q, k, v))
    kw = dict(q_scale=one, k_scale=one, v_scale=one)
    out = flash_attn_func(qc, kc, fp8.keys_permuted16(vc), v_layout="keys_permuted16", **kw).cpu()
    rows = flash_attn_func(qc, kc, vc, **kw).cpu()
    print(f"sk {sk} d {d}: keys_permuted16 == rows bit for bit: {torch.equal(out, rows)}")
    want, bound = _sm90_fp8_bound(q, k, v)
    assert not torch.isnan(out).any()
    err = (out.double() - want).abs()
    assert (err <= bound).all(), f"max err/bound {float((err / bound).max()):.3g}"


# ---- flash_attn_fp8_func's v_layout: keys_permuted16 where the sm90 kernel runs it, rows elsewhere -----------

FUNC_VT_CASES = [
    # (batch, sq, sk, hq, hk, d, block_size, causal, window, softcap, dtype)
    (2, 7, 113, 4, 2, 64, 16, False, (-1, -1), 0.0, torch.float32),
    (1, 113, 7, 6, 2, 32, 128, True, (-1, -1), 0.0, torch.bfloat16),
    (2, 33, 113, 4, 1, 16, 7, False, (20, 3), 5.0, torch.float64),
]


@pytest.mark.parametrize("case", FUNC_VT_CASES, ids=lambda c: f"sq{c[1]}-sk{c[2]}-h{c[3]}/{c[4]}-d{c[5]}")
def test_fp8_func_keys_permuted16_equals_rows_bit_for_bit(case):
    """On the host (the reference backend) v_layout="keys_permuted16" computes the same attention from V^T as
    "rows" does from V: the same out and lse bit for bit, with and without return_attn_probs."""
    b, sq, sk, hq, hk, d, block, causal, window, softcap, dtype = case
    g = _gen(14)
    q = torch.randn(b, sq, hq, d, generator=g, dtype=torch.float64).to(dtype)
    k, v = (torch.randn(b, sk, hk, d, generator=g, dtype=torch.float64).to(dtype) for _ in range(2))
    kw = dict(causal=causal, window_size=window, softcap=softcap, block_size=block, seed=SEED)
    out, lse, probs = fp8.flash_attn_fp8_func(q, k, v, v_layout="rows", return_attn_probs=True, **kw)
    out_t, lse_t, probs_t = fp8.flash_attn_fp8_func(q, k, v, v_layout="keys_permuted16", return_attn_probs=True, **kw)
    assert torch.equal(out_t, out) and torch.equal(lse_t, lse), f"seed {SEED}"
    assert probs is None and probs_t is None
    assert torch.equal(fp8.flash_attn_fp8_func(q, k, v, v_layout="keys_permuted16", **kw), out)
    assert not torch.isnan(out).any()
    assert out.dtype == (dtype if dtype in (torch.float16, torch.bfloat16) else torch.bfloat16)


def _record_quantize_layouts(monkeypatch):
    """The layout of every fp8.quantize call (flash_attn_fp8_func quantizes q, k, then v)."""
    calls = []
    real = fp8.quantize

    def recording(x, *args, layout="rows", **kwargs):
        calls.append(layout)
        return real(x, *args, layout=layout, **kwargs)

    monkeypatch.setattr(fp8, "quantize", recording)
    return calls


def test_fp8_func_v_layout_none_picks_rows_on_the_host(monkeypatch):
    """v_layout=None (the default) quantizes v into keys_permuted16 only on CUDA: on CPU tensors in rows."""
    calls = _record_quantize_layouts(monkeypatch)
    q, k, v = _fp8_case(15, b=1, s=40, h=2, d=32)
    out = fp8.flash_attn_fp8_func(q, k, v, block_size=16)
    assert calls == ["rows"] * 3
    calls.clear()
    assert torch.equal(fp8.flash_attn_fp8_func(q, k, v, block_size=16, v_layout=None), out) and calls == ["rows"] * 3
    calls.clear()
    assert torch.equal(fp8.flash_attn_fp8_func(q, k, v, block_size=16, v_layout="rows"), out) and calls == ["rows"] * 3
    calls.clear()
    # Asked for, v is quantized straight into the layout (no separate conversion pass).
    assert torch.equal(fp8.flash_attn_fp8_func(q, k, v, block_size=16, v_layout="keys_permuted16"), out)
    assert calls == ["rows", "rows", "keys_permuted16"]


def test_fp8_func_refuses_a_bad_v_layout_by_name():
    q, k, v = _fp8_case(16, b=1, s=9, h=1, d=16)
    for bad in ("ROWS", "keys_permuted", "auto", 1, True):
        with pytest.raises(ValueError, match="flash_attn_fp8_func: v_layout must be None"):
            fp8.flash_attn_fp8_func(q, k, v, v_layout=bad)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs an sm90 GPU")
@pytest.mark.parametrize("sk, d", [(113, 64), (300, 128), (7, 256)])
def test_cuda_fp8_func_v_layouts_within_the_bound(sk, d, monkeypatch):
    """sm90: flash_attn_fp8_func with each v_layout: None (the default: on CUDA v quantized straight into
    keys_permuted16), "rows" (v in rows: the library's own default, here below its copy rule) and "keys_permuted16".
    Each result is within the FP8 bound of the fp64 attention of the quantized inputs (dequantized here exactly; the
    layouts differ only by the kernel's accumulation order, so rows is not compared bit for bit)."""
    calls = _record_quantize_layouts(monkeypatch)
    g = _gen(17)
    b, sq, hq, hk, block, seed = 2, 130, 4, 2, 128, 5
    q = torch.randn(b, sq, hq, d, generator=g).cuda()
    k, v = (torch.randn(b, sk, hk, d, generator=g).cuda() for _ in range(2))
    outs = {}
    with torch.no_grad():
        for layout in (None, "rows", "keys_permuted16"):
            try:
                outs[layout] = fp8.flash_attn_fp8_func(q, k, v, block_size=block, seed=seed, v_layout=layout)
            except NotImplementedError as e:
                if "in this build" in str(e):
                    pytest.skip(f"hdim {d} is not compiled: {e}")
                raise
            assert calls[-1] == ("rows" if layout == "rows" else "keys_permuted16"), layout
        # The quantization flash_attn_fp8_func does (deterministic), dequantized exactly on the host.
        qf, qs = fp8.quantize(q, block_size=block, hadamard=True, seed=seed)
        kf, ks = fp8.quantize(k, block_size=block, hadamard=True, seed=seed)
        vf, vs = fp8.quantize(v, block_size=block)
    deq = [_dequantize(x.cpu(), s.cpu(), block) for x, s in ((qf, qs), (kf, ks), (vf, vs))]
    want, bound = _sm90_fp8_bound(*deq)
    for name, out in outs.items():
        assert out.dtype == torch.bfloat16, name
        out = out.cpu().double()
        assert not torch.isnan(out).any(), name
        err = (out - want).abs()
        assert (err <= bound).all(), f"v_layout={name}: max err/bound {float((err / bound).max()):.3g}"
    # The default is keys_permuted16 on CUDA: the same result bit for bit.
    assert torch.equal(outs[None], outs["keys_permuted16"])


# ---- the default v_layout (None): the library copies v to V^T in its workspace where the sm90 kernel repays it ---

def test_func_default_v_layout_is_rows_on_the_host():
    """On CPU tensors the default (None, C FLASHATTN_FP8_V_ROWS_AUTO) is the rows layout: the same out as
    v_layout="rows", bit for bit, whatever the query rows."""
    g = _gen(16)
    q, k, v = _codes((1, 1030, 2, 32), g), _codes((1, 40, 1, 32), g), _codes((1, 40, 1, 32), g)
    one = torch.ones(())
    out = flash_attn_func(q, k, v, q_scale=one, k_scale=one, v_scale=one)
    assert torch.equal(flash_attn_func(q, k, v, q_scale=one, k_scale=one, v_scale=one, v_layout="rows"), out)
    assert torch.equal(flash_attn_func(q, k, v, q_scale=one, k_scale=one, v_scale=one, v_layout=None), out)
    assert not torch.isnan(out).any()


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs an sm90 GPU")
@pytest.mark.parametrize("sq, sk, hq, hk, causal, copies", [
    (1600, 300, 2, 2, False, True),    # 1600 pairs per key and kv head
    (800, 300, 4, 2, False, True),     # 800 rows x a GQA group of 2
    (1400, 300, 2, 2, False, False),   # below 1536
    (3200, 3200, 1, 1, True, True),    # causal: ~1600 pairs per key
    (2048, 2048, 2, 2, True, False),   # causal: ~1024
    (2600, 2600, 1, 1, False, True),   # window (1200, 1200): ~1850 pairs per key
    (2601, 2601, 1, 1, False, False),  # window (500, 500): ~1000
])
def test_cuda_func_default_v_layout(sq, sk, hq, hk, causal, copies):
    """sm90, fixed length: the default (None) equals v_layout="keys_permuted16" bit for bit where the library copies
    v (>= 1536 unmasked pairs per key and kv head) and v_layout="rows" elsewhere. (Which kernel ran, and the
    workspace the copy takes: the C++ GPU test Fp8VRowsAuto.)"""
    g = _gen(18)
    d = 64
    q, k, v = _codes((2, sq, hq, d), g), _codes((2, sk, hk, d), g), _codes((2, sk, hk, d), g)
    qc, kc, vc = (t.cuda() for t in (q, k, v))
    one = torch.ones((), device="cuda")
    window = {2600: (1200, 1200), 2601: (500, 500)}.get(sq, (-1, -1))
    kw = dict(q_scale=one, k_scale=one, v_scale=one, causal=causal, window_size=window)
    out = flash_attn_func(qc, kc, vc, **kw)
    rows = flash_attn_func(qc, kc, vc, v_layout="rows", **kw)
    vt = flash_attn_func(qc, kc, fp8.keys_permuted16(vc), v_layout="keys_permuted16", **kw)
    assert not torch.isnan(out).any()
    assert torch.equal(out, vt if copies else rows)
