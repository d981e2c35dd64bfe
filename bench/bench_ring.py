"""Ring attention (flashattn.distributed) on W GPUs against the plain call on 1 GPU.

    NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node 2 bench/bench_ring.py \
        --seqlens 131072 262144 --heads 32 --headdim 128 --out bench/results/ring_h200x2.json

Smoke check on CPU (gloo, tiny shapes):

    torchrun --nproc_per_node 2 bench/bench_ring.py --device cpu --dtype float32 --seqlens 256 \
        --heads 2 --headdim 32 --iters 2 --warmup 1 --out /tmp/ring.json

For every sequence length, causal and not, fwd and fwd+bwd, it times (batch 1, one sequence):
  t_1gpu     flash_attn_func on the whole sequence on rank 0's device (the others wait);
  t_ring     ring_flash_attn_func on the zigzag shards, all ranks (max over ranks);
  t_compute  the same ring with the P2P replaced by local copies (compute only, same sub-blocks);
  t_comm     the ring's P2P alone (the same messages, no attention);
and reports speedup = t_1gpu / t_ring and comm_hidden_pct = 100 * (1 - (t_ring - t_compute) / t_comm)
(clipped to [0, 100]): the share of the communication time that does not show in the ring's time.
Where it runs, torch's own context parallel (torch.distributed.tensor.experimental.context_parallel
around SDPA) is timed beside it; otherwise its error is recorded.
"""

import argparse
import contextlib
import json
import os
import platform
import time

import torch
import torch.distributed as dist

