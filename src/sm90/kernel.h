// The Hopper forward kernel: warp specialization as in FA3 Algorithm 1.
//   warpgroup 0  (producer): gives registers back (setmaxnreg.dec); one thread issues the TMA
//                 loads of Q_i, K_j, V_j into the smem pipelines for every tile of this CTA.
//   warpgroups 1.. (consumers, 64 query rows each): take the registers (setmaxnreg.inc);
//                 per tile: O = 0, m = -inf, l = 0; the mainloop over key blocks
//                 (S = QK^T, softmax, O += PV); the epilogue (O / l, LSE; O through smem
//                 and a TMA store).
//                 With intra-warpgroup overlap a tile is head, body, tail (mainloop.h), and
//                 with cross-tile overlap the next tile's head runs under this tile's tail,
//                 so a persistent CTA's tensor cores do not drain at tile boundaries.
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

  // The next tile of this CTA that has query rows (same sequence as the producer's).
  const bool dynamic = p.scheduler.counter != nullptr;
  int k = 0;
  auto next_tile = [&](TileCoord& t, TileWork& w) {
    for (;;) {
      const int tile = dynamic ? TileQueue::pop(ss.tiles, k) : p.scheduler.static_tile(k);
      ++k;
      if (tile >= p.scheduler.num_tiles) return false;
      t = p.scheduler.coord(tile);
      w = make_tile_work<Traits>(p.fwd, t);
      if (w.has_rows) return true;
    }
  };

  typename ML::AccO tOrO;
  typename ML::Softmax sm;
  TileCoord t;
  TileWork w;
  bool more = next_tile(t, w);
  if (p.intra_warpgroup_overlap == 0) {  // ablation: the plain schedule
    for (; more; more = next_tile(t, w)) {
      clear(tOrO);
      sm.init(tf);
      if (!w.empty()) mainloop.run_plain(ss, pipes, w, t.m_block, tOrO, sm, ping, mma_tidx);
      Epilogue<Traits>::store(p, ss.out.o(), t, w, tOrO, sm, mma_tidx);
    }
  } else if (!Traits::kCrossTileOverlap || p.cross_tile_overlap == 0) {  // tile after tile
    for (; more; more = next_tile(t, w)) {
      clear(tOrO);
      sm.init(tf);
      if (!w.empty()) {
        mainloop.head(ss, pipes, w, t.m_block, sm, ping, mma_tidx);
        mainloop.body(ss, pipes, w, t.m_block, tOrO, sm, ping, mma_tidx);
        mainloop.tail(ss, pipes, tOrO, mma_tidx);
      }
      Epilogue<Traits>::store(p, ss.out.o(), t, w, tOrO, sm, mma_tidx);
    }
  } else if constexpr (Traits::kCrossTileOverlap) {  // the next tile's head under this tile's tail
    if (more) {
      clear(tOrO);
      sm.init(tf);
      if (!w.empty()) mainloop.head(ss, pipes, w, t.m_block, sm, ping, mma_tidx);
    }
    while (more) {
      if (!w.empty()) mainloop.body(ss, pipes, w, t.m_block, tOrO, sm, ping, mma_tidx);
      TileCoord t_next;
      TileWork w_next;
      more = next_tile(t_next, w_next);
      typename ML::Softmax sm_next;
      sm_next.init(tf);
      const bool joined = more && !w.empty() && !w_next.empty();
      if (joined) {
        mainloop.tail_and_next_head(ss, pipes, tOrO, w_next, t_next.m_block, sm_next, ping, mma_tidx);
      } else if (!w.empty()) {
        mainloop.tail(ss, pipes, tOrO, mma_tidx);
      }
      Epilogue<Traits>::store(p, ss.out.o(), t, w, tOrO, sm, mma_tidx);
      if (!more) break;
      clear(tOrO);
      sm = sm_next;
      t = t_next;
      w = w_next;
      if (!joined && !w.empty()) mainloop.head(ss, pipes, w, t.m_block, sm, ping, mma_tidx);
    }
  }
  Epilogue<Traits>::finish(mma_tidx);
}

}  // namespace flashattn::sm90
