"""flashattn on CUDA tensors: every compiled GPU path vs the float64 oracle, varlen, CUDA-graph
capture, torch.compile, streams, layouts. Skipped (with the reason) without a GPU or without a
CUDA build of the library."""

import pytest
import torch

import flashattn
from flashattn import flash_attn_func, flash_attn_qkvpacked_func, flash_attn_varlen_func
from flashattn.interface import _flash_attn
from ref import check, rand, run_case, varlen_ref


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


if not torch.cuda.is_available():
    pytestmark = pytest.mark.skip(reason="no CUDA device (torch.cuda.is_available() is False)")
elif not _gpu_backends():
    pytestmark = pytest.mark.skip(
        reason=f"the loaded library ({flashattn.library_path()}) has no GPU path for this device "
               f"(compiled: {flashattn.compiled_backends()}; build with FLASHATTN_CUDA=ON)")

DEV = "cuda"
BACKENDS = ["auto", "sm80", "sm90"]


def _need(backend):
    if backend != "auto" and backend not in _gpu_backends():
        pytest.skip(f"backend {backend} not compiled or not runnable on this GPU")


# (b, sq, sk, h, hk, d, causal, window, softcap)
CASES = [
    (2, 128, 128, 8, 8, 64, False, (-1, -1), 0.0),
    (2, 113, 203, 8, 2, 128, True, (-1, -1), 0.0),
    (1, 1023, 799, 4, 1, 128, True, (-1, -1), 0.0),
    (2, 256, 256, 4, 4, 256, False, (-1, -1), 0.0),
    (1, 4097, 4097, 2, 1, 64, True, (-1, -1), 0.0),
    (3, 7, 1, 4, 2, 32, False, (-1, -1), 0.0),
    (2, 300, 300, 4, 4, 96, False, (64, 0), 0.0),
    (1, 203, 203, 4, 2, 192, True, (-1, -1), 30.0),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=[f"b{c[0]}_q{c[1]}_k{c[2]}_h{c[3]}-{c[4]}_d{c[5]}"
                                            f"{'_causal' if c[6] else ''}_w{c[7][0]},{c[7][1]}_cap{c[8]:g}"
                                            for c in CASES])
def test_cuda_fwd_bwd_vs_oracle(case, dtype, backend):
    _need(backend)
    b, sq, sk, h, hk, d, causal, window, softcap = case
    try:
        run_case(b, sq, sk, h, hk, d, dtype, causal=causal, window=window, softcap=softcap, device=DEV,
                 backend=backend)
    except NotImplementedError as e:
        if backend == "auto":
            raise  # AUTO must find a path for every supported problem
        pytest.skip(f"{backend}: {e}")


def test_cuda_headdim_padding():
    # headdim 60 is not a multiple of 8: padded to 64 like flash_attn does.
    run_case(2, 77, 91, 4, 2, 60, torch.bfloat16, causal=True, device=DEV)


# Head dims without a kernel of their own (flash_attn 2.x runs every head dim <= 256): a multiple
# of 8 runs on the next larger compiled kernel, anything else is first padded to a multiple of 8.
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d", [16, 40, 59, 80, 111, 112, 160, 224])
def test_cuda_every_headdim(d, backend):
    _need(backend)
    dtype = torch.float16 if d % 2 else torch.bfloat16
    run_case(2, 113, 203, 4, 2, d, dtype, causal=d % 16 == 0, window=(-1, -1) if d < 100 else (64, 8),
             softcap=0.0 if d % 3 else 20.0, device=DEV, backend=backend)


@pytest.mark.parametrize("causal", [False, True])
def test_cuda_varlen(causal):
    lens_q, lens_k = [1, 7, 113, 0, 203, 640], [1, 113, 7, 5, 203, 512]
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    dtype = torch.bfloat16
    q = rand(sum(lens_q), 8, 128, dtype=dtype, device=DEV).requires_grad_()
    k = rand(sum(lens_k), 2, 128, dtype=dtype, device=DEV).requires_grad_()
    v = rand(sum(lens_k), 2, 128, dtype=dtype, device=DEV).requires_grad_()
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                         return_attn_probs=True)
    l64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    llp = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o64, lse64 = varlen_ref(*l64, cu_q, cu_k, causal=causal)
    olp, lselp = varlen_ref(*llp, cu_q, cu_k, causal=causal)
    check("out", out, olp, o64, dtype)
    check("lse", lse, lselp, lse64, dtype)
    dout = rand(*out.shape, dtype=dtype, device=DEV)
    for name, a, lp, o in zip(("dq", "dk", "dv"), torch.autograd.grad(out, (q, k, v), dout),
                              torch.autograd.grad(olp, llp, dout), torch.autograd.grad(o64, l64, dout.double())):
        check(name, a, lp, o, dtype)


