// Host combine of partial attention results (split-KV, cascade / prefix caching): per query row
// and head, LSE = log(sum_s exp(LSE_s)) and O = sum_s exp(LSE_s - LSE) O_s, accumulated in fp32
// (fp64 for fp64 tensors). See flashattn_combine in include/flashattn/flashattn.h for the
// semantics (all -inf rows, NaN propagation); src/api/combine.cpp validates and fills these params.
#pragma once

#include <cstdint>

#include "common/combine_params.h"
#include "flashattn/flashattn.h"

namespace flashattn::cpu {

using flashattn::CombineParams;

// Runs on host_num_threads() threads (options.num_threads through ScopedHostThreads).
flashattn_status combine(const CombineParams& p);

}  // namespace flashattn::cpu
