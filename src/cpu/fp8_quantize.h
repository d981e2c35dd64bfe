// Host FP8 (E4M3) block quantization with the optional Hadamard transform, and its inverse; see
// flashattn_fp8_quantize in include/flashattn/flashattn.h for the semantics. src/api/fp8_quantize.cpp
// validates and fills these params.
#pragma once

#include <cstdint>

#include "common/fp8_scales.h"
#include "common/hd.h"
#include "flashattn/flashattn.h"

namespace flashattn::cpu {

struct Fp8QuantizeParams {
  flashattn_dtype dtype = FLASHATTN_DTYPE_FP32;  // of x
  int64_t batch = 0, seqlen = 0, nheads = 0, headdim = 0;
  void* x = nullptr;  // [batch, seqlen, nheads, headdim]
  int64_t x_stride[4] = {0, 0, 0, 1};
  uint8_t* x_fp8 = nullptr;  // same shape, E4M3 codes
  int64_t x_fp8_stride[4] = {0, 0, 0, 1};
  // x_fp8 in the keys_permuted16 layout (flashattn.h): x_fp8_stride[1] = 1, x_fp8_stride[3] = L, key s of a
  // column's row at position fp8_v_key_position(s); positions that hold no key are written 0.
  bool keys_permuted16 = false;
  float* scales = nullptr;  // contiguous [batch, nheads, num_blocks]
  int64_t block_size = 1;
  bool hadamard = false;  // needs hadamard_dim_supported(headdim)
  uint64_t hadamard_seed = 0;
};

// Where the code of (b, s, h, c) lives in x_fp8, in either layout.
FA_HD int64_t fp8_code_offset(const Fp8QuantizeParams& p, int64_t b, int64_t s, int64_t h, int64_t c) {
  const int64_t pos = p.keys_permuted16 ? (s & ~int64_t(15)) | fp8_v_key_position(int(s & 15)) : s;
  return b * p.x_fp8_stride[0] + pos * p.x_fp8_stride[1] + h * p.x_fp8_stride[2] + c * p.x_fp8_stride[3];
}

inline int64_t fp8_num_blocks(int64_t seqlen, int64_t block_size) { return (seqlen + block_size - 1) / block_size; }

// The scale of a block from the amax of its finite transformed values: amax / 448 in fp32, at
// least FLT_MIN (so x' / scale stays finite), and 1 when amax is 0 (never 0 or NaN).
float fp8_scale_from_amax(float amax);

// flashattn_fp8_v_keys_permuted16: v's codes (rows) into the keys_permuted16 layout (flashattn.h).
struct Fp8VPermuteParams {
  int64_t batch = 0, seqlen = 0, nheads = 0, headdim = 0;
  const uint8_t* v = nullptr;  // [batch, seqlen, nheads, headdim], head dim contiguous
  int64_t v_stride[3] = {0, 0, 0};  // batch, seqlen, head
  uint8_t* out = nullptr;  // row (b, h, column c) at b * out_stride[0] + h * out_stride[1] + c * row_len
  int64_t out_stride[2] = {0, 0};  // batch, head
  int64_t row_len = 0;  // L: a multiple of 16, >= seqlen rounded up to 16
};

// Run on host_num_threads() threads (options.num_threads through ScopedHostThreads); results do
// not depend on the thread count.
flashattn_status fp8_quantize(const Fp8QuantizeParams& p);
flashattn_status fp8_dequantize(const Fp8QuantizeParams& p);
flashattn_status fp8_v_keys_permuted16(const Fp8VPermuteParams& p);

}  // namespace flashattn::cpu
