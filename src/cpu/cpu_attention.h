// The FlashAttention algorithm on the CPU: Q row blocks x K/V column blocks, online softmax in
// the exp2 domain, fp32 accumulation, O(N) extra memory (per-thread tiles; the backward adds
// one fp32 per query row and head for D = rowsum(dO * O)). It runs the same mask policy and
// softmax arithmetic (src/common/) as the GPU kernels, so CI exercises those on every push.
// ALiBi adds its bias in the exp2 domain after the softcap; dropout draws the keep mask of each
// tile from Philox, one call per 8-entry unit (common/dropout.h, the same numbers as every other
// path), keeps the undropped P in the running sum (LSE) and applies its scale once at the store.
// With neither, the tile loops run as before (one flag test per row).
//
// Backward, deterministic by construction: pass 1 computes D; pass 2 runs over (batch, kv head,
// key block) and accumulates dK/dV for the whole query-head group in tile registers; pass 3
// runs over (batch, head, query block) and accumulates dQ by recomputing P and dS. Every
// output element has exactly one writer and a fixed summation order, so results are bitwise
// identical run to run and for any thread count (options.num_threads, FLASHATTN_NUM_THREADS).
#pragma once

#include <cstddef>

#include "api/backend.h"
#include "common/params.h"

namespace flashattn::cpu {

constexpr int kBlockM = 128;  // query rows per tile
constexpr int kBlockN = 64;  // keys per tile

flashattn_status fwd(const FwdParams& p);
// `workspace`: bwd_workspace_bytes(p) bytes, or null to allocate.
flashattn_status bwd(const BwdParams& p, void* workspace);
size_t bwd_workspace_bytes(const BwdParams& p);

}  // namespace flashattn::cpu
