// Which (query block, head, batch) tiles a CTA computes, and how the producer hands them to
// the consumer warpgroups. The grid is persistent (at most one CTA per SM); CTA c starts with
// tile c. The producer thread picks each next tile when it has issued the current one's loads:
//   static  (unmasked: every tile costs the same): tile + gridDim.x.
//   dynamic (causal / local: tiles differ in length): gridDim.x + atomicAdd(counter, 1), so
//           whichever CTA is about to run dry takes the next tile, greedy like the hardware
//           block scheduler but without a CTA launch and prologue per tile, and with the
//           next tile's loads overlapping the current tile's last GEMMs and epilogue.
//   Long masked problems launch one CTA per tile instead (the static rule with a grid of
//   num_tiles), which measured slightly faster there (launch.h says why).
// Dynamic: it passes each index to the consumers through TileQueue (a 2-slot smem ring on
// mbarriers); an index >= num_tiles tells everyone to stop. Static: the consumers walk the
// same sequence themselves.
// Order: the query block varies fastest, then the head, then the batch, so the CTAs running
// at the same time share one head's K/V (and GQA groups' adjacent heads share it too) in L2.
// Masked problems go longest-first: query blocks in reverse.
#pragma once

#include <cstdint>

#include <cutlass/arch/barrier.h>

namespace flashattn::sm90 {

struct TileCoord {
  int m_block;
  int head;   // query head
  int batch;
};

struct TileScheduler {
  int num_m_blocks;
  int num_heads;
  int num_tiles;
  int reverse_m;  // longest-first for causal/local
  int* counter;   // dynamic schedule: tiles taken past the first wave, zeroed before the launch; null = static

  __device__ TileCoord coord(int tile) const {
    TileCoord c;
    c.m_block = tile % num_m_blocks;
    int rest = tile / num_m_blocks;
    c.head = rest % num_heads;
    c.batch = rest / num_heads;
    if (reverse_m) c.m_block = num_m_blocks - 1 - c.m_block;
    return c;
  }
  __device__ int first() const { return int(blockIdx.x); }
  // The k-th tile of this CTA under the static rule (the consumers' side of it).
  __device__ int static_tile(int k) const { return int(blockIdx.x) + k * int(gridDim.x); }
  // Producer thread only; kDynamic == (counter != nullptr).
  template <bool kDynamic>
  __device__ int next(int tile) const {
    if constexpr (kDynamic) return int(gridDim.x) + atomicAdd(counter, 1);
    return tile + int(gridDim.x);
  }
};

// Producer -> consumers hand-off of tile indices: a 2-slot smem ring with a full/empty
// mbarrier pair per slot. The k-th push and the k-th pop use slot k % 2 and wait for the
// barrier completion of parity (k / 2) % 2 (the empty one a lap behind). Stateless apart from
// k (the producer's spills come from the atomic in next<true>, not from here).
struct TileQueue {
  static constexpr int kSlots = 2;
  using Bar = cutlass::arch::ClusterBarrier;
  struct SharedStorage {
    uint64_t full[kSlots];
    uint64_t empty[kSlots];
    int tile[kSlots];
  };

  // Every thread calls it; a __syncthreads must follow before the first push/pop.
  static __device__ void init(SharedStorage& s, int consumers) {
    if (threadIdx.x == 0) {
      for (int i = 0; i < kSlots; ++i) {
        Bar::init(&s.full[i], 1);
        Bar::init(&s.empty[i], uint32_t(consumers));
      }
    }
    cutlass::arch::fence_barrier_init();
  }
  // The one producer thread.
  static __device__ void push(SharedStorage& s, int k, int tile) {
    const int slot = k % kSlots;
    if (k >= kSlots) Bar::wait(&s.empty[slot], uint32_t((k / kSlots - 1) & 1));
    s.tile[slot] = tile;
    Bar::arrive(&s.full[slot]);  // release: the write above is visible to whoever waits
  }
  // Every consumer thread, for every index.
  static __device__ int pop(SharedStorage& s, int k) {
    const int slot = k % kSlots;
    Bar::wait(&s.full[slot], uint32_t((k / kSlots) & 1));
    const int tile = s.tile[slot];
    Bar::arrive(&s.empty[slot]);
    return tile;
  }
};

}  // namespace flashattn::sm90
