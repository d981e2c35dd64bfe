// The Hopper backward's workspace: per (query head, query tile of kBlockM rows) the row
// statistics the main kernel streams in with each Q/dO tile, and the fp32 dQ accumulator.
//   lse_log2[h][tile][kBlockM]   LSE * log2(e); +inf for rows past the sequence or with no keys
//                                 (so P = exp2(s - lse) = 0 there, never NaN)
//   dpsum[h][tile][kBlockM]      D = rowsum(dO * O); 0 past the sequence
//   dq_accum[h][tile][kBlockM*d] fp32, in the dQ GEMM accumulator's register order (bwd_shapes.h)
//   dq_semaphore[h][tile]        deterministic mode: key blocks that have added their dQ part
// Tiles are placed with dq_tile_index (common/params.h), so varlen sequences never share one.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/params.h"

namespace flashattn::sm90 {

struct BwdWorkspace {
  float* lse_log2;
  float* dpsum;
  float* dq_accum;
  int* dq_semaphore;  // null unless deterministic
  int tiles_per_head;

  // First row of sequence b in the packed rows the tiles are placed by.
  FA_HD static int64_t packed_row0(const SeqBounds& sb, const Shape& s, int b, bool varlen) {
    return varlen ? sb.q_offset : int64_t(b) * s.seqlen_q;
  }
  FA_HD int64_t tile(int head, int64_t qrow0, int b, int m_block, int block_m) const {
    return int64_t(head) * tiles_per_head + dq_tile_index(qrow0, b, m_block, block_m);
  }
};

inline size_t bwd_align256(size_t x) { return (x + 255) & ~size_t(255); }

// Sizes (bytes) of the workspace for one call; `base` null gives just the total.
// kernel_headdim: the kernel's (the accumulator's row width), >= the tensors' head dim.
inline size_t bwd_workspace_layout(const BwdParams& p, int block_m, int kernel_headdim, void* base, BwdWorkspace* ws) {
  const Shape& s = p.shape;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t total_q = varlen ? s.total_q : int64_t(s.batch) * s.seqlen_q;
  const int64_t tiles = (dq_accum_rows(total_q, s.batch, block_m) + block_m - 1) / block_m;
  const int64_t all_tiles = tiles * s.nheads_q;
  const size_t stat_bytes = bwd_align256(size_t(all_tiles) * block_m * sizeof(float));
  const size_t dq_bytes = bwd_align256(size_t(all_tiles) * block_m * kernel_headdim * sizeof(float));
  const size_t sem_bytes = p.deterministic ? bwd_align256(size_t(all_tiles) * sizeof(int)) : 0;
  if (ws != nullptr) {
    char* b = static_cast<char*>(base);
    ws->lse_log2 = reinterpret_cast<float*>(b);
    ws->dpsum = reinterpret_cast<float*>(b + stat_bytes);
    ws->dq_accum = reinterpret_cast<float*>(b + 2 * stat_bytes);
    ws->dq_semaphore = p.deterministic ? reinterpret_cast<int*>(b + 2 * stat_bytes + dq_bytes) : nullptr;
    ws->tiles_per_head = int(tiles);
  }
  return 2 * stat_bytes + dq_bytes + sem_bytes;
}

}  // namespace flashattn::sm90
