#!/usr/bin/env python3
"""One attention forward (or forward + backward), called a few times, for a profiler
(scripts/ncu-compare).

    python bench/profile_one.py --impl cudnn|fa2|flashattn-sm90|flashattn-sm80 --hdim 128 --seqlen 16384
                                [--causal] [--calls 5] [--mode fwd|fwdbwd]
Shapes follow the FA3-paper sweep: 16k total tokens, hidden 2048. Inputs are random bf16.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_peers import HIDDEN, TOTAL_TOKENS, make_impl  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", required=True)
    p.add_argument("--hdim", type=int, default=128)
    p.add_argument("--seqlen", type=int, default=16384)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--mode", default="fwd", choices=["fwd", "fwdbwd"])
    a = p.parse_args()
    b, h = max(1, TOTAL_TOKENS // a.seqlen), HIDDEN // a.hdim
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(b, a.seqlen, h, a.hdim, device="cuda", dtype=torch.bfloat16, generator=g)
                     for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(a.mode == "fwdbwd")
    fwd, fwdbwd = make_impl(a.impl)(q, k, v, dout, a.causal)
    if a.mode == "fwdbwd":
        for _ in range(a.calls):
            fwdbwd()
    else:
        with torch.no_grad():
            for _ in range(a.calls):
                fwd()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
