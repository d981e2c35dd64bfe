"""flashattn's PyTorch front end on CPU tensors (runs in CI): results and gradients against a
float64 oracle with the FlashAttention tolerance rule, every option and packed variant, the
LSE, errors, and the custom ops under torch.compile."""

import pytest
import torch

import flashattn
from flashattn import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from ref import check, rand, run_case, varlen_ref

DTYPES = [torch.float32, torch.bfloat16]


# (b, sq, sk, h, hk, d, causal, window, softcap): ragged lengths, GQA/MQA, masks, softcap.
CASES = [
    (1, 1, 1, 1, 1, 32, False, (-1, -1), 0.0),
    (2, 7, 113, 4, 2, 64, False, (-1, -1), 0.0),
    (2, 113, 7, 4, 1, 64, True, (-1, -1), 0.0),  # sq > sk causal: leading rows see no key
    (1, 203, 203, 2, 2, 128, True, (-1, -1), 0.0),
    (2, 64, 203, 4, 2, 32, True, (-1, -1), 0.0),
    (1, 113, 203, 2, 1, 64, False, (17, 5), 0.0),
    (1, 203, 113, 2, 2, 64, True, (31, -1), 0.0),
    (2, 97, 97, 3, 1, 96, False, (-1, 0), 0.0),
    (1, 77, 129, 2, 2, 64, False, (-1, -1), 30.0),
    (1, 129, 77, 4, 2, 32, True, (8, 0), 5.0),
    (1, 33, 65, 2, 2, 256, False, (-1, -1), 0.0),
    (1, 50, 50, 2, 2, 40, False, (0, 0), 0.0),  # window 0: only the diagonal
]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[f"b{c[0]}_q{c[1]}_k{c[2]}_h{c[3]}-{c[4]}_d{c[5]}"
                                            f"{'_causal' if c[6] else ''}_w{c[7][0]},{c[7][1]}_cap{c[8]:g}"
                                            for c in CASES])
def test_fwd_bwd_vs_oracle(case, dtype):
    b, sq, sk, h, hk, d, causal, window, softcap = case
    run_case(b, sq, sk, h, hk, d, dtype, causal=causal, window=window, softcap=softcap)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64], ids=["fp16", "fp64"])
def test_other_dtypes(dtype):
    run_case(2, 37, 53, 4, 2, 64, dtype, causal=True)


def test_long_sequences():
    run_case(1, 799, 1023, 2, 1, 64, torch.bfloat16, causal=True)
    run_case(1, 4097, 4097, 1, 1, 32, torch.float32, causal=True, backward=False)


def test_softmax_scale_and_deterministic():
    run_case(2, 31, 47, 2, 2, 64, torch.float32, scale=0.3, deterministic=True)
    q, k, v = (rand(1, 65, 2, 64).requires_grad_() for _ in range(3))
    grads = []
    for _ in range(2):
        out = flash_attn_func(q, k, v, causal=True, deterministic=True)
        grads.append(torch.autograd.grad(out.square().sum(), (q, k, v)))
    for a, b in zip(*grads):
        assert torch.equal(a, b), "deterministic=True backward is not bitwise reproducible"


def test_empty_rows_give_zero_out_and_neg_inf_lse():
    # causal with sq > sk: query rows 0..(sq-sk-1) see no key.
    q, k, v = rand(1, 9, 2, 32), rand(1, 4, 2, 32), rand(1, 4, 2, 32)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.all(out[:, :5] == 0)
    assert torch.all(torch.isneginf(lse[:, :, :5]))
    assert torch.isfinite(out[:, 5:]).all() and torch.isfinite(lse[:, :, 5:]).all()


def test_degenerate_sizes():
    q, k, v = rand(2, 0, 2, 32), rand(2, 5, 2, 32), rand(2, 5, 2, 32)
    assert flash_attn_func(q, k, v).shape == (2, 0, 2, 32)
    q, k, v = (rand(2, 3, 2, 32).requires_grad_(), rand(2, 0, 2, 32).requires_grad_(),
               rand(2, 0, 2, 32).requires_grad_())
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    assert torch.all(out == 0) and torch.all(torch.isneginf(lse))
    out.sum().backward()
    assert torch.all(q.grad == 0)
    q = rand(0, 3, 2, 32)
    assert flash_attn_func(q, q, q).shape == (0, 3, 2, 32)


# ---- packed and varlen -------------------------------------------------------------------------


def _grads(out, inputs, dout):
    return torch.autograd.grad(out, inputs, dout)


