"""float64 inputs get a float64 LSE end to end (the C ABI's lse_fp64): softmax_lse is float64 and
exact to fp64 precision (a float32-rounded LSE fails these tolerances by orders of magnitude),
the fake kernels agree, and the backward takes it back; other dtypes keep the float32 LSE."""

import pytest
import torch

import flashattn
from flashattn import _ops, flash_attn_func, flash_attn_varlen_func
from ref import attention_ref, rand, varlen_ref

# Head dim 16: the default scale 16 ** -0.5 = 0.25 is exact (the C ABI's softmax_scale is a float).
D = 16
RTOL = 1e-12  # float32's epsilon is 1.2e-7


def _cu(lengths):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)


def _assert_fp64_exact(lse, ref):
    assert lse.dtype == torch.float64 and ref.dtype == torch.float64
    assert lse.shape == ref.shape
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(lse), fin) and torch.all(lse[~fin] == ref[~fin])
    rel = ((lse[fin] - ref[fin]).abs() / ref[fin].abs().clamp_min(1.0)).max().item()
    assert rel < RTOL, f"LSE relative error {rel:.3g} (fp64 expected)"
    # The check can tell: the same LSE rounded through float32 is far outside it.
    rounded = ((ref[fin].float().double() - ref[fin]).abs() / ref[fin].abs().clamp_min(1.0)).max().item()
    assert rounded > 1e4 * RTOL


KWS = [dict(), dict(causal=True), dict(window_size=(3, 1), softcap=3.0), dict(causal=True, softcap=2.0)]


def _ref_kw(kw):
    return dict(causal=kw.get("causal", False), window=kw.get("window_size", (-1, -1)), softcap=kw.get("softcap", 0.0))


@pytest.mark.parametrize("kw", KWS, ids=["plain", "causal", "window_softcap", "causal_softcap"])
def test_fixed_length_lse_is_fp64(kw):
    torch.manual_seed(0)
    # sq > sk: under causal the first rows see no key (LSE -inf); GQA 4 -> 2 heads.
    q = rand(2, 11, 4, D, dtype=torch.float64) * 2
    k, v = (rand(2, 7, 2, D, dtype=torch.float64) * 2 for _ in range(2))
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    ref_out, ref_lse = attention_ref(q, k, v, dtype=torch.float64, **_ref_kw(kw))
    _assert_fp64_exact(lse, ref_lse)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kw", KWS, ids=["plain", "causal", "window_softcap", "causal_softcap"])
def test_varlen_lse_is_fp64(kw):
    torch.manual_seed(1)
    cu_q, cu_k = _cu([3, 6, 1]), _cu([5, 4, 7])
    q = rand(10, 4, D, dtype=torch.float64) * 2
    k, v = (rand(16, 1, D, dtype=torch.float64) * 2 for _ in range(2))
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 7, return_attn_probs=True, **kw)
    ref_out, ref_lse = varlen_ref(q, k, v, cu_q, cu_k, dtype=torch.float64, **_ref_kw(kw))
    _assert_fp64_exact(lse, ref_lse)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_other_dtypes_keep_a_float32_lse(dtype):
    q, k, v = (rand(1, 5, 2, D, dtype=dtype) for _ in range(3))
    _, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    assert lse.dtype == torch.float32


def test_cpu_backend_keeps_a_float32_lse():
    # The tiled cpu backend (chosen explicitly) accumulates in fp32 and refuses lse_fp64.
    q, k, v = (rand(1, 5, 2, D, dtype=torch.float64) for _ in range(3))
    _, lse, _ = flashattn.interface._flash_attn(q, k, v, return_attn_probs=True, backend="cpu")
    assert lse.dtype == torch.float32


def test_fake_kernels_give_the_same_dtype():
    q = rand(1, 6, 4, D, dtype=torch.float64)
    k, v = (rand(1, 8, 2, D, dtype=torch.float64) for _ in range(2))
    args = (q, k, v, None, None, 6, 8, 0.25, True, -1, 0, 0.0, False, flashattn._lib.backend_id("auto"))
    real = _ops._fwd_impl(*args)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = torch.ops.flashattn.fwd(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
    assert fake[1].dtype == real[1].dtype == torch.float64
    assert fake[1].shape == real[1].shape
    q32, k32, v32 = q.float(), k.float(), v.float()
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = torch.ops.flashattn.fwd(mode.from_tensor(q32), mode.from_tensor(k32), mode.from_tensor(v32), *args[3:])
    assert fake[1].dtype == torch.float32
    torch.library.opcheck(torch.ops.flashattn.fwd, args, test_utils=("test_schema", "test_faketensor"))


def test_backward_takes_the_fp64_lse():
    q = rand(1, 6, 4, D, dtype=torch.float64, outliers=False)
    k, v = (rand(1, 8, 2, D, dtype=torch.float64, outliers=False) for _ in range(2))
    auto = flashattn._lib.backend_id("auto")
    out, lse = _ops._fwd_impl(q, k, v, None, None, 6, 8, 0.25, True, -1, 0, 0.0, False, auto)
    assert lse.dtype == torch.float64
    dout = torch.randn_like(out)
    grads = _ops._bwd_impl(dout, q, k, v, out, lse, None, None, 6, 8, 0.25, True, -1, 0, 0.0, False, auto)
    assert all(g.dtype == torch.float64 and torch.isfinite(g).all() for g in grads)
    # The same through autograd (the LSE saved by the forward goes back to the backward).
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    flash_attn_func(qq, kk, vv, causal=True).backward(dout)
    for a, b in zip(grads, (qq.grad, kk.grad, vv.grad)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(ValueError, match="float64"):
        _ops._bwd_impl(dout, q, k, v, out, lse.float(), None, None, 6, 8, 0.25, True, -1, 0, 0.0, False, auto)


def test_gradcheck_with_the_fp64_lse():
    # Fixed length and varlen, with causal, window, softcap and GQA, at gradcheck's default tolerances.
    q = rand(1, 5, 4, 8, dtype=torch.float64, outliers=False).requires_grad_()
    k, v = (rand(1, 7, 2, 8, dtype=torch.float64, outliers=False).requires_grad_() for _ in range(2))
    f = lambda q, k, v: flash_attn_func(q, k, v, causal=True, window_size=(2, 0), softcap=3.0,  # noqa: E731
                                        return_attn_probs=True)[0]
    assert torch.autograd.gradcheck(f, (q, k, v))
    cu_q, cu_k = _cu([2, 3]), _cu([4, 3])
    qv = rand(5, 4, 8, dtype=torch.float64, outliers=False).requires_grad_()
    kv, vv = (rand(7, 1, 8, dtype=torch.float64, outliers=False).requires_grad_() for _ in range(2))
    f = lambda q, k, v: flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 4, causal=True, softcap=2.0)  # noqa: E731
    assert torch.autograd.gradcheck(f, (qv, kv, vv))
