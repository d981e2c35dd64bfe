// FP8 (E4M3) attention inputs: the per-block scales of q, k, v (flashattn_fp8_scales, normalized)
// and the dequantizing element loader every path shares:
//   value(q[b, i, h, c]) = e4m3_to_float(code) * q_scale[b, h, i / q_block_size]
// with i counted from sequence b's first row (varlen too), likewise k and v with k_block_size.
#pragma once

#include <cstdint>

#include "common/fp8.h"
#include "common/hd.h"
#include "flashattn/flashattn.h"

namespace flashattn {

struct Fp8Scales {
  // Contiguous fp32 [batch, nheads, blocks] in the tensors' memory space (k and v: nheads_kv).
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int q_block_size = 1;
  int k_block_size = 1;  // k and v
  int q_blocks = 0;      // scale blocks per (sequence, head): ceil(seqlen_q / q_block_size)
  int k_blocks = 0;
  flashattn_dtype out_dtype = FLASHATTN_DTYPE_BF16;  // of the output (fp16 or bf16)

  FA_HD float q_scale(int b, int h, int nheads_q, int row) const {
    return q[(int64_t(b) * nheads_q + h) * q_blocks + row / q_block_size];
  }
  FA_HD float k_scale(int b, int kvh, int nheads_kv, int row) const {
    return k[(int64_t(b) * nheads_kv + kvh) * k_blocks + row / k_block_size];
  }
  FA_HD float v_scale(int b, int kvh, int nheads_kv, int row) const {
    return v[(int64_t(b) * nheads_kv + kvh) * k_blocks + row / k_block_size];
  }
};

// The dequantized value of an E4M3 code under `scale`, exactly: the code has 4 significant bits and
// the scale 24, so the product fits a double (NaN codes stay NaN).
FA_HD double fp8_dequantize_exact(uint8_t code, float scale) { return double(e4m3_to_float(code)) * double(scale); }

}  // namespace flashattn
