// Which (query block, head, batch) tiles a CTA computes, in which order, shared by the producer
// and the consumer warpgroups. The grid is persistent (at most one CTA per SM); CTA c starts with
// tile c. The producer thread picks each next tile when it has issued the current one's loads:
//   static  (unmasked: every tile costs the same): tile + gridDim.x.
//   dynamic (causal / local: tiles differ in length): gridDim.x + atomicAdd(counter, 1), so
//           whichever CTA is about to run dry takes the next tile, greedy like the hardware
//           block scheduler but without a CTA launch and prologue per tile, and with the
//           next tile's loads overlapping the current tile's last GEMMs and epilogue.
//   Long masked problems launch one CTA per tile instead (the static rule with a grid of
//   num_tiles), which measured slightly faster there (kDynamicMaxSeqlenK says why).
// Dynamic: the producer passes each index to the consumers through TileQueue (a 2-slot smem
// ring on mbarriers); an index >= num_tiles tells everyone to stop. Static: the consumers walk
// the same sequence themselves.
// The scheduler owns its host side too: Params (to_params), grid_shape, workspace_bytes.
// Order: the query block varies fastest, then the head, then the batch, so the CTAs running
// at the same time share one head's K/V (and GQA groups' adjacent heads share it too) in L2.
// Masked problems go longest-first: query blocks in reverse.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <cutlass/arch/barrier.h>

#include "common/error.h"
#include "common/params.h"

namespace flashattn::sm90 {

struct TileCoord {
  int m_block;
  int head;   // query head
  int batch;
};

// Producer -> consumers hand-off of tile indices: a 2-slot smem ring with a full/empty
// mbarrier pair per slot. The k-th push and the k-th pop use slot k % 2 and wait for the
// barrier completion of parity (k / 2) % 2 (the empty one a lap behind). Stateless apart from
// k (the producer's spills come from the dynamic rule's atomic, not from here).
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

// Masked problems (causal / local) have tiles of unequal length.
inline bool masked_problem(const FwdParams& f) { return f.mask.window_left >= 0 || f.mask.window_right >= 0; }

class TileScheduler {
 public:
  // Up to kDynamicMaxSeqlenK keys a masked tile is short enough that a per-tile CTA launch and
  // cold start cost 2-20% (measured, docs/perf-notes.md): a persistent grid with the dynamic
  // rule wins. Beyond it, one CTA per tile on the hardware block scheduler measured ~1% faster
  // (the dynamic producer loop spills). The dynamic rule needs one counter of workspace.
  static constexpr int kDynamicMaxSeqlenK = 4096;

  struct Params {
    int num_m_blocks;
    int num_heads;
    int num_tiles;
    int reverse_m;  // longest-first for causal/local
    int* counter;   // dynamic rule: tiles taken past the first wave, zeroed before the launch; null = static
    int one_cta_per_tile;  // host only (grid_shape): long masked problems

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
  using SharedStorage = TileQueue::SharedStorage;

  // ---- host ------------------------------------------------------------------------------
  static bool dynamic_rule(const FwdParams& f) { return masked_problem(f) && f.shape.seqlen_k <= kDynamicMaxSeqlenK; }
  static size_t workspace_bytes(const FwdParams& f) { return dynamic_rule(f) ? 16 : 0; }

  // Tiles of block_m query rows; num_tiles == 0: nothing to launch.
  static flashattn_status to_params(const FwdParams& f, int block_m, void* workspace, Params* out) {
    const flashattn::Shape& s = f.shape;
    const int num_m = (s.seqlen_q + block_m - 1) / block_m;  // varlen: max_seqlen_q
    const int64_t tiles = int64_t(num_m) * s.nheads_q * s.batch;
    const bool masked = masked_problem(f), dynamic = dynamic_rule(f);
    *out = Params{num_m, s.nheads_q, 0, masked ? 1 : 0, nullptr, masked && !dynamic ? 1 : 0};
    if (tiles == 0) return FLASHATTN_SUCCESS;
    if (tiles > INT32_MAX)
      return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "shape: %lld tiles exceed the sm90 grid", (long long)tiles);
    if (dynamic && workspace == nullptr)
      return set_error(FLASHATTN_ERROR_WORKSPACE, "workspace: the sm90 causal/local forward needs %zu bytes",
                       workspace_bytes(f));
    out->num_tiles = int(tiles);
    out->counter = dynamic ? static_cast<int*>(workspace) : nullptr;
    return FLASHATTN_SUCCESS;
  }

  // Persistent (one CTA per SM), except long masked problems: one CTA per tile.
  static dim3 grid_shape(const Params& p, int num_sms) {
    return dim3(p.one_cta_per_tile ? unsigned(p.num_tiles) : unsigned(std::min(p.num_tiles, num_sms)));
  }

  // Before every launch: the dynamic rule's counter starts at zero.
  static cudaError_t initialize_workspace(const Params& p, cudaStream_t stream) {
    return p.counter != nullptr ? cudaMemsetAsync(p.counter, 0, sizeof(int), stream) : cudaSuccess;
  }
};

}  // namespace flashattn::sm90
