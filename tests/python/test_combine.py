"""flashattn.combine: partial attention results over key slices, merged, against the full call.

Each split is flash_attn_func(q, k[:, a:e], v[:, a:e], return_attn_probs=True) on CPU tensors
(empty slices included: O = 0, LSE = -inf); the combined (out, lse) must match the full call's
within the tolerance of the partial outputs' rounding. Plus all -inf rows, NaN in the partial
outputs of empty splits, list inputs, strided stacks, and bad arguments.
"""

import math

import pytest
import torch

import flashattn
from flashattn import flash_attn_func

TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 2e-5, torch.float64: 1e-12}


def _splits(q, k, v, cuts):
    outs, lses = [], []
    for a, e in zip(cuts[:-1], cuts[1:]):
        o, lse, _ = flash_attn_func(q, k[:, a:e], v[:, a:e], return_attn_probs=True)
        outs.append(o)
        lses.append(lse)
    return outs, lses


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("cuts", [[0, 37], [0, 10, 37], [0, 5, 5, 37], [0, 1, 20, 36, 37], [0, 0, 37, 37]])
def test_matches_full_attention(dtype, cuts):
    g = torch.Generator().manual_seed(len(cuts) * 7 + hash(str(dtype)) % 100)
    b, sq, sk, hq, hkv, d = 2, 13, cuts[-1], 4, 2, 32
    q = torch.randn(b, sq, hq, d, generator=g).to(dtype)
    k = torch.randn(b, sk, hkv, d, generator=g).to(dtype)
    v = torch.randn(b, sk, hkv, d, generator=g).to(dtype)
    want, want_lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    outs, lses = _splits(q, k, v, cuts)
    for stacked in (False, True):
        args = (torch.stack(outs), torch.stack(lses)) if stacked else (outs, lses)
        out, lse = flashattn.combine(*args)
        assert out.shape == want.shape and out.dtype == dtype
        assert lse.shape == want_lse.shape and lse.dtype == want_lse.dtype
        assert not out.isnan().any() and not lse.isnan().any()
        torch.testing.assert_close(out.double(), want.double(), atol=TOL[dtype], rtol=TOL[dtype])
        torch.testing.assert_close(lse.double(), want_lse.double(), atol=1e-5 if dtype != torch.float64 else 1e-12,
                                   rtol=1e-5 if dtype != torch.float64 else 1e-12)


def test_minus_inf_rows_and_unread_partials():
    n, b, s, h, d = 3, 1, 4, 2, 8
    outs = torch.randn(n, b, s, h, d)
    lses = torch.randn(n, b, h, s)
    lses[:, :, :, 0] = -math.inf  # row 0: no split saw a key
    lses[1:, :, :, 1] = -math.inf  # row 1: only split 0
    outs[1:, :, 1] = float("nan")  # ... the others' outputs must not be read
    out, lse = flashattn.combine(outs, lses)
    assert not out.isnan().any() and not lse.isnan().any()
    assert (out[:, 0] == 0).all()
    assert torch.isneginf(lse[:, :, 0]).all()
    torch.testing.assert_close(out[:, 1], outs[0, :, 1])
    torch.testing.assert_close(lse[:, :, 1], lses[0, :, :, 1])
    # Rows 2, 3 by the formula.
    L = torch.logsumexp(lses[..., 2:], dim=0)
    w = torch.exp(lses[..., 2:] - L).permute(0, 1, 3, 2).unsqueeze(-1)  # [n, b, s, h, 1]
    torch.testing.assert_close(lse[..., 2:], L)
    torch.testing.assert_close(out[:, 2:], (w * outs[:, :, 2:]).sum(0), atol=1e-6, rtol=1e-5)


def test_strided_inputs():
    n, b, s, h, d = 2, 2, 5, 3, 16
    big = torch.randn(b, n, s, h, d + 8)
    outs = big[..., :d].transpose(0, 1)  # [n, b, s, h, d], non-contiguous
    lses = torch.randn(b, h, n, s).permute(2, 0, 1, 3)  # [n, b, h, s], strided
    out, lse = flashattn.combine(outs, lses)
    ref_out, ref_lse = flashattn.combine(outs.contiguous(), lses.contiguous())
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


def test_float64_lse():
    outs = torch.randn(3, 1, 4, 2, 8, dtype=torch.float64)
    lses = torch.randn(3, 1, 2, 4, dtype=torch.float64)
    out, lse = flashattn.combine(outs, lses)
    assert lse.dtype == torch.float64
    torch.testing.assert_close(lse, torch.logsumexp(lses, 0), atol=1e-14, rtol=1e-14)


def test_exported():
    assert "combine" in flashattn.__all__
    assert callable(flashattn.combine) and flashattn.combine.__doc__


@pytest.mark.parametrize(
    "outs, lses, match",
    [
        (torch.zeros(2, 1, 4, 2, 8), torch.zeros(2, 1, 4, 2), "lses shape"),
        (torch.zeros(1, 4, 2, 8), torch.zeros(2, 1, 2, 4), "outs must have 5 dims"),
        (torch.zeros(2, 1, 4, 2, 8), torch.zeros(2, 1, 2), "lses must have 4 dims"),
        (torch.zeros(2, 1, 4, 2, 8, dtype=torch.int32), torch.zeros(2, 1, 2, 4), "outs dtype"),
        (torch.zeros(2, 1, 4, 2, 8), torch.zeros(2, 1, 2, 4, dtype=torch.float16), "lses must be float32"),
        (torch.zeros(2, 1, 4, 2, 8), torch.zeros(2, 1, 2, 4, dtype=torch.float64), "float64 LSEs need float64 outs"),
        ([], [], "outs is empty"),
        ([torch.zeros(1, 4, 2, 8), torch.zeros(1, 5, 2, 8)], torch.zeros(2, 1, 2, 4), "outs must all have one shape"),
        ([torch.zeros(1, 4, 2, 8), "x"], torch.zeros(2, 1, 2, 4), r"outs\[1\]"),
        ("x", torch.zeros(2, 1, 2, 4), "outs must be a torch.Tensor"),
        (torch.zeros(0, 1, 4, 2, 8), torch.zeros(0, 1, 2, 4), "num_splits"),
    ],
)
def test_bad_arguments(outs, lses, match):
    with pytest.raises(ValueError, match=match):
        flashattn.combine(outs, lses)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_cuda_matches_cpu(dtype):
    # The device combine kernel (shared with split-KV decode) against the host one, on random
    # partials with -inf rows and NaN in the partials of splits that saw no key.
    g = torch.Generator().manual_seed(11)
    n, b, s, h, d = 5, 2, 7, 3, 40
    outs = (torch.randn(n, b, s, h, d, generator=g) * 3).to(dtype)
    lses = torch.randn(n, b, h, s, generator=g) * 4
    lses[:, :, :, 0] = -math.inf
    lses[2:, :, :, 1] = -math.inf
    outs[2:, :, 1] = float("nan")
    want, want_lse = flashattn.combine(outs, lses)
    got, got_lse = flashattn.combine(outs.cuda(), lses.cuda())
    assert got.device.type == "cuda" and got.dtype == dtype and got.shape == want.shape
    assert not got.isnan().any() and not got_lse.isnan().any()
    torch.testing.assert_close(got.cpu().double(), want.double(), atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(got_lse.cpu(), want_lse, atol=1e-5, rtol=1e-5)