def test_cuda_graph_capture_fwd_bwd():
    b, s, h, d = 2, 256, 8, 128
    q, k, v = (rand(b, s, h, d, dtype=torch.bfloat16, device=DEV).requires_grad_() for _ in range(3))
    dout = rand(b, s, h, d, dtype=torch.bfloat16, device=DEV)

    def step():
        out = flash_attn_func(q, k, v, causal=True)
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture, as torch recommends
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    with torch.no_grad():
        for t in (q, k, v, dout):
            t.copy_(rand(*t.shape, dtype=t.dtype, device=DEV))
    graph.replay()
    torch.cuda.synchronize()
    eager = step()
    torch.testing.assert_close(static[0], eager[0], rtol=0, atol=0, msg="out: graph replay differs from eager")
    # The backward may accumulate dQ with atomics (run-to-run order differences only).
    for name, a, e in zip(("dq", "dk", "dv"), static[1:], eager[1:]):
        torch.testing.assert_close(a, e, rtol=2e-2, atol=2e-2, msg=f"{name}: graph replay differs from eager")


def test_cuda_graph_capture_decode_step():
    # A decode-sized forward (one new query against a long cache, GQA), captured once and replayed
    # with fresh inputs copied into the static buffers, as a generation loop does.
    b, sk, h, hk, d = 4, 1537, 16, 2, 128
    q = rand(b, 1, h, d, dtype=torch.bfloat16, device=DEV)
    k, v = (rand(b, sk, hk, d, dtype=torch.bfloat16, device=DEV) for _ in range(2))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flash_attn_func(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = flash_attn_func(q, k, v, causal=True)
    for _ in range(3):
        with torch.no_grad():
            for t in (q, k, v):
                t.copy_(rand(*t.shape, dtype=t.dtype, device=DEV))
        graph.replay()
        torch.cuda.synchronize()
        eager = flash_attn_func(q, k, v, causal=True)
        torch.testing.assert_close(static, eager, rtol=0, atol=0, msg="decode: graph replay differs from eager")
        assert not torch.isnan(static).any()


def test_cuda_graph_capture_varlen_without_warmup():
    lens = [100, 3, 250]
    cu = torch.tensor([0, 100, 103, 353], dtype=torch.int32, device=DEV)
    q, k, v = (rand(353, 4, 64, dtype=torch.float16, device=DEV) for _ in range(3))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static, flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True),
                               rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_cuda_torch_compile(mode):
    torch._dynamo.reset()
    q, k, v = (rand(2, 200, n, 64, dtype=torch.bfloat16, device=DEV).requires_grad_() for n in (8, 2, 2))

    def f(q, k, v):
        o = flash_attn_func(q * 0.5, k, v, causal=True, softcap=15.0)
        return (o.float() ** 2).sum()

    compiled = torch.compile(f, fullgraph=True, mode=mode)
    for _ in range(3):  # reduce-overhead records a CUDA graph after warm-up runs
        loss = compiled(q, k, v)
        g = torch.autograd.grad(loss, (q, k, v))
    loss_ref = f(q, k, v)
    g_ref = torch.autograd.grad(loss_ref, (q, k, v))
    torch.testing.assert_close(loss, loss_ref, rtol=1e-3, atol=1e-3)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)


def test_cuda_side_stream_and_layouts():
    qkv = rand(2, 333, 3, 8, 64, dtype=torch.bfloat16, device=DEV).requires_grad_()
    ref = flash_attn_qkvpacked_func(qkv, causal=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = flash_attn_qkvpacked_func(qkv, causal=True)
    torch.cuda.current_stream().wait_stream(s)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    # A view at an odd element offset: not 16-byte aligned, so it is copied, not rejected.
    buf = rand(2 * 50 * 4 * 64 + 1, dtype=torch.bfloat16, device=DEV)
    q = buf[1:].view(2, 50, 4, 64)
    torch.testing.assert_close(flash_attn_func(q, q, q), flash_attn_func(q.clone(), q.clone(), q.clone()),
                               rtol=0, atol=0)


def test_cuda_empty_rows_and_lse():
    q, k, v = (rand(1, n, 2, 64, dtype=torch.bfloat16, device=DEV) for n in (9, 4, 4))
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.all(out[:, :5] == 0) and torch.all(torch.isneginf(lse[:, :, :5]))
    assert torch.isfinite(out[:, 5:]).all()


def test_cuda_errors():
    q = rand(1, 8, 2, 64, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(NotImplementedError, match="float32"):
        flash_attn_func(q.float(), q.float(), q.float())
    with pytest.raises(ValueError, match="same device"):
        flash_attn_func(q, q.cpu(), q)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        flash_attn_varlen_func(q[0], q[0], q[0], cu, cu.cuda(), 8, 8)
    with pytest.raises(ValueError, match="options.device"):
        _flash_attn(q, q, q, backend="cpu")
    with pytest.raises(ValueError, match="dropout_p"):
        flash_attn_func(q, q, q, dropout_p=1.0)
    with pytest.raises(ValueError, match="alibi_slopes"):
        flash_attn_func(q, q, q, alibi_slopes=torch.ones(3, device=DEV))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_cuda_second_device():
    q = rand(1, 64, 2, 64, dtype=torch.bfloat16, device="cuda:1")
    out = flash_attn_func(q, q, q)
    torch.testing.assert_close(out.cpu(), flash_attn_func(q.cuda(0), q.cuda(0), q.cuda(0)).cpu(), rtol=0, atol=0)
