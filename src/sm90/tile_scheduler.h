// Which (query block, head, batch) tiles a CTA computes. Static persistent schedule: the grid
// is at most one CTA per SM and CTA c takes tiles c, c + gridDim.x, ... The producer and the
// consumers walk the same sequence independently, so no communication is needed.
// Order: the query block varies fastest, then the head, then the batch, so the CTAs running
// at the same time share one head's K/V (and GQA groups' adjacent heads share it too) in L2.
// Masked problems (causal / local) go longest-first: query blocks in reverse, and the host
// launches one CTA per tile so the hardware block scheduler balances the uneven tiles.
#pragma once

#include <cstdint>

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
  __device__ int next(int tile) const { return tile + int(gridDim.x); }
};

}  // namespace flashattn::sm90
