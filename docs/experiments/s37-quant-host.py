#!/usr/bin/env python3
"""s37: host time per call of flashattn.fp8.quantize / flash_attn_fp8_func / flashattn.combine on a GPU host, with
_lib.place's stream lookup as before (torch.cuda.current_stream(...).cuda_stream, a Stream object per call) and as
now (torch._C._cuda_getCurrentRawStream), alternated; then a cProfile of the quantize call. Tiny tensors, calls
back to back (no sync inside a timed block), median of R repeats of N calls, us per call."""
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import flashattn  # noqa: E402
import flashattn.fp8 as fp8  # noqa: E402
from flashattn import _lib  # noqa: E402

new_place = _lib.place


def old_place(options, t):
    if t.device.type == "cuda":
        options.device = t.device.index if t.device.index is not None else torch.cuda.current_device()
        return torch.cuda.current_stream(t.device).cuda_stream
    return new_place(options, t)


def measure(fn, iters=2000, repeats=7):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    res = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        res.append((time.perf_counter() - t) / iters * 1e6)
    return statistics.median(res), min(res), max(res)


dev = torch.device("cuda")
torch.manual_seed(0)
x = torch.randn(1, 128, 4, 128, device=dev, dtype=torch.bfloat16)
q, k, v = (torch.randn(1, 128, 4, 128, device=dev, dtype=torch.bfloat16) for _ in range(3))
outs = torch.randn(2, 1, 1, 4, 128, device=dev, dtype=torch.float32)
lses = torch.randn(2, 1, 4, 1, device=dev, dtype=torch.float32)
calls = {
    "quantize rows": lambda: fp8.quantize(x),
    "quantize rows hadamard": lambda: fp8.quantize(x, hadamard=True, seed=1),
    "quantize keys_permuted16": lambda: fp8.quantize(x, layout="keys_permuted16"),
    "flash_attn_fp8_func": lambda: fp8.flash_attn_fp8_func(q, k, v),
    "flash_attn_func (bf16, reference)": lambda: flashattn.flash_attn_func(q, k, v),
}
try:
    flashattn.combine(outs, lses)
    calls["flashattn.combine"] = lambda: flashattn.combine(outs, lses)
except Exception as e:  # noqa: BLE001
    print("combine not timed:", type(e).__name__, e)
print(torch.cuda.get_device_name(dev), torch.__version__)
t_old = measure(lambda: torch.cuda.current_stream(dev).cuda_stream)
t_new = measure(lambda: torch._C._cuda_getCurrentRawStream(0))
print(f"stream lookup: current_stream().cuda_stream {t_old[0]:.2f} us, _cuda_getCurrentRawStream {t_new[0]:.2f} us")
for rnd in range(2):
    for name, fn in calls.items():
        r = {}
        for tag, pl in (("old", old_place), ("new", new_place)):
            _lib.place = pl
            r[tag] = measure(fn)
        _lib.place = new_place
        print(f"round {rnd} {name:36s} old {r['old'][0]:7.2f} ({r['old'][1]:.2f}-{r['old'][2]:.2f})  "
              f"new {r['new'][0]:7.2f} ({r['new'][1]:.2f}-{r['new'][2]:.2f}) us/call")
pr = cProfile.Profile()
pr.enable()
for _ in range(3000):
    fp8.quantize(x)
pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(18)