@pytest.mark.parametrize("causal", [False, True])
def test_qkvpacked_and_kvpacked_match_unpacked(causal):
    b, s, h, d = 2, 45, 4, 64
    qkv = rand(b, s, 3, h, d).requires_grad_()
    out = flash_attn_qkvpacked_func(qkv, causal=causal, softcap=10.0)
    q, k, v = (t.detach().clone().requires_grad_() for t in qkv.unbind(2))
    ref = flash_attn_func(q, k, v, causal=causal, softcap=10.0)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    dout = rand(*out.shape)
    (dqkv,) = _grads(out, (qkv,), dout)
    dq, dk, dv = _grads(ref, (q, k, v), dout)
    torch.testing.assert_close(dqkv, torch.stack([dq, dk, dv], 2), rtol=1e-6, atol=1e-6)

    q = rand(b, 30, h, d).requires_grad_()
    kv = rand(b, s, 2, h // 2, d).requires_grad_()
    out, lse, _ = flash_attn_kvpacked_func(q, kv, causal=causal, window_size=(10, 3), return_attn_probs=True)
    k, v = (t.detach().clone().requires_grad_() for t in kv.unbind(2))
    q2 = q.detach().clone().requires_grad_()
    ref, lse_ref, _ = flash_attn_func(q2, k, v, causal=causal, window_size=(10, 3), return_attn_probs=True)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse, lse_ref)
    dout = rand(*out.shape)
    dq, dkv = _grads(out, (q, kv), dout)
    dq2, dk, dv = _grads(ref, (q2, k, v), dout)
    torch.testing.assert_close(dq, dq2, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dkv, torch.stack([dk, dv], 2), rtol=1e-6, atol=1e-6)


def _cu(lengths):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("causal,window,softcap", [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0),
                                                   (False, (20, 4), 0.0), (True, (-1, -1), 8.0)])
def test_varlen_vs_oracle(dtype, causal, window, softcap):
    lens_q = [1, 7, 113, 0, 203, 64]
    lens_k = [1, 113, 7, 5, 203, 0]
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    h, hk, d = 4, 2, 64
    q = rand(sum(lens_q), h, d, dtype=dtype).requires_grad_()
    k = rand(sum(lens_k), hk, d, dtype=dtype).requires_grad_()
    v = rand(sum(lens_k), hk, d, dtype=dtype).requires_grad_()
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                         window_size=window, softcap=softcap, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (h, sum(lens_q))
    kw = dict(causal=causal, window=window, softcap=softcap)
    l64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    llp = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o64, lse64 = varlen_ref(*l64, cu_q, cu_k, **kw)
    olp, lselp = varlen_ref(*llp, cu_q, cu_k, **kw)
    check("out", out, olp, o64, dtype)
    check("lse", lse, lselp, lse64, dtype)
    dout = rand(*out.shape, dtype=dtype)
    for name, a, lp, o in zip(("dq", "dk", "dv"), _grads(out, (q, k, v), dout),
                              _grads(olp, llp, dout), _grads(o64, l64, dout.double())):
        check(name, a, lp, o, dtype)


def test_varlen_packed_variants_match_varlen():
    lens = [5, 70, 1, 33]
    cu = _cu(lens)
    total, h, d = sum(lens), 2, 32
    qkv = rand(total, 3, h, d).requires_grad_()
    out = flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=True)
    q, k, v = (t.detach().clone().requires_grad_() for t in qkv.unbind(1))
    ref = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    dout = rand(*out.shape)
    (dqkv,) = _grads(out, (qkv,), dout)
    torch.testing.assert_close(dqkv, torch.stack(_grads(ref, (q, k, v), dout), 1), rtol=1e-6, atol=1e-6)

    kv = rand(total, 2, 1, d).requires_grad_()
    q = rand(total, h, d).requires_grad_()
    out = flash_attn_varlen_kvpacked_func(q, kv, cu, cu, max(lens), max(lens), window_size=(3, 3))
    k, v = (t.detach().clone().requires_grad_() for t in kv.unbind(1))
    q2 = q.detach().clone().requires_grad_()
    ref = flash_attn_varlen_func(q2, k, v, cu, cu, max(lens), max(lens), window_size=(3, 3))
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    dq, dkv = _grads(out, (q, kv), dout)
    dq2, dk, dv = _grads(ref, (q2, k, v), dout)
    torch.testing.assert_close(dq, dq2, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dkv, torch.stack([dk, dv], 1), rtol=1e-6, atol=1e-6)


# ---- layouts -----------------------------------------------------------------------------------


