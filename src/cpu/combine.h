// Host combine of partial attention results (split-KV, cascade / prefix caching): per query row
// and head, LSE = log(sum_s exp(LSE_s)) and O = sum_s exp(LSE_s - LSE) O_s, accumulated in fp32
// (fp64 for fp64 tensors). See flashattn_combine in include/flashattn/flashattn.h for the
// semantics (all -inf rows, NaN propagation); src/api/combine.cpp validates and fills these params.
#pragma once

#include <cstdint>

#include "flashattn/flashattn.h"

namespace flashattn::cpu {

struct CombineParams {
  flashattn_dtype dtype = FLASHATTN_DTYPE_FP32;
  int num_splits = 0;
  int64_t batch = 0, seqlen_q = 0, nheads = 0, headdim = 0;
  const void* o_partial = nullptr;  // [num_splits, batch, seqlen_q, nheads, headdim]
  int64_t o_partial_stride[5] = {0, 0, 0, 0, 1};
  const float* lse_partial = nullptr;        // [num_splits, batch, nheads, seqlen_q]; exactly one of
  const double* lse_partial_fp64 = nullptr;  // these two is set
  int64_t lse_partial_stride[4] = {0, 0, 0, 0};
  void* out = nullptr;  // [batch, seqlen_q, nheads, headdim]
  int64_t out_stride[4] = {0, 0, 0, 1};
  float* lse = nullptr;        // optional, contiguous [batch, nheads, seqlen_q]
  double* lse_fp64 = nullptr;  // optional (fp64 only), same layout
};

// Runs on host_num_threads() threads (options.num_threads through ScopedHostThreads).
flashattn_status combine(const CombineParams& p);

}  // namespace flashattn::cpu
