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
// Both sides walk the sequence through one interface (FA3's): get_initial_work() (tile
// blockIdx.x, known to all), then get_next_work() once per tile, is_valid(), coord(); neither
// sees which rule runs. Dynamic: the producer hands each next index to the consumers through
// TileQueue (a 2-slot smem ring on mbarriers); an index >= num_tiles tells everyone to stop.
// Static: the consumers compute the same sequence themselves.
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
// mbarrier pair per slot. The k-th push and the k-th pop (k counts from 0: the CTA's second
// tile) use slot k % 2 and wait for the barrier completion of parity (k / 2) % 2 (the empty
// one a lap behind). Stateless apart from k (the producer's spills come from the dynamic
// rule's atomic, not from here).
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
  };
  using SharedStorage = TileQueue::SharedStorage;

  // A CTA's k-th tile; tile >= num_tiles: no more work.
  struct WorkTile {
    int tile;
    int k;
  };

  // How a call site picks the rule: kRuntime reads Params (one copy of the caller's loop: the
  // consumers), kStatic / kDynamic fix it at compile time: the producer thread compiles its loop
  // once per rule (dispatch_rule), because the dynamic rule's atomic costs the 24-register
  // producer ~230 bytes of spills, which the static rule should not pay.
  enum class Rule { kRuntime, kStatic, kDynamic };

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

  // ---- device ----------------------------------------------------------------------------
  // Every thread; a __syncthreads must follow before the first get_*_work.
  static __device__ void init(SharedStorage& s, int num_consumer_threads) { TileQueue::init(s, num_consumer_threads); }

  __device__ TileScheduler(const Params& p, SharedStorage& s) : p_(p), s_(s), dynamic_(p.counter != nullptr) {}

  // The producer thread only: runs f(rule) with the rule as a compile-time constant, so the
  // caller's loop is compiled once per rule.
  template <class F>
  __device__ void dispatch_rule(F&& f) const {
    if (dynamic_) {
      f(cute::integral_constant<Rule, Rule::kDynamic>{});
    } else {
      f(cute::integral_constant<Rule, Rule::kStatic>{});
    }
  }

  // Every CTA starts with tile blockIdx.x: known to all, nothing to hand over.
  template <bool kIsProducer, Rule kRule = Rule::kRuntime>
  __device__ WorkTile get_initial_work() const {
    return {int(blockIdx.x), 0};
  }
  // kIsProducer: the one producer thread picks the next tile (dynamic rule: and hands it to the
  // consumers); otherwise a consumer thread follows. Both sides call it once per tile, in order;
  // under the dynamic rule the producer's last call hands over the stop (a tile past the end).
  template <bool kIsProducer, Rule kRule = Rule::kRuntime>
  __device__ WorkTile get_next_work(const WorkTile& cur) const {
    const int k = cur.k + 1;
    if (!is_dynamic<kRule>()) return {kIsProducer ? cur.tile + int(gridDim.x) : int(blockIdx.x) + k * int(gridDim.x), k};
    if constexpr (kIsProducer) {
      const int tile = int(gridDim.x) + atomicAdd(p_.counter, 1);
      TileQueue::push(s_, k - 1, tile);
      return {tile, k};
    } else {
      return {TileQueue::pop(s_, k - 1), k};
    }
  }

  __device__ bool is_valid(const WorkTile& w) const { return w.tile < p_.num_tiles; }

  __device__ TileCoord coord(const WorkTile& w) const {
    TileCoord c;
    c.m_block = w.tile % p_.num_m_blocks;
    int rest = w.tile / p_.num_m_blocks;
    c.head = rest % p_.num_heads;
    c.batch = rest / p_.num_heads;
    if (p_.reverse_m) c.m_block = p_.num_m_blocks - 1 - c.m_block;
    return c;
  }

 private:
  template <Rule kRule>
  __device__ bool is_dynamic() const {
    if constexpr (kRule == Rule::kRuntime) return dynamic_;
    return kRule == Rule::kDynamic;
  }
  const Params& p_;
  SharedStorage& s_;
  bool dynamic_;
};

}  // namespace flashattn::sm90
