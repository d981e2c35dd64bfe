// Pingpong between the consumer warpgroups (FA3 "warp scheduler barrier"): warpgroup w may
// issue its GEMMs only after warpgroup w-1 issued its own, so while one warpgroup runs its
// softmax (MUFU/FMA) the other keeps the tensor cores busy. Hardware named barriers; id 0 is
// __syncthreads, so the ids start at 1. Each barrier counts 256 threads: the 128 of the
// warpgroup waiting for its turn plus the 128 of the previous warpgroup arriving.
#pragma once

#include <cstdint>

namespace flashattn::sm90 {

__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

enum : uint32_t {
  kBarrierPingpongBase = 1,  // ids 1 .. 3: one per consumer warpgroup
  kBarrierEpilogueBase = 4,  // ids 4 .. 6: a consumer warpgroup's O staging (epilogue.h)
  kBarrierTranspose = 7,     // FP8: the V-transposing warps of the producer warpgroup (producer.h)
};

// The turn order between the consumer warpgroups. Every warpgroup runs the same number of
// sync/arrive sections per tile (one per key block), so the turns stay balanced across tiles;
// the one extra arrival from init() carries over as the first turn of the next tile.
// kEnabled = false (an ablation kernel, mainloop.h Schedule): no turns, every call is empty.
template <int kNumMmaWG, bool kEnabled = true>
struct PingpongScheduler {
  uint32_t wg;  // consumer warpgroup, 0-based

  __device__ void init() const {
    if constexpr (kEnabled) {
      if (wg == 0) named_barrier_arrive(kBarrierPingpongBase, 256);
    }
  }
  __device__ void wait_turn() const {
    if constexpr (kEnabled) named_barrier_sync(kBarrierPingpongBase + wg, 256);
  }
  __device__ void pass_turn() const {
    if constexpr (kEnabled) named_barrier_arrive(kBarrierPingpongBase + (wg + 1) % kNumMmaWG, 256);
  }
};

// The backward kernel's own id space (bwd_kernel.h).
enum : uint32_t {
  kBwdBarrierdS = 1,        // both consumer warpgroups' dS (and P^T) are in smem / free again
  kBwdBarrierdQEmpty = 2,   // 2 ids: a warpgroup's dQ slice may be overwritten
  kBwdBarrierdQFull = 4,    // 2 ids: a warpgroup's dQ slice is ready for the writer warp
  kBwdBarrierEpilogue = 6,  // the consumers are done with the mainloop's smem / dK, dV staged
};

}  // namespace flashattn::sm90
