// Tests that pick warps or threads (a warpgroup's index, its store leader) must look warp-uniform to
// ptxas: a per-thread test such as mma_tidx % 128 == 0 inside a consumer's tile loop made ptxas compile
// the whole loop as divergent, with the pipeline state and WGMMA descriptors in vector registers and a
// reconvergence point at every barrier wait (perf-notes s28: 3-7% on the forward and backward).
#pragma once

#include <cute/arch/cluster_sm90.hpp>

namespace flashattn::sm90 {

// v as lane 0 of the warp has it: equal on every lane of a warp whose lanes agree (a warp or warpgroup index).
__device__ __forceinline__ int warp_uniform(int v) { return __shfl_sync(0xffffffffu, v, 0); }

// One lane of the warps where warp_selected holds, the same lane every time (elect.sync is deterministic
// for a full mask), so the thread that waits on a TMA store's bulk group is the one that committed it.
__device__ __forceinline__ bool elected_lane(bool warp_selected) { return warp_selected && cute::elect_one_sync(); }

}  // namespace flashattn::sm90
