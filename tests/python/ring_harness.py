"""The multi-process harness of the ring-attention tests (test_distributed.py on gloo, test_distributed_cuda.py on
NCCL): every rank runs the same named cases in order and writes {case: traceback or None} to result_<rank>.json;
the pytest side spawns the ranks once per world size and reads those files, one test per case."""

import json
import os
import traceback

import torch.multiprocessing as mp


def run_cases(runs, tmpdir, rank, after_each=None):
    """runs: (name, fn) pairs. After the first failure the rest are reported as not run: a failed case can leave
    P2P ops pending, which would hang the next collective."""
    results, failed = {}, False
    for name, fn in runs:
        if failed:
            results[name] = "not run: an earlier case failed on this rank"
            continue
        try:
            fn()
            if after_each is not None:
                after_each()
            results[name] = None
        except Exception:
            results[name] = traceback.format_exc()
            failed = True
    with open(os.path.join(tmpdir, f"result_{rank}.json"), "w") as f:
        json.dump(results, f)


def spawn_and_collect(worker, world, tmpdir):
    """worker(rank, world, tmpdir) in `world` processes; the per-rank results, rank order."""
    mp.spawn(worker, args=(world, tmpdir), nprocs=world, join=True)
    return [json.load(open(os.path.join(tmpdir, f"result_{r}.json"))) for r in range(world)]
