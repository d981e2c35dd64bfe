// The Hopper backward kernel: one CTA per (key block, kv head, sequence), warp-specialized.
//   warpgroup 0 (gives registers back): warp 0 issues every TMA load (BwdMainloop::load),
//                warp 1 moves each step's dQ tile to the fp32 accumulator (store_dq).
//   warpgroups 1, 2 (64 keys each): the mainloop (BwdMainloop::mma), then dK/dV (BwdEpilogue).
// This file only composes the stages: their shared memory and params are their own.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include <cstddef>

#include "sm90/bwd_epilogue.h"
#include "sm90/bwd_mainloop.h"
#include "sm90/bwd_shapes.h"

namespace flashattn::sm90 {

template <class Traits>
struct BwdKernel {
  using Mainloop = BwdMainloop<Traits>;
  using Epilogue = BwdEpilogue<Traits>;

  // The epilogue's staging buffers reuse the mainloop's K and V bytes (the consumers are past
  // the mainloop; the dQ writer may still be reading its tile, which lies beyond them).
  struct SharedStorage {
    union {
      typename Mainloop::TensorStorage mainloop;
      typename Epilogue::TensorStorage epilogue;
    } tensors;
    typename Mainloop::BarrierStorage barriers;
  };
  static_assert(sizeof(typename Epilogue::TensorStorage) <= offsetof(typename Mainloop::TensorStorage, q),
                "the dK/dV staging must lie within K and V");
  struct Params {
    typename Mainloop::Params mainloop;
    typename Epilogue::Params epilogue;
    int num_n_blocks;  // key blocks per (kv head, sequence): blockIdx.x = n' + num_n * (kv_head + heads_kv * b)
    // n' = n, or num_n - 1 - n in deterministic mode, where key block n adds its dQ after the
    // blocks above it: those are then launched first, so a CTA only ever waits for CTAs of
    // lower index (already running or done), never for one that cannot start.
    int reverse_n;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
};

template <class Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    bwd_kernel(const __grid_constant__ typename BwdKernel<Traits>::Params p) {
  using K = BwdKernel<Traits>;
  using Mainloop = typename K::Mainloop;
  extern __shared__ __align__(1024) char smem_raw[];
  auto& ss = *reinterpret_cast<typename K::SharedStorage*>(smem_raw);

  if (threadIdx.x == 0) {
    Mainloop::prefetch_descriptors(p.mainloop);
    K::Epilogue::prefetch_descriptors(p.epilogue);
  }
  Mainloop::init_kv_barrier(ss.barriers);
  auto pipe_q = Mainloop::make_pipeline(ss.barriers.pipe_q);
  auto pipe_do = Mainloop::make_pipeline(ss.barriers.pipe_do);
  __syncthreads();  // barriers initialized before anyone waits on them

  const int heads_kv = p.mainloop.bwd.shape.nheads_kv;
  const int tile = int(blockIdx.x);
  const int n_launch = tile % p.num_n_blocks, rest = tile / p.num_n_blocks;
  const int n_block = p.reverse_n ? p.num_n_blocks - 1 - n_launch : n_launch;
  const BwdWork w = make_bwd_work(p.mainloop.bwd, n_block, rest % heads_kv, rest / heads_kv, Traits::kBlockM,
                                  Traits::kBlockN);
  if (n_block * Traits::kBlockN >= w.seq.seqlen_k) return;  // a varlen sequence shorter than the grid's

  const int wg = int(threadIdx.x) / 128;
  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    const int warp = int(threadIdx.x) / 32;
    if (warp == 0 && threadIdx.x == 0) Mainloop::load(p.mainloop, ss.tensors.mainloop, ss.barriers, pipe_q, pipe_do, w);
    if (warp == 1) Mainloop::store_dq(p.mainloop, ss.tensors.mainloop, w);
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int mma_tidx = int(threadIdx.x) - 128;
  typename Traits::TiledMmadKV mma_dkv;
  using TileKV = cute::Shape<cute::Int<Traits::kBlockN>, cute::Int<Traits::kHeadDim>>;
  auto tdKrdK = cute::partition_fragment_C(mma_dkv, TileKV{});
  auto tdVrdV = cute::partition_fragment_C(mma_dkv, TileKV{});
  cute::clear(tdKrdK);
  cute::clear(tdVrdV);
  typename Mainloop::PipelineState state;
  Mainloop::mma(p.mainloop, ss.tensors.mainloop, ss.barriers, pipe_q, pipe_do, state, w, tdKrdK, tdVrdV, mma_tidx);
  if (p.mainloop.bwd.dropout.enabled()) {  // dV summed the kept P; kept entries are 1 / keep probability
#pragma unroll
    for (int i = 0; i < cute::size(tdVrdV); ++i) tdVrdV(i) *= p.mainloop.bwd.dropout.scale;
  }
  K::Epilogue::store(p.epilogue, ss.tensors.epilogue, w.seq, w.n_block, w.kv_head, w.batch, tdKrdK, tdVrdV,
                     mma_tidx);
}

}  // namespace flashattn::sm90