def test_strided_and_noncontiguous_inputs():
    b, s, h, d = 2, 40, 4, 32
    # [b, h, s, d] storage seen as [b, s, h, d]: last dim contiguous, passed with its strides.
    q = rand(b, h, s, d).transpose(1, 2).requires_grad_()
    k = rand(b, h, s, d).transpose(1, 2)
    v = rand(b, s, h, 2 * d)[..., :d]  # row stride 2d
    out = flash_attn_func(q, k, v, causal=True)
    ref = flash_attn_func(q.detach().contiguous(), k.contiguous(), v.contiguous(), causal=True)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    # Last dim not contiguous: copied.
    q2 = rand(b, s, h, d, 2)[..., 0]
    torch.testing.assert_close(flash_attn_func(q2, k, v), flash_attn_func(q2.contiguous(), k, v), rtol=0, atol=0)
    # Gradient of an expanded (stride 0) dout.
    out.sum().backward()
    qq = q.detach().contiguous().requires_grad_()
    flash_attn_func(qq, k.contiguous(), v.contiguous(), causal=True).sum().backward()
    torch.testing.assert_close(q.grad, qq.grad, rtol=0, atol=0)


def test_gradcheck_float64_through_the_public_api():
    # float64 on the default host path is computed in float64 (the reference backend), so
    # gradcheck passes with its default tolerances: causal, window, softcap, GQA, varlen.
    q = rand(1, 7, 4, 8, dtype=torch.float64, outliers=False).requires_grad_()
    k, v = (rand(1, 9, 2, 8, dtype=torch.float64, outliers=False).requires_grad_() for _ in range(2))
    for kw in (dict(causal=True), dict(window_size=(2, 1), softcap=3.0), dict()):
        f = lambda q, k, v: flash_attn_func(q, k, v, **kw)  # noqa: E731
        assert torch.autograd.gradcheck(f, (q, k, v)), kw
    cu_q, cu_k = _cu([3, 4]), _cu([5, 4])
    qv = rand(7, 4, 8, dtype=torch.float64, outliers=False).requires_grad_()
    kv_, vv = (rand(9, 2, 8, dtype=torch.float64, outliers=False).requires_grad_() for _ in range(2))
    f = lambda q, k, v: flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 5, causal=True)  # noqa: E731
    assert torch.autograd.gradcheck(f, (qv, kv_, vv))


def test_gradcheck_float64():
    q, k, v = (rand(1, 6, 2, 8, dtype=torch.float64, outliers=False).requires_grad_() for _ in range(3))
    # The reference backend is fp64 throughout (its LSE too), so gradcheck's default tolerances hold;
    # the tiled CPU path accumulates in fp32 and would not.
    f = lambda q, k, v: flashattn.interface._flash_attn(q, k, v, causal=True, softcap=3.0, backend="reference")  # noqa: E731
    assert torch.autograd.gradcheck(f, (q, k, v))


# ---- unsupported options and errors ----------------------------------------------------------


def test_unsupported_options_raise():
    # Dropout and ALiBi are implemented (test_dropout_alibi.py), paged KV too (test_kvcache.py), but paged KV is
    # inference-only: with dropout it is refused by name.
    q = rand(1, 8, 2, 32)
    cu = _cu([8])
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flash_attn_varlen_func(q[0], q[0, None], q[0, None], cu, cu, 8, 8, dropout_p=0.5,
                               block_table=torch.zeros(1, 1, dtype=torch.int32))


def test_errors_name_the_argument():
    q = rand(1, 8, 4, 32)
    k = rand(1, 8, 3, 32)
    with pytest.raises(ValueError, match="same device"):
        flash_attn_func(q, q.to("meta"), q)
    with pytest.raises(ValueError, match="same dtype"):
        flash_attn_func(q, q.double(), q)
    with pytest.raises(ValueError, match="multiple"):
        flash_attn_func(q, k, k)
    with pytest.raises(ValueError, match="4-D"):
        flash_attn_func(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="head dim"):
        flash_attn_func(q, rand(1, 8, 4, 16), rand(1, 8, 4, 16))
    with pytest.raises(ValueError, match="window_size"):
        flash_attn_func(q, q, q, window_size=(-2, 0))
    with pytest.raises(ValueError, match="dtype"):
        flash_attn_func(q.int(), q.int(), q.int())
    with pytest.raises(ValueError, match="qkv"):
        flash_attn_qkvpacked_func(q)
    cu = _cu([8])
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        flash_attn_varlen_func(q[0], q[0], q[0], cu.long(), cu, 8, 8)
    # Checked by the C library; its message names the field.
    with pytest.raises(ValueError, match="max_seqlen_q"):
        flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 4, 8)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        flash_attn_varlen_func(q[0], q[0], q[0], cu, torch.tensor([0, 9], dtype=torch.int32), 8, 9)
    with pytest.raises(NotImplementedError, match="headdim"):
        big = rand(1, 4, 1, 320)
        flash_attn_func(big, big, big)
    with pytest.raises(ValueError, match="backend"):
        flashattn.interface._flash_attn(q, q, q, backend="tpu")
    with pytest.raises(ValueError, match="options.device"):
        flashattn.interface._flash_attn(q, q, q, backend="sm90")


