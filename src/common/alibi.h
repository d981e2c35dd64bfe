// ALiBi (Press et al.): a per-head linear bias on the scores, flash_attn's formula,
//   S_ij += -slope[b, h] * |i + seqlen_k - seqlen_q - j|   (bottom-right aligned),
// added after the softcap and before masking, on every path. Kept exact under causal too (no
// row-constant term dropped), so the LSE matches the oracle's.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/hd.h"

namespace flashattn {

struct Alibi {
  const float* slopes = nullptr;  // fp32, in the tensors' memory space; null = off
  int64_t batch_stride = 0;       // 0: [nheads_q]; else [batch, nheads_q] with this stride

  FA_HD bool enabled() const { return slopes != nullptr; }
  FA_HD float slope(int b, int h) const { return slopes[b * batch_stride + h]; }
  // The bias of entry (i, j) in natural-log units, for diag = seqlen_k - seqlen_q.
  FA_HD static float bias(float slope, int i, int j, int diag) { return -slope * fabsf(float(i + diag - j)); }
};

}  // namespace flashattn
