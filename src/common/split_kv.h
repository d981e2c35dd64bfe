// Split-KV (FlashDecoding): a query tile's key blocks divided among num_splits CTAs, each writing
// an fp32 partial output and LSE, merged afterwards by the combine kernel (common/combine_params.h,
// the one flashattn_combine runs). Few query rows over a long cache (decode) then fill the GPU.
#pragma once

#include <cstdint>

#include "common/combine_params.h"
#include "common/hd.h"

namespace flashattn {

struct SplitKv {
  int num_splits = 1;
  float* o_partial = nullptr;    // [num_splits, batch, seqlen_q, nheads, headdim]
  float* lse_partial = nullptr;  // [num_splits, batch, nheads, seqlen_q]
  int batch = 0, seqlen_q = 0, nheads = 0, headdim = 0;

  // The key blocks of split s among a tile's blocks [n_begin, n_end): n_end - 1 - s, then every
  // num_splits-th block below it, down to n_begin (empty when the first is below n_begin). The splits
  // interleave block by block instead of taking consecutive ranges, so at any moment the grid reads
  // one contiguous window of the cache (all kv heads of neighbouring keys): far-apart ranges read
  // 53-76% of copy bandwidth at 29-57 splits of a 67 MB cache, interleaved ones 68-88% (H200,
  // bench/read_ceiling.py). Visiting from the last block down keeps the sequence's partial block the
  // first one a split visits.
  FA_HD int first_block(int n_end, int s) const { return n_end - 1 - s; }
  FA_HD int block_step() const { return num_splits; }
  FA_HD int64_t o_row_stride() const { return int64_t(nheads) * headdim; }
  FA_HD int64_t o_index(int s, int b, int row, int h) const {
    return ((int64_t(s) * batch + b) * seqlen_q + row) * o_row_stride() + int64_t(h) * headdim;
  }
  FA_HD int64_t lse_index(int s, int b, int h, int row) const {
    return ((int64_t(s) * batch + b) * nheads + h) * seqlen_q + row;
  }
  static int64_t o_floats(int splits, int batch, int seqlen_q, int nheads, int headdim) {
    return int64_t(splits) * batch * seqlen_q * nheads * headdim;
  }
  static int64_t lse_floats(int splits, int batch, int seqlen_q, int nheads) {
    return int64_t(splits) * batch * nheads * seqlen_q;
  }

  // The combine of these partials into out ([batch, seqlen_q, nheads, headdim] with the given
  // element strides, `dtype`) and, if non-null, lse (strides batch, head, row).
  CombineParams combine_into(void* out, flashattn_dtype dtype, const int64_t (&out_stride)[3], float* lse,
                             const int64_t (&lse_stride)[3]) const {
    CombineParams c;
    c.dtype = dtype;
    c.partial_dtype = FLASHATTN_DTYPE_FP32;
    c.num_splits = num_splits;
    c.batch = batch;
    c.seqlen_q = seqlen_q;
    c.nheads = nheads;
    c.headdim = headdim;
    c.o_partial = o_partial;
    const int64_t ps[5] = {o_index(1, 0, 0, 0), o_index(0, 1, 0, 0), o_row_stride(), headdim, 1};
    const int64_t ls[4] = {lse_index(1, 0, 0, 0), lse_index(0, 1, 0, 0), seqlen_q, 1};
    for (int i = 0; i < 5; ++i) c.o_partial_stride[i] = ps[i];
    for (int i = 0; i < 4; ++i) c.lse_partial_stride[i] = ls[i];
    c.lse_partial = lse_partial;
    c.out = out;
    for (int i = 0; i < 3; ++i) c.out_stride[i] = out_stride[i];
    c.out_stride[3] = 1;
    c.lse = lse;
    for (int i = 0; i < 3; ++i) c.lse_stride[i] = lse_stride[i];
    return c;
  }
};

// How many splits: the fewest whose waves of CTAs over `slots` (SMs x resident CTAs) are within
// 85% of the best wave efficiency, at most max_splits and the number of key blocks; 1 when the
// unsplit grid already fills most slots (the FlashDecoding rule of thumb, as in FA2).
inline int choose_num_splits(int64_t ctas, int slots, int n_blocks, int max_splits) {
  if (ctas <= 0 || n_blocks <= 1 || ctas * 10 >= int64_t(slots) * 8) return 1;
  int hi = max_splits < n_blocks ? max_splits : n_blocks;
  if (hi > 256) hi = 256;
  auto efficiency = [&](int s) {
    const double waves = double(ctas * s) / slots;
    return waves / double(int64_t(waves + 0.999999));
  };
  // A split count that gives the same blocks per split as one fewer split adds only empty CTAs.
  auto useful = [&](int s) { return s == 1 || (n_blocks + s - 1) / s != (n_blocks + s - 2) / (s - 1); };
  double best = 0.0;
  for (int s = 1; s <= hi; ++s)
    if (useful(s) && efficiency(s) > best) best = efficiency(s);
  for (int s = 1; s <= hi; ++s)
    if (useful(s) && efficiency(s) >= 0.85 * best) return s;
  return 1;
}

}  // namespace flashattn
