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
  // fp8_v_layout keys_permuted16 (flashattn.h): v is V^T (keys contiguous, v_stride.row == 1), each
  // group of 16 keys in the order fp8_v_key_position gives.
  bool v_keys_permuted16 = false;
  int64_t v_col_stride = 1;  // elements between v's head-dim columns (keys_permuted16: V^T's row length)
  // fp8_v_layout rows_auto on a fixed-length call: v is in rows, and a device path may pass it on as a
  // keys_permuted16 copy in its workspace (sm90: where that pays). The host paths read v in rows.
  bool v_rows_auto = false;

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

// fp8_v_layout keys_permuted16: where key j sits in its V^T row. Within each 16 keys, key
// k = 8 k3 + 4 k2 + 2 k1 + k0 at 8 k2 + 4 k1 + 2 k3 + k0, the order of P's keys in the sm90 FP8
// kernel's registers (operand position 4 q + i holds key {2q, 2q + 1, 2q + 8, 2q + 9}[i]).
FA_HD constexpr int fp8_v_key_position(int j) {
  const int k = j & 15;
  return (j & ~15) | ((k & 6) << 1) | ((k & 8) >> 2) | (k & 1);
}

// The key at position p of a keys_permuted16 row (the inverse of fp8_v_key_position).
FA_HD constexpr int fp8_v_key_at_position(int p) {
  const int q = p & 15;
  return (p & ~15) | ((q & 12) >> 1) | ((q & 2) << 2) | (q & 1);
}

// The dequantized value of an E4M3 code under `scale`, exactly: the code has 4 significant bits and
// the scale 24, so the product fits a double (NaN codes stay NaN).
FA_HD double fp8_dequantize_exact(uint8_t code, float scale) { return double(e4m3_to_float(code)) * double(scale); }

}  // namespace flashattn
