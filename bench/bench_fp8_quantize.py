#!/usr/bin/env python3
"""The FP8 quantizer's bandwidth (issue 16, item 3): flashattn.fp8.quantize on the GPU, bytes read
(the input) + written (E4M3 values + fp32 block scales) per second, beside the device copy bandwidth
(bytes read + written by a large device-to-device copy) measured in the same run. With and without
the incoherent transform (random signs + Walsh-Hadamard along the head dim).

    python bench/bench_fp8_quantize.py [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
try:
    import flashattn  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT / "python"))
import flashattn.fp8  # noqa: E402
from bench_decode import copy_gbps, time_ms  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="*", default=["8,8192,16,128", "4,8192,8,256", "16,8192,32,64", "1,4096,32,128"])
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--target-ms", type=float, default=100.0)
    p.add_argument("--warmup-ms", type=float, default=20.0)
    p.add_argument("--min-iters", type=int, default=10)
    p.add_argument("--max-iters", type=int, default=1000)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    dev = torch.device("cuda")
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    name = torch.cuda.get_device_name(dev)
    copy = copy_gbps(dev, a)
    print(f"device: {name}; copy bandwidth (read + write): {copy:.0f} GB/s")
    rows = []
    for shape in a.shapes:
        b, s, h, d = map(int, shape.split(","))
        x = torch.randn(b, s, h, d, device=dev, dtype=dt)
        nblocks = (s + a.block_size - 1) // a.block_size
        moved = x.numel() * x.element_size() + x.numel() + b * h * nblocks * 4
        # layout "keys_permuted16": V written straight in the sm90 kernel's V^T layout; "rows+convert": the two
        # passes it replaces (quantize in rows, then keys_permuted16()).
        q = flashattn.fp8.quantize
        variants = [("rows", False, lambda: q(x, block_size=a.block_size, seed=1)),
                    ("rows", True, lambda: q(x, block_size=a.block_size, hadamard=True, seed=1)),
                    ("keys_permuted16", False, lambda: q(x, block_size=a.block_size, layout="keys_permuted16")),
                    ("rows+convert", False, lambda: flashattn.fp8.keys_permuted16(q(x, block_size=a.block_size)[0]))]
        for layout, had, fn in variants:
            ms = time_ms(fn, a, dev)
            gbps = moved / (ms * 1e-3) / 1e9
            row = dict(shape=[b, s, h, d], dtype=a.dtype, block_size=a.block_size, hadamard=had, layout=layout, ms=ms,
                       gbps=gbps, pct_of_copy=100 * gbps / copy)
            rows.append(row)
            print(f"{shape:>16} hadamard={int(had)} {layout:>15} {ms:8.3f} ms {gbps:7.0f} GB/s "
                  f"{row['pct_of_copy']:5.1f}% of copy")
        del x
    out = a.out or str(ROOT / "bench" / "results" /
                       f"{''.join(c if c.isalnum() else '-' for c in name.lower())}-{datetime.date.today():%Y%m%d}-fp8-quantize.json")
    Path(out).write_text(json.dumps(dict(device=name, torch=torch.__version__, copy_gbps=copy, rows=rows), indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