def test_reference_backend_matches_cpu():
    q, k, v = rand(2, 33, 4, 64), rand(2, 47, 2, 64), rand(2, 47, 2, 64)
    a = flashattn.interface._flash_attn(q, k, v, causal=True, backend="reference")
    b = flashattn.interface._flash_attn(q, k, v, causal=True, backend="cpu")
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_lse_is_not_differentiable():
    q = rand(1, 8, 2, 32).requires_grad_()
    out, lse, _ = flash_attn_func(q, q, q, return_attn_probs=True)
    assert out.requires_grad and not lse.requires_grad


def test_library_info():
    assert flashattn.version() == "0.1.0"
    assert {"cpu", "reference"} <= set(flashattn.compiled_backends())


# ---- torch.library / torch.compile ---------------------------------------------------------------


def test_opcheck():
    q, k, v = rand(2, 16, 4, 32).requires_grad_(), rand(2, 24, 2, 32).requires_grad_(), rand(2, 24, 2, 32).requires_grad_()
    args = (q, k, v, None, None, 0, 0, 32 ** -0.5, True, -1, 0, 0.0, False, 0)
    torch.library.opcheck(torch.ops.flashattn.fwd.default, args)
    out, lse = torch.ops.flashattn.fwd(*args)
    dout = rand(*out.shape)
    torch.library.opcheck(torch.ops.flashattn.bwd.default,
                          (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse, None, None, 0, 0,
                           32 ** -0.5, True, -1, 0, 0.0, False, 0))
    cu = _cu([5, 11])
    qv, kv = rand(16, 4, 32).requires_grad_(), rand(16, 2, 32).requires_grad_()
    torch.library.opcheck(torch.ops.flashattn.fwd.default,
                          (qv, kv, kv, cu, cu, 11, 11, 0.2, False, -1, -1, 0.0, False, 0))


def _compile_backend():
    return "inductor"


@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
def test_torch_compile_fullgraph(varlen):
    torch._dynamo.reset()
    h, d = 4, 32

    if varlen:
        cu = _cu([10, 3, 27])
        q, k, v = (rand(40, n, d).requires_grad_() for n in (h, 2, 2))

        def f(q, k, v):
            o = flash_attn_varlen_func(q, k, v, cu, cu, 27, 27, causal=True)
            return (o * 2).sin().sum()
    else:
        q, k, v = (rand(2, 40, n, d).requires_grad_() for n in (h, 2, 2))

        def f(q, k, v):
            o, lse, _ = flash_attn_func(q * 1.5, k, v, causal=True, window_size=(16, -1), softcap=20.0,
                                        return_attn_probs=True)
            return (o * 2).sin().sum() + lse.sum().detach() * 0

    compiled = torch.compile(f, fullgraph=True, backend=_compile_backend())
    loss = compiled(q, k, v)
    g = torch.autograd.grad(loss, (q, k, v))
    loss_ref = f(q, k, v)
    g_ref = torch.autograd.grad(loss_ref, (q, k, v))
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_flash_attn_argument_conventions():
    # window_size: any pair of integers (tuple, list, torch or numpy); softmax_scale: any real > 0.
    q, k, v = rand(1, 33, 2, 32), rand(1, 40, 2, 32), rand(1, 40, 2, 32)
    ref = flash_attn_func(q, k, v, window_size=(8, 2))
    for w in ([8, 2], (torch.tensor(8), 2), torch.tensor([8, 2])):
        assert torch.equal(flash_attn_func(q, k, v, window_size=w), ref), w
    scaled = flash_attn_func(q, k, v, softmax_scale=0.25)
    assert torch.equal(flash_attn_func(q, k, v, softmax_scale=torch.tensor(0.25)), scaled)
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:
        for w in ((np.int64(8), np.int32(2)), np.array([8, 2])):
            assert torch.equal(flash_attn_func(q, k, v, window_size=w), ref), w
        assert torch.equal(flash_attn_func(q, k, v, softmax_scale=np.float32(0.25)), scaled)
    for bad in ((1.5, 2), (True, 2), torch.tensor([8.0, 2.0]), (8,), (8, 2, 1), "82"):
        with pytest.raises(ValueError, match="window_size"):
            flash_attn_func(q, k, v, window_size=bad)
    # 0 is refused, never silently read as "default" (flash_attn would compute with it).
    for bad in (0.0, -1.0, float("nan"), float("inf"), "0.1"):
        with pytest.raises(ValueError, match="softmax_scale"):
            flash_attn_func(q, k, v, softmax_scale=bad)


def test_degenerate_shapes_name_the_argument():
    with pytest.raises(ValueError, match="headdim"):
        z = torch.randn(1, 4, 2, 0)
        flash_attn_func(z, z, z)
    with pytest.raises(ValueError, match="nheads"):
        flash_attn_func(torch.randn(1, 4, 0, 32), rand(1, 4, 2, 32), rand(1, 4, 2, 32))