import flashattn
from flashattn import flash_attn_func
from flashattn import distributed as fdist


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, device, iters, warmup, group=None):
    """Median seconds per call, all ranks in step (barrier before each call); max over ranks."""
    times = []
    for i in range(warmup + iters):
        if group is not False:
            dist.barrier()
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    # On the device: NCCL reduces device tensors only.
    med = torch.tensor([times[len(times) // 2]], dtype=torch.float64, device=device)
    if group is not False:
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return med.item()


@contextlib.contextmanager
def _no_comm():
    """The ring with its P2P replaced by local copies: the same kernels on same-shaped blocks."""
    orig = fdist._Ring.start

    def start(self, tensors):
        return [t.clone() for t in tensors], []

    fdist._Ring.start = start
    try:
        yield
    finally:
        fdist._Ring.start = orig


def _comm_only(k, v, world, rank, backward, acc_dtype):
    ring = fdist._Ring(None, world, rank)
    kv = [k, v]
    for _ in range(world - 1):
        kv, works = ring.start(kv)
        fdist._Ring.wait(works)
    if backward:  # the forward's rotation again, plus W hops of the fp32 dK/dV accumulators
        kv = [k, v]
        dkv = [torch.zeros(k.shape, dtype=acc_dtype, device=k.device), torch.zeros(v.shape, dtype=acc_dtype,
                                                                                 device=v.device)]
        for step in range(world):
            if step + 1 < world:
                kv, works = ring.start(kv)
                fdist._Ring.wait(works)
            if step + 1 == world:  # the last hop goes in the inputs' dtype (fdist._ring_backward)
                dkv = [t.to(k.dtype) for t in dkv]
            dkv, works = ring.start(dkv)
            fdist._Ring.wait(works)


def _torch_cp(q, k, v, causal, backward, device, world, iters, warmup):
    """torch's context parallel around SDPA ([b, h, s, d] layout), or the reason it does not run."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import set_rotate_method

        set_rotate_method("alltoall")
        mesh = init_device_mesh(device.type, (world,))
        full = [t.detach().transpose(1, 2).contiguous() for t in (q, k, v)]

        def run():
            # context_parallel shards its buffers in place (and keeps them sharded), so every call
            # gets fresh global copies (the copy is in the time: a few ms beside the attention);
            # requires_grad is set inside, on the shards (it cannot resize leaves that require grad).
            qt, kt, vt = (t.clone() for t in full)
            with context_parallel(mesh, buffers=[qt, kt, vt], buffer_seq_dims=[2, 2, 2]):
                qq, kk, vv = (t.detach().requires_grad_(backward) for t in (qt, kt, vt))
                out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
                if backward:
                    out.sum().backward()

        return _time(run, device, iters, warmup), None
    except Exception as e:  # recorded, not fatal: the flashattn numbers stand on their own
        return None, f"{type(e).__name__}: {str(e)[:300]}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlens", type=int, nargs="+", default=[131072, 262144])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--causal", default="both", choices=["both", "true", "false"])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-torch-cp", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    if a.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    dtype = getattr(torch, a.dtype)
    hk = a.kv_heads or a.heads
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    causals = {"both": [True, False], "true": [True], "false": [False]}[a.causal]
    results = []
    for s in a.seqlens:
        gen = torch.Generator(device=device).manual_seed(0)
        q = torch.randn(1, s, a.heads, a.headdim, dtype=dtype, device=device, generator=gen)
        k = torch.randn(1, s, hk, a.headdim, dtype=dtype, device=device, generator=gen)
        v = torch.randn(1, s, hk, a.headdim, dtype=dtype, device=device, generator=gen)
        ql, kl, vl = (fdist.shard(t) for t in (q, k, v))
        for causal in causals:
            for mode in ("fwd", "fwd+bwd"):
                bwd = mode == "fwd+bwd"

                def single():
                    if rank == 0:
                        qq, kk, vv = (t.requires_grad_(bwd) for t in (q, k, v))
                        out = flash_attn_func(qq, kk, vv, causal=causal)
                        if bwd:
                            out.backward(torch.ones_like(out))

                def ring():
                    qq, kk, vv = (t.detach().requires_grad_(bwd) for t in (ql, kl, vl))
                    out = fdist.ring_flash_attn_func(qq, kk, vv, causal=causal)
                    if bwd:
                        out.backward(torch.ones_like(out))

                t1 = _time(single, device, a.iters, a.warmup)
                tr = _time(ring, device, a.iters, a.warmup)
                with _no_comm():
                    tc = _time(ring, device, a.iters, a.warmup)
                tm = _time(lambda: _comm_only(kl, vl, world, rank, bwd, acc), device, a.iters, a.warmup)
                hidden = 100.0 * (1.0 - max(0.0, tr - tc) / tm) if tm > 0 else 100.0
                row = dict(seqlen=s, causal=causal, mode=mode, t_1gpu_ms=1e3 * t1, t_ring_ms=1e3 * tr,
                           speedup=t1 / tr, t_compute_only_ms=1e3 * tc, t_comm_only_ms=1e3 * tm,
                           comm_hidden_pct=max(0.0, min(100.0, hidden)))
                if not a.no_torch_cp:
                    tcp, err = _torch_cp(q, k, v, causal, bwd, device, world, a.iters, a.warmup)
                    row["torch_cp_ms"] = None if tcp is None else 1e3 * tcp
                    row["torch_cp_speedup"] = None if tcp is None else t1 / tcp
                    if err:
                        row["torch_cp_error"] = err
                results.append(row)
                if rank == 0:
                    print(json.dumps(row), flush=True)
    if rank == 0:
        doc = dict(
            bench="ring attention (flashattn.distributed.ring_flash_attn_func), zigzag sharding",
            world_size=world, device=(torch.cuda.get_device_name(device) if device.type == "cuda" else
                                      platform.processor() or "cpu"),
            backend=dist.get_backend(), nccl_nvls_enable=os.environ.get("NCCL_NVLS_ENABLE"),
            torch=torch.__version__, flashattn=flashattn.version(),
            shape=dict(batch=1, heads=a.heads, kv_heads=hk, headdim=a.headdim, dtype=a.dtype),
            timing=dict(iters=a.iters, warmup=a.warmup, stat="median per call, max over ranks"),
            results=results)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(doc, f, indent=1)
            print(f"wrote {a.out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
