// Merging partial attention results over key ranges (split-KV, cascade / prefix caching): per
// query row and head, LSE = log(sum_s exp(LSE_s)) and O = sum_s exp(LSE_s - LSE) O_s. See
// flashattn_combine in include/flashattn/flashattn.h for the semantics (all -inf rows, NaN
// propagation). One description for both implementations: the host one (src/cpu/combine.cpp)
// and the CUDA kernel (src/api/combine_cuda.cu) that flashattn_combine and the GPU paths'
// split-KV share. src/api/combine.cpp validates the C ABI's params and fills these.
#pragma once

#include <cstdint>

#include "common/hd.h"
#include "flashattn/flashattn.h"

namespace flashattn {

struct CombineParams {
  flashattn_dtype dtype = FLASHATTN_DTYPE_FP32;          // of out
  flashattn_dtype partial_dtype = FLASHATTN_DTYPE_FP32;  // of o_partial (split-KV keeps fp32 partials)
  int num_splits = 0;
  int64_t batch = 0, seqlen_q = 0, nheads = 0, headdim = 0;
  const void* o_partial = nullptr;  // [num_splits, batch, seqlen_q, nheads, headdim]
  int64_t o_partial_stride[5] = {0, 0, 0, 0, 1};
  const float* lse_partial = nullptr;        // [num_splits, batch, nheads, seqlen_q]; exactly one of
  const double* lse_partial_fp64 = nullptr;  // these two is set (fp64: host only)
  int64_t lse_partial_stride[4] = {0, 0, 0, 0};
  void* out = nullptr;  // [batch, seqlen_q, nheads, headdim]
  int64_t out_stride[4] = {0, 0, 0, 1};
  float* lse = nullptr;        // optional: the combined LSE at lse[lse_offset(b, h, i)]
  double* lse_fp64 = nullptr;  // optional (fp64 only), same layout
  // The combined LSE's strides (batch, head, row): contiguous [batch, nheads, seqlen_q] for
  // flashattn_combine; split-KV writes the forward's own LSE layout.
  int64_t lse_stride[3] = {0, 0, 1};

  FA_HD int64_t lse_index(int64_t b, int64_t h, int64_t i) const {
    return b * lse_stride[0] + h * lse_stride[1] + i * lse_stride[2];
  }
};

}  // namespace flashattn
