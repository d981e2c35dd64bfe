"""flashattn.fp8: E4M3 block quantization (and the Hadamard transform) against torch.

The codes must equal torch's own x.to(torch.float8_e4m3fn) (round to nearest even) wherever torch
does not overflow (|x / scale| <= 448 always holds here); scales are amax / 448 per (batch, head,
block of block_size tokens); dequantize must stay within E4M3's half step; the transform must be
H diag(signs) / sqrt(d) with H the Sylvester-Hadamard matrix, and must leave q . k unchanged.
Inputs are fresh random draws with outliers: FLASHATTN_TEST_SEED=<seed> reproduces a failure.
"""

import math
import os

import pytest
import torch

import flashattn
from flashattn import fp8

SEED = int(os.environ.get("FLASHATTN_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def _gen(tag):
    return torch.Generator().manual_seed(SEED * 1000 + tag)


def _random(shape, dtype, g, outliers=True):
    """N(0, 1) rows of varying magnitude (2^-8 .. 2^5) plus outliers of 50..300 x the row's scale (finite in fp16)."""
    b, s, h, d = shape
    mag = torch.exp2(torch.randint(-8, 6, (b, s, h, 1), generator=g).double())
    x = torch.randn(shape, generator=g, dtype=torch.float64) * mag
    if outliers:
        n = max(1, x.numel() // 500)
        idx = torch.randint(0, x.numel(), (n,), generator=g)
        sign = torch.randint(0, 2, (n,), generator=g).double() * 2 - 1
        x.view(-1)[idx] = sign * (50 + 250 * torch.rand(n, generator=g, dtype=torch.float64)) * mag.expand_as(x).reshape(-1)[idx]
    return x.to(dtype)


def _block_amax(xt, block):
    """Per (b, h, block) amax of a [b, s, h, d] float tensor -> [b, h, nblocks]."""
    b, s, h, d = xt.shape
    nb = (s + block - 1) // block
    out = torch.zeros(b, h, nb, dtype=xt.dtype)
    for i in range(nb):
        out[:, :, i] = xt[:, i * block:(i + 1) * block].abs().amax(dim=(1, 3))
    return out


def _expand(scales, s, block):
    """[b, h, nb] -> [b, s, h, 1]: each token's scale."""
    idx = torch.arange(s) // block
    return scales[:, :, idx].permute(0, 2, 1).unsqueeze(-1)


def _codes(t):
    return t.view(torch.uint8)


def _sylvester(n):
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


# ---- the codec, through a block whose scale is exactly 1 ----------------------------------------

def _quantize_unit_scale(values):
    """E4M3 codes of `values` (|v| <= 448) from the library: one block whose amax is 448 (scale 1)."""
    v = torch.cat([torch.tensor([448.0]), values.float()])
    x = v.reshape(1, -1, 1, 1)
    q, scales = fp8.quantize(x, block_size=x.shape[1])
    assert scales.item() == 1.0
    return q.reshape(-1)[1:]


def test_codes_match_torch_rounding():
    g = _gen(1)
    table = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).double()  # 0 .. 448
    ties = (table[:-1] + table[1:]) / 2  # exact in fp32
    ulp = torch.nextafter(ties.float(), torch.tensor(1e9))
    ulp_down = torch.nextafter(ties.float(), torch.tensor(0.0))
    exps = torch.randint(-12, 9, (20000,), generator=g).double()
    rand = torch.rand(20000, generator=g, dtype=torch.float64) * torch.exp2(exps)
    vals = torch.cat([table, ties, ulp.double(), ulp_down.double(), rand.clamp(max=448)]).float()
    vals = torch.cat([vals, -vals])
    got = _codes(_quantize_unit_scale(vals))
    want = _codes(vals.to(torch.float8_e4m3fn))
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, f"seed {SEED}: {bad.numel()} codes differ, e.g. {vals[bad[:5]].tolist()}: " \
                             f"{got[bad[:5]].tolist()} vs torch {want[bad[:5]].tolist()}"


def test_decode_matches_torch_for_all_256_codes():
    codes = torch.arange(256, dtype=torch.int64).to(torch.uint8).view(torch.float8_e4m3fn).reshape(1, 256, 1, 1)
    got = fp8.dequantize(codes, torch.ones(1, 1, 1), block_size=256, dtype=torch.float64).reshape(-1)
    want = codes.reshape(-1).double()
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.isnan().nonzero().flatten(), torch.tensor([0x7F, 0xFF]))
    fin = ~want.isnan()
    assert torch.equal(got[fin], want[fin])
    assert torch.equal(torch.signbit(got[fin]), torch.signbit(want[fin]))


# ---- block quantization -------------------------------------------------------------------------

CASES = [  # (b, s, h, d, block_size)
    (2, 1, 3, 64, 128),
    (1, 7, 2, 32, 128),
    (2, 113, 2, 64, 16),
    (1, 113, 3, 128, 1),
    (1, 799, 2, 64, 128),   # 799 = 6 * 128 + 31
    (1, 799, 1, 32, 100),   # 100 does not divide 799
    (2, 300, 2, 64, 1000),  # block_size >= seqlen: one scale per (batch, head)
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("strided", [False, True])
def test_quantize_matches_torch_and_error_bound(dtype, case, strided):
    b, s, h, d, block = case
    g = _gen(hash((str(dtype), case, strided)) % 1000)
    x = _random((b, s, h, d), dtype, g)
    if strided:  # a [b, h, s, d] buffer seen as [b, s, h, d], and a gap along headdim's neighbours
        x = torch.nn.functional.pad(x.transpose(1, 2).contiguous(), (0, 5)).transpose(1, 2)[..., :d]
        assert not x.is_contiguous()
    q, scales = fp8.quantize(x, block_size=block)
    nb = math.ceil(s / block)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape
    assert scales.dtype == torch.float32 and scales.shape == (b, h, nb) and scales.is_contiguous()

    xf = x.float()
    want_scales = _block_amax(xf, block) / 448  # fp32 division, as the library
    assert torch.equal(scales, want_scales), f"seed {SEED}"
    xs = xf / _expand(scales, s, block)
    assert xs.abs().max() <= 448 * (1 + 2**-22)  # torch's conversion is exact RNE in this range
    bad = (_codes(q) != _codes(xs.to(torch.float8_e4m3fn))).sum().item()
    assert bad == 0, f"seed {SEED}: {bad} codes differ from torch's"

    # Error bound of E4M3 (3 mantissa bits): |scale * q - x| <= 2^-4 |x| for |x| >= 2^-6 scale,
    # <= 2^-10 scale below (subnormal step 2^-9), times 1 + 2^-20 for the fp32 division.
    back = fp8.dequantize(q, scales, block_size=block, dtype=torch.float64)
    sc = _expand(scales, s, block).double()
    xd = x.double()
    bound = torch.maximum(xd.abs() * 2**-4, sc * 2**-10) * (1 + 2**-20)
    err = (back - xd).abs()
    assert (err <= bound).all(), f"seed {SEED}: worst err/bound {(err / bound).max().item()}"
    # And it is not trivially loose: some element uses most of its half step.
    assert (err / bound).max() > 0.5


def test_hadamard_is_the_signed_sylvester_matrix():
    # Row j of x = e_j: its transform is column j of M = H diag(signs) / sqrt(d), so every entry is
    # +-1/sqrt(d), quantized exactly to +-448 (scale 1/(448 sqrt(d))), with signs H[:, j] * signs[j].
    for d in (16, 32, 64, 128, 256):
        x = torch.eye(d, dtype=torch.float32).reshape(1, d, 1, d)
        q, scales = fp8.quantize(x, block_size=1, hadamard=True, seed=SEED)
        assert torch.allclose(scales.double(), torch.full((1, 1, d), 1 / (448 * math.sqrt(d)), dtype=torch.float64),
                              rtol=1e-6)
        m = q.reshape(d, d).double()  # row j = column j of M, in units of scale
        assert (m.abs() == 448).all()
        cols = (m / 448).T  # cols[i, j] = H[i, j] * signs[j]
        signs = cols[0]  # H[0, j] = 1
        assert torch.equal(cols, _sylvester(d) * signs), f"d {d}, seed {SEED}"
        if d >= 64:  # both signs drawn (a 2^-63 chance otherwise)
            assert (signs == 1).any() and (signs == -1).any()
    # The signs depend on the seed and on nothing else.
    x = torch.eye(64).reshape(1, 64, 1, 64)
    a, _ = fp8.quantize(x, block_size=1, hadamard=True, seed=SEED)
    again, _ = fp8.quantize(x, block_size=1, hadamard=True, seed=SEED)
    other, _ = fp8.quantize(x, block_size=1, hadamard=True, seed=SEED + 1)
    assert torch.equal(_codes(a), _codes(again))
    assert not torch.equal(_codes(a), _codes(other))


@pytest.mark.parametrize("d", [64, 128])
def test_hadamard_keeps_scores_and_roundtrips(d):
    g = _gen(7 + d)
    b, s, h = 2, 150, 2
    qx = _random((b, s, h, d), torch.float32, g)
    kx = _random((b, s, h, d), torch.float32, g)
    seed = SEED * 3 + 1
    q8, qs = fp8.quantize(qx, block_size=64, hadamard=True, seed=seed)
    k8, ks = fp8.quantize(kx, block_size=64, hadamard=True, seed=seed)
    # Scores from the FP8 values in the transformed space equal the scores of the dequantized
    # (inverse-transformed) tensors: the transform is orthogonal (fp64 rounding only).
    qt = q8.double() * _expand(qs, s, 64).double()
    kt = k8.double() * _expand(ks, s, 64).double()
    qd = fp8.dequantize(q8, qs, 64, hadamard=True, seed=seed, dtype=torch.float64)
    kd = fp8.dequantize(k8, ks, 64, hadamard=True, seed=seed, dtype=torch.float64)
    st = torch.einsum("bihd,bjhd->bhij", qt, kt)
    sd = torch.einsum("bihd,bjhd->bhij", qd, kd)
    norms = qd.norm(dim=-1).transpose(1, 2).unsqueeze(-1) * kd.norm(dim=-1).transpose(1, 2).unsqueeze(-2)
    assert ((st - sd).abs() <= 1e-12 * norms).all(), f"seed {SEED}"
    # A wrong seed does not invert the transform.
    wrong = fp8.dequantize(q8, qs, 64, hadamard=True, seed=seed + 1, dtype=torch.float64)
    assert (wrong - qx.double()).norm() > 0.5 * qx.double().norm()
    # Round trip: per row, the L2 error is within the L2 norm of the per-element bounds of x'.
    sc = _expand(qs, s, 64).double()
    bound = torch.maximum(qt.abs() * 2**-4, sc * 2**-10) * (1 + 2**-20)
    err = (qd - qx.double()).norm(dim=-1)
    assert (err <= bound.norm(dim=-1) * (1 + 1e-9)).all(), f"seed {SEED}"


def test_non_finite_zero_and_tiny_blocks():
    g = _gen(3)
    x = torch.randn(1, 12, 1, 16, generator=g)
    x[0, 1, 0, 3] = float("nan")
    x[0, 2, 0, 5] = -float("inf")
    x[0, 4:8] = 0
    x[0, 8:12] = 1e-42  # fp32 subnormal: amax / 448 underflows
    q, scales = fp8.quantize(x, block_size=4)
    finite = x[0, :4].clone()
    finite[~finite.isfinite()] = 0
    assert scales[0, 0, 0] == finite.abs().max() / 448
    assert q[0, 1, 0, 3].float().isnan()
    assert q[0, 2, 0, 5].float() == -448
    assert scales[0, 0, 1] == 1.0 and (q[0, 4:8].float() == 0).all()
    assert scales[0, 0, 2] == torch.finfo(torch.float32).tiny and q[0, 8:12].float().isfinite().all()
    back = fp8.dequantize(q, scales, 4)
    assert back[0, 1, 0, 3].isnan() and back[0, 2, 0, 5] == -448 * scales[0, 0, 0]
    assert (back[0, 0] - x[0, 0]).abs().max() <= x[0, 0].abs().max() * 2**-4


def test_exports_and_empty():
    assert flashattn.fp8_quantize is fp8.quantize and flashattn.fp8_dequantize is fp8.dequantize
    assert "fp8_quantize" in flashattn.__all__
    q, scales = fp8.quantize(torch.randn(2, 0, 3, 64))
    assert q.shape == (2, 0, 3, 64) and scales.shape == (2, 3, 0)


@pytest.mark.parametrize("call,match", [
    (lambda x: fp8.quantize(x.numpy()), "x must be a torch.Tensor"),
    (lambda x: fp8.quantize(x[0]), "x must have 4 dims"),
    (lambda x: fp8.quantize(x.to(torch.int32)), "x dtype"),
    (lambda x: fp8.quantize(x, block_size=0), "block_size must be >= 1"),
    (lambda x: fp8.quantize(x, block_size=True), "block_size must be an int"),
    (lambda x: fp8.quantize(x, block_size=64.0), "block_size must be an int"),
    (lambda x: fp8.quantize(x[..., :48], hadamard=True), "hadamard=True needs headdim"),
    (lambda x: fp8.quantize(x, hadamard=2), "hadamard must be a bool"),
    (lambda x: fp8.quantize(x, hadamard=True, seed=-1), "seed must be an int"),
    (lambda x: fp8.quantize(x, hadamard=True, seed=2**64), "seed must be an int"),
    (lambda x: fp8.dequantize(x, torch.ones(2, 3, 1), 128), "x_fp8 must be torch.float8_e4m3fn"),
    (lambda x: fp8.dequantize(*fp8.quantize(x), 128, dtype=torch.int8), "dtype"),
    (lambda x: fp8.dequantize(fp8.quantize(x)[0], torch.ones(2, 3, 2), 128), "scales shape"),
    (lambda x: fp8.dequantize(fp8.quantize(x)[0], torch.ones(2, 3, 1, dtype=torch.float64), 128), "scales must be float32"),
    (lambda x: fp8.dequantize(fp8.quantize(x)[0], [1.0], 128), "scales must be a torch.Tensor"),
])
def test_bad_arguments_name_the_argument(call, match):
    x = torch.randn(2, 10, 3, 64)
    with pytest.raises(ValueError, match=match):
        call(x)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_quantize_matches_host_and_dequantize_is_refused():
    x = torch.randn(1, 8, 1, 64)
    q_host, s_host = fp8.quantize(x)
    q_dev, s_dev = fp8.quantize(x.cuda())  # no transform: the host's bits exactly
    assert torch.equal(q_dev.cpu().view(torch.uint8), q_host.view(torch.uint8))
    assert torch.equal(s_dev.cpu(), s_host)
    with pytest.raises(NotImplementedError, match="not implemented yet"):
        fp8.dequantize(q_dev, s_dev, 128)
