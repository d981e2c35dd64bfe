// The Hopper forward kernel: warp specialization as in FA3 Algorithm 1.
//   warpgroup 0  (producer): gives registers back (setmaxnreg.dec); one thread issues the TMA
//                 loads of Q_i, K_j, V_j into the smem pipelines for every tile of this CTA.
//   warpgroups 1.. (consumers, 64 query rows each): take the registers (setmaxnreg.inc);
//                 per tile: O = 0, m = -inf, l = 0; the mainloop over key blocks
//                 (S = QK^T, softmax, O += PV); the epilogue (O / l, LSE; O through smem
//                 and a TMA store).
//                 With intra-warpgroup overlap a tile is head, body, tail (mainloop.h).
// This file only coordinates; each technique lives in its own header.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "sm90/epilogue.h"
#include "sm90/kernel_params.h"
#include "sm90/mainloop.h"
#include "sm90/named_barriers.h"
#include "sm90/pipeline.h"
#include "sm90/producer.h"
#include "sm90/tile_shapes.h"

namespace flashattn::sm90 {

// 1024-byte alignment: the 128B-swizzle atom repeats every 8 rows x 128 bytes, and both TMA
// and the WGMMA descriptors assume swizzle phase 0 at the start of each buffer.
template <class Traits, bool kStaged = Traits::kTmaStoreO>
struct SmemO {  // O's staging buffer for the TMA store (epilogue.h)
  cute::array_aligned<typename Traits::Element, cute::cosize_v<typename Traits::SmemLayoutO>, 1024> smem_o;
  __device__ typename Traits::Element* o() { return smem_o.data(); }
};
template <class Traits>
struct SmemO<Traits, false> {  // hdim 192/256: O goes from registers to global memory
  __device__ typename Traits::Element* o() { return nullptr; }
};

template <class Traits>
struct SharedStorage {
  using Element = typename Traits::Element;
  cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutQ>, 1024> smem_q;
  cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutK>, 1024> smem_k;
  cute::array_aligned<Element, cute::cosize_v<typename Traits::SmemLayoutV>, 1024> smem_v;
  SmemO<Traits> out;
  typename Pipelines<Traits>::SharedStorage pipes;
  TileQueue::SharedStorage tiles;
};

template <class Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1) fwd_kernel(const __grid_constant__ KernelParams<Traits> p) {
  using namespace cute;
  using SS = SharedStorage<Traits>;
  using P = Pipelines<Traits>;
  extern __shared__ __align__(1024) char smem_raw[];
  SS& ss = *reinterpret_cast<SS*>(smem_raw);
  const int wg = int(threadIdx.x) / 128;

  if (threadIdx.x == 0) {
    prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
  }
  auto pipe_q = P::template make<typename P::Q>(ss.pipes.q, Traits::kBytesQ);
  auto pipe_k = P::template make<typename P::KV>(ss.pipes.k, Traits::kBytesKV);
  auto pipe_v = P::template make<typename P::KV>(ss.pipes.v, Traits::kBytesKV);
  TileQueue::init(ss.tiles, Traits::kNumMmaThreads);
  __syncthreads();  // barriers initialized before anyone waits on them

  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (threadIdx.x == 0) Producer<Traits, SS>::run(p, ss, pipe_q, pipe_k, pipe_v);
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int mma_tidx = int(threadIdx.x) - 128;
  const PingpongScheduler<Traits::kNumMmaWG> ping{uint32_t(wg - 1), p.pingpong != 0};
  ping.init();
  using ML = Mainloop<Traits, SS>;
  ML mainloop;  // carries the pipeline read state across tiles
  const typename ML::Pipes pipes{pipe_q, pipe_k, pipe_v};
  const ScoreTransform tf = ScoreTransform::make(p.fwd.mask.softmax_scale, p.fwd.mask.softcap);

  const bool overlap = p.intra_warpgroup_overlap != 0;
  const bool dynamic = p.scheduler.counter != nullptr;
  for (int k = 0, tile; (tile = dynamic ? TileQueue::pop(ss.tiles, k) : p.scheduler.static_tile(k)) <
                        p.scheduler.num_tiles;
       ++k) {
    const TileCoord t = p.scheduler.coord(tile);
    const TileWork w = make_tile_work<Traits>(p.fwd, t);
    if (!w.has_rows) continue;
    typename ML::AccO tOrO;
    clear(tOrO);
    typename ML::Softmax sm;
    sm.init(tf);
    if (!w.empty() && overlap) {
      mainloop.head(ss, pipes, w, t.m_block, sm, ping, mma_tidx);
      mainloop.body(ss, pipes, w, t.m_block, tOrO, sm, ping, mma_tidx);
      mainloop.tail(ss, pipes, tOrO, mma_tidx);
    } else if (!w.empty()) {  // ablation: the plain schedule
      mainloop.run_plain(ss, pipes, w, t.m_block, tOrO, sm, ping, mma_tidx);
    }
    Epilogue<Traits>::store(p, ss.out.o(), t, w, tOrO, sm, mma_tidx);
  }
  Epilogue<Traits>::finish(mma_tidx);
}

}  // namespace flashattn::sm90
