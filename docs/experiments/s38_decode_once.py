"""A few decode steps (sq1 b1 16k GQA 32/8, hdim 128, bench_decode's problem) for ncu (s38)."""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from bench_decode import impl_fn, make_problem  # noqa: E402

pr = make_problem(torch.device("cuda"), 1, 1, 16384, 32, 8, 128, 16)
fn = impl_fn("flashattn", pr)
for _ in range(8):
    fn()
torch.cuda.synchronize()
