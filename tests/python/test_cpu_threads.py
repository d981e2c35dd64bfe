"""The host paths run on torch's thread count: the Python layer passes torch.get_num_threads()
through the C ABI (options.num_threads) for CPU tensors. The C++ test CpuCAbi.NumThreadsOption*
checks that the library then starts exactly that many workers."""

import ctypes

import pytest
import torch

from flashattn import _lib, _ops, flash_attn_func


class _Recorder:
    """Stands in for the loaded library: records options.num_threads of every call, then forwards."""

    def __init__(self, lib):
        self._lib = lib
        self.seen = []

    def __getattr__(self, name):
        fn = getattr(self._lib, name)
        if name not in ("flashattn_fwd", "flashattn_bwd"):
            return fn

        def call(params, *rest):
            self.seen.append((name, params._obj.options.num_threads))
            return fn(params, *rest)

        return call


@pytest.fixture
def recorder(monkeypatch):
    rec = _Recorder(_lib.load())
    monkeypatch.setattr(_ops._lib, "load", lambda: rec)
    old = torch.get_num_threads()
    yield rec
    torch.set_num_threads(old)


@pytest.mark.parametrize("threads", [1, 3])
def test_cpu_calls_pass_torch_num_threads(recorder, threads):
    torch.set_num_threads(threads)
    q, k, v = (torch.randn(1, 70, 2, 32, requires_grad=True) for _ in range(3))
    flash_attn_func(q, k, v, causal=True).sum().backward()
    assert ("flashattn_fwd", threads) in recorder.seen
    assert ("flashattn_bwd", threads) in recorder.seen
    assert all(n == threads for _, n in recorder.seen), recorder.seen


def test_negative_num_threads_is_refused_by_name():
    lib = _lib.load()
    q, k, v, o = (torch.randn(1, 8, 2, 32) for _ in range(4))
    p = lib.flashattn_fwd_params_init()
    p.dtype = _lib.DTYPE_FP32
    for name, t in (("q", q), ("k", k), ("v", v), ("out", o)):
        getattr(p, name).data = t.data_ptr()
        getattr(p, name).shape[:] = list(t.shape)
        getattr(p, name).stride[:] = list(t.stride())
    p.options.backend = _lib.BACKEND_CPU
    assert lib.flashattn_fwd(ctypes.byref(p), None, 0, None) == _lib.SUCCESS, _lib.last_error()
    p.options.num_threads = -2
    assert lib.flashattn_fwd(ctypes.byref(p), None, 0, None) == _lib.ERROR_INVALID_ARGUMENT
    assert "options.num_threads: -2" in _lib.last_error()
