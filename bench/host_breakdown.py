#!/usr/bin/env python3
"""Where the host time of one tiny Python call goes (issue 17, item 5): flash_attn_func and
flash_attn_with_kvcache, split into the public function's argument checks, the eager dispatch
(autograd or not), the op implementation's Python (allocation, params struct), the ctypes call and
the C library's own work. Also the torch.library custom-op path (what torch.compile traces).

The C compute is taken out by a stub: the library's flashattn_fwd is replaced, for the stubbed rows,
by flashattn_fwd_workspace_size on the same params (the C ABI's validation and backend choice,
nothing launched or computed), so "stubbed" rows measure Python + ctypes + C validation.

    python bench/host_breakdown.py [--device cpu|cuda] [--iters N] [--repeats R] [--profile]

Numbers are medians over R repeats of N calls (µs per call) with the spread (min-max). The GPU
stays idle apart from the real calls' tiny kernels (CUDA: synchronized after each timed block).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import flashattn  # noqa: E402
from flashattn import _lib, _ops, flash_attn_func, flash_attn_with_kvcache  # noqa: E402


class _StubLib:
    """The loaded library with flashattn_fwd / flashattn_bwd replaced by the workspace-size queries."""

    def __init__(self, lib):
        self._lib = lib
        size = ctypes.c_size_t(0)
        ref = ctypes.byref(size)
        fws, bws = lib.flashattn_fwd_workspace_size, lib.flashattn_bwd_workspace_size
        self.flashattn_fwd = lambda p, ws, n, stream: fws(p, ref)
        self.flashattn_bwd = lambda p, ws, n, stream: bws(p, ref)

    def __getattr__(self, name):
        return getattr(self._lib, name)


@contextlib.contextmanager
def stubbed():
    lib = _lib.load()
    saved = _lib._LIB
    _lib._LIB = _StubLib(lib)
    reset = getattr(_ops, "_reset_lib_cache", None)  # a binding that caches the C functions
    if reset:
        reset()
    try:
        yield
    finally:
        _lib._LIB = saved
        if reset:
            reset()


def measure(fn, iters, repeats, sync):
    for _ in range(max(50, iters // 20)):
        fn()
    sync()
    res = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        res.append((time.perf_counter() - t) / iters * 1e6)
    return statistics.median(res), min(res), max(res)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--profile", action="store_true", help="also cProfile the stubbed flash_attn_func call")
    a = ap.parse_args()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    dt = torch.bfloat16 if cuda else torch.float32
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.manual_seed(0)

    # flash_attn_func: (1, 16, 1, 64): one query and one key per head.
    q, k, v = (torch.randn(1, 16, 1, 64, device=dev, dtype=dt) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    scale = 64 ** -0.5
    args = (q, k, v, None, None, 0, 0, scale, False, -1, -1, 0.0, False, 0)
    gargs = (qg, kg, vg) + args[3:]
    # flash_attn_with_kvcache, decode-shaped: q (1, 1, 16, 64) over a (1, 256, 16, 64) cache, 100 rows used.
    qd = torch.randn(1, 1, 16, 64, device=dev, dtype=dt)
    kc, vc = (torch.randn(1, 256, 16, 64, device=dev, dtype=dt) for _ in range(2))
    kn, vn = (torch.randn(1, 1, 16, 64, device=dev, dtype=dt) for _ in range(2))
    seqlens = torch.full((1,), 100, dtype=torch.int32, device=dev)
    kv_args = (qd, kc, vc, seqlens, None, None, None, None, None, None, 0, 0, scale, False, -1, -1, 0.0, 0, False, 0)

    def run(name, fn, note=""):
        med, lo, hi = measure(fn, a.iters, a.repeats, sync)
        print(f"  {name:58s} {med:7.2f}  ({lo:6.2f} - {hi:6.2f}) {note}")
        return med

    print(f"host time per call, µs: median (min - max) of {a.repeats} x {a.iters} calls")
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads; "
          f"torch {torch.__version__}; device {dev}"
          + (f" ({torch.cuda.get_device_name(dev)})" if cuda else "") + f"; dtype {dt}")
    print(f"library: {flashattn.library_path()}")
    r = {}
    print("flash_attn_func, q/k/v (1, 16, 1, 64):")
    lib = _lib.load()
    p = _lib.FwdParams()
    size = ctypes.c_size_t(0)
    with stubbed():
        r["fa_s"] = run("flash_attn_func, no grad [stub]", lambda: flash_attn_func(q, k, v))
        r["fa_grad_s"] = run("flash_attn_func, requires_grad [stub]", lambda: flash_attn_func(qg, kg, vg))
        r["attn_s"] = run("_ops.attention(op args), no grad [stub]", lambda: _ops.attention(*args))
        r["attn_grad_s"] = run("_ops.attention(op args), requires_grad [stub]", lambda: _ops.attention(*gargs))
        r["impl_s"] = run("_ops._fwd_impl(op args) [stub]", lambda: _ops._fwd_impl(*args))
        r["op_s"] = run("torch.ops.flashattn.fwd (custom op), no grad [stub]", lambda: torch.ops.flashattn.fwd(*args))
        r["op_grad_s"] = run("torch.ops.flashattn.fwd (custom op), requires_grad [stub]",
                             lambda: torch.ops.flashattn.fwd(*gargs))
        # Fill p as the real call does (last params built), for the C-only rows below.
        keep = _capture_params(p, lambda: _ops._fwd_impl(*args))  # p points into keep's out and lse
    # Real calls after the stubbed ones: the host backend's worker threads stay busy a while after a call.
    r["fa"] = run("flash_attn_func, no grad (real C call)", lambda: flash_attn_func(q, k, v))
    r["fa_grad"] = run("flash_attn_func, requires_grad (real C call)", lambda: flash_attn_func(qg, kg, vg))
    r["sdpa"] = run("torch sdpa, no grad (reference)",
                    lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))
    pb = ctypes.byref(p)
    stream = torch.cuda.current_stream(dev).cuda_stream if cuda else None
    ws = torch.empty(1 << 20, dtype=torch.uint8, device=dev) if cuda else None
    r["stub"] = run("stub alone: ctypes + C validation (workspace size)",
                    lambda: lib.flashattn_fwd_workspace_size(pb, ctypes.byref(size)))
    r["c"] = run("real flashattn_fwd alone (ctypes + validation + compute)",
                 lambda: lib.flashattn_fwd(pb, ws.data_ptr() if cuda else None, 1 << 20 if cuda else 0, stream))
    r["ctypes"] = run("ctypes call of a no-op C function", lambda: lib.flashattn_compiled_backends())
    r["alloc"] = run("torch.empty(out) + torch.empty(lse) (reference)",
                     lambda: (torch.empty((1, 16, 1, 64), dtype=dt, device=dev),
                              torch.empty((1, 1, 16), dtype=torch.float32, device=dev)))

    print("flash_attn_with_kvcache, q (1, 1, 16, 64), cache (1, 256, 16, 64), cache_seqlens int32 [1]:")
    with stubbed():
        r["kv_s"] = run("flash_attn_with_kvcache [stub]", lambda: flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=seqlens))
        r["kv_int_s"] = run("  cache_seqlens=100 (int) [stub]", lambda: flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=100))
        r["kv_app_s"] = run("  + k/v appended [stub]",
                            lambda: flash_attn_with_kvcache(qd, kc, vc, kn, vn, cache_seqlens=seqlens))
        r["kv_with_s"] = run("_ops.with_kvcache(False, op args) [stub]", lambda: _ops.with_kvcache(False, *kv_args))
        r["kv_impl_s"] = run("_ops._fwd_kvcache_impl(op args) [stub]", lambda: _ops._fwd_kvcache_impl(*kv_args))
        r["kv_op_s"] = run("torch.ops.flashattn.fwd_kvcache (custom op) [stub]",
                           lambda: torch.ops.flashattn.fwd_kvcache(*kv_args))
        pk = _lib.FwdParams()
        keep_kv = _capture_params(pk, lambda: _ops._fwd_kvcache_impl(*kv_args))
    r["kv"] = run("flash_attn_with_kvcache (real C call)", lambda: flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=seqlens))
    r["kv_app"] = run("  + k/v (1, 1, 16, 64) appended (real C call)",
                      lambda: flash_attn_with_kvcache(qd, kc, vc, kn, vn, cache_seqlens=seqlens))
    pkb = ctypes.byref(pk)
    r["kv_stub"] = run("stub alone: ctypes + C validation (workspace size)",
                       lambda: lib.flashattn_fwd_workspace_size(pkb, ctypes.byref(size)))

    del keep, keep_kv
    print("breakdown, µs per call (differences of the medians above):")
    rows = [
        ("flash_attn_func no grad: total (real C call)", r["fa"]),
        ("  public function's argument checks", r["fa_s"] - r["attn_s"]),
        ("  eager dispatch (_ops.attention -> impl)", r["attn_s"] - r["impl_s"]),
        ("  impl's Python: allocation, params struct, ...", r["impl_s"] - r["stub"]),
        ("    of which torch.empty(out) + torch.empty(lse) (reference)", r["alloc"]),
        ("  ctypes + C validation (stub alone)", r["stub"]),
        ("  C compute of this problem (real - stub)", r["c"] - r["stub"]),
        ("  Python layer (total with stub - stub alone)", r["fa_s"] - r["stub"]),
        ("flash_attn_func requires_grad: autograd wrapping", r["attn_grad_s"] - r["attn_s"]),
        ("  Python layer (total with stub - stub alone)", r["fa_grad_s"] - r["stub"]),
        ("custom op flashattn::fwd vs impl, no grad", r["op_s"] - r["impl_s"]),
        ("custom op flashattn::fwd vs impl, requires_grad", r["op_grad_s"] - r["impl_s"]),
        ("with_kvcache: public function's argument checks", r["kv_s"] - r["kv_with_s"]),
        ("  eager dispatch (_ops.with_kvcache -> impl)", r["kv_with_s"] - r["kv_impl_s"]),
        ("  impl's Python", r["kv_impl_s"] - r["kv_stub"]),
        ("  ctypes + C validation (stub alone)", r["kv_stub"]),
        ("  Python layer (total with stub - stub alone)", r["kv_s"] - r["kv_stub"]),
        ("  Python layer, cache_seqlens int", r["kv_int_s"] - r["kv_stub"]),
        ("  Python layer, k/v appended", r["kv_app_s"] - r["kv_stub"]),
        ("custom op flashattn::fwd_kvcache vs impl", r["kv_op_s"] - r["kv_impl_s"]),
    ]
    for name, val in rows:
        print(f"  {name:58s} {val:7.2f}")

    if a.profile:
        import cProfile
        import pstats

        with stubbed():
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(a.iters):
                flash_attn_func(q, k, v)
            pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(20)


def _capture_params(dst, call):
    """Copies the params struct of the next (stubbed) fwd call into dst; returns the call's result, which dst
    points into (keep it alive while dst is used)."""
    stub = _lib._LIB
    inner = stub.flashattn_fwd

    def grab(pp, ws, n, stream):
        src = getattr(pp, "_obj", pp)  # byref(params), or the params / an address
        addr = src if isinstance(src, int) else ctypes.addressof(src)
        ctypes.memmove(ctypes.addressof(dst), addr, ctypes.sizeof(dst))
        return inner(pp, ws, n, stream)

    stub.flashattn_fwd = grab
    try:
        return call()
    finally:
        stub.flashattn_fwd = inner


if __name__ == "__main__":
    main()
