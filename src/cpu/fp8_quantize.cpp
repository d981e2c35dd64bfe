// Host FP8 block quantization; see fp8_quantize.h. One work item is one (batch, head, block): two
// passes over its rows (the block's amax, then the codes), recomputing the transform instead of
// keeping the block, so scratch stays one row however large block_size is.
#include "cpu/fp8_quantize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/fp8.h"
#include "common/fp8_scales.h"
#include "common/hadamard.h"
#include "common/half_convert.h"
#include "common/parallel.h"

namespace flashattn::cpu {

float fp8_scale_from_amax(float amax) {
  if (!(amax > 0.f)) return 1.f;
  return std::max(amax / kE4M3Max, FLT_MIN);
}

namespace {

struct Transform {
  bool on = false;
  int n = 0;
  std::vector<int8_t> signs;  // one per head-dim column, shared by every row
  double inv_sqrt_n = 1.0;
};

Transform make_transform(const Fp8QuantizeParams& p) {
  Transform t;
  t.on = p.hadamard;
  if (!t.on) return t;
  t.n = int(p.headdim);
  t.signs.resize(size_t(t.n));
  for (int c = 0; c < t.n; ++c) t.signs[size_t(c)] = int8_t(hadamard_sign(p.hadamard_seed, c));
  t.inv_sqrt_n = 1.0 / std::sqrt(double(t.n));
  return t;
}

// Row (b, s, h) of x, transformed in fp64 and rounded to fp32: the values that get quantized.
void transformed_row(const Fp8QuantizeParams& p, const Transform& t, int64_t b, int64_t s, int64_t h,
                     std::vector<double>& row, std::vector<float>& out) {
  const int64_t base = b * p.x_stride[0] + s * p.x_stride[1] + h * p.x_stride[2];
  for (int64_t c = 0; c < p.headdim; ++c) row[size_t(c)] = load_double(p.x, p.dtype, base + c);
  if (t.on) hadamard_forward(row.data(), t.signs.data(), t.n, t.inv_sqrt_n);
  for (int64_t c = 0; c < p.headdim; ++c) out[size_t(c)] = float(row[size_t(c)]);
}

struct Scratch {
  std::vector<double> row;
  std::vector<float> xf;
};

template <typename Body>
flashattn_status run_blocks(const Fp8QuantizeParams& p, const char* what, Body&& body) {
  const int64_t nblocks = fp8_num_blocks(p.seqlen, p.block_size);
  const int64_t items = p.batch * p.nheads * nblocks;
  if (items == 0) return FLASHATTN_SUCCESS;
  auto scratch = [&] { return Scratch{std::vector<double>(size_t(p.headdim)), std::vector<float>(size_t(p.headdim))}; };
  auto item_body = [&](int64_t item, Scratch& sc) {
    const int64_t blk = item % nblocks, bh = item / nblocks;
    body(bh / p.nheads, bh % p.nheads, blk, sc);
  };
  // Small problems: no threads (starting them would cost more than the work).
  const int64_t work = p.batch * p.seqlen * p.nheads * std::max<int64_t>(p.headdim, 1);
  std::string err;
  if (work < (int64_t(1) << 16)) {
    ScopedHostThreads one(1);
    err = parallel_for(items, scratch, item_body);
  } else {
    err = parallel_for(items, scratch, item_body);
  }
  if (!err.empty()) return set_error(FLASHATTN_ERROR_INTERNAL, "%s: %s", what, err.c_str());
  return FLASHATTN_SUCCESS;
}

}  // namespace

flashattn_status fp8_quantize(const Fp8QuantizeParams& p) {
  const Transform t = make_transform(p);
  const int64_t nblocks = fp8_num_blocks(p.seqlen, p.block_size);
  return run_blocks(p, "fp8_quantize", [&](int64_t b, int64_t h, int64_t blk, Scratch& sc) {
    const int64_t s0 = blk * p.block_size, s1 = std::min(p.seqlen, s0 + p.block_size);
    float amax = 0.f;
    for (int64_t s = s0; s < s1; ++s) {
      transformed_row(p, t, b, s, h, sc.row, sc.xf);
      for (int64_t c = 0; c < p.headdim; ++c) {
        const float a = std::fabs(sc.xf[size_t(c)]);
        if (std::isfinite(a) && a > amax) amax = a;  // NaN/inf left out: they must not spoil the block
      }
    }
    const float scale = fp8_scale_from_amax(amax);
    p.scales[(b * p.nheads + h) * nblocks + blk] = scale;
    const int64_t cs = p.x_fp8_stride[3];
    for (int64_t s = s0; s < s1; ++s) {
      transformed_row(p, t, b, s, h, sc.row, sc.xf);
      uint8_t* dst = p.x_fp8 + fp8_code_offset(p, b, s, h, 0);
      for (int64_t c = 0; c < p.headdim; ++c) dst[c * cs] = float_to_e4m3(sc.xf[size_t(c)] / scale);
    }
    // keys_permuted16: the last block's item writes 0 where no key sits (the positions of keys >= seqlen, up
    // to L), never a position another item writes.
    if (p.keys_permuted16 && blk == nblocks - 1) {
      uint8_t* row0 = p.x_fp8 + b * p.x_fp8_stride[0] + h * p.x_fp8_stride[2];
      for (int64_t pos = p.seqlen / 16 * 16; pos < cs; ++pos) {
        if ((pos & ~int64_t(15)) + fp8_v_key_at_position(int(pos & 15)) < p.seqlen) continue;
        for (int64_t c = 0; c < p.headdim; ++c) row0[c * cs + pos] = 0;
      }
    }
  });
}

flashattn_status fp8_dequantize(const Fp8QuantizeParams& p) {
  const Transform t = make_transform(p);
  const int64_t nblocks = fp8_num_blocks(p.seqlen, p.block_size);
  return run_blocks(p, "fp8_dequantize", [&](int64_t b, int64_t h, int64_t blk, Scratch& sc) {
    const int64_t s0 = blk * p.block_size, s1 = std::min(p.seqlen, s0 + p.block_size);
    const double scale = p.scales[(b * p.nheads + h) * nblocks + blk];
    const int64_t cs = p.x_fp8_stride[3];
    for (int64_t s = s0; s < s1; ++s) {
      const uint8_t* src = p.x_fp8 + fp8_code_offset(p, b, s, h, 0);
      // code * scale is exact in fp64 (4 significant bits times 24).
      for (int64_t c = 0; c < p.headdim; ++c) sc.row[size_t(c)] = double(e4m3_to_float(src[c * cs])) * scale;
      if (t.on) hadamard_inverse(sc.row.data(), t.signs.data(), t.n, t.inv_sqrt_n);
      const int64_t base = b * p.x_stride[0] + s * p.x_stride[1] + h * p.x_stride[2];
      for (int64_t c = 0; c < p.headdim; ++c) store_double(p.x, p.dtype, base + c, sc.row[size_t(c)]);
    }
  });
}

flashattn_status fp8_v_keys_permuted16(const Fp8VPermuteParams& p) {
  const int64_t rows = p.batch * p.nheads;
  if (rows == 0 || p.headdim == 0) return FLASHATTN_SUCCESS;
  auto body = [&](int64_t bh, int) {
    const int64_t b = bh / p.nheads, h = bh % p.nheads;
    const uint8_t* src = p.v + b * p.v_stride[0] + h * p.v_stride[2];
    uint8_t* dst = p.out + b * p.out_stride[0] + h * p.out_stride[1];
    const int64_t full = p.seqlen / 16 * 16;  // keyless positions lie in the last, partial group and past it
    for (int64_t c = 0; c < p.headdim; ++c) std::memset(dst + c * p.row_len + full, 0, size_t(p.row_len - full));
    for (int64_t s = 0; s < p.seqlen; ++s) {
      const int64_t pos = fp8_v_key_position(int(s & 15)) + (s & ~int64_t(15));
      for (int64_t c = 0; c < p.headdim; ++c) dst[c * p.row_len + pos] = src[s * p.v_stride[1] + c];
    }
  };
  std::string err;
  if (rows * p.seqlen * p.headdim < (int64_t(1) << 16)) {
    ScopedHostThreads one(1);
    err = parallel_for(rows, [] { return 0; }, body);
  } else {
    err = parallel_for(rows, [] { return 0; }, body);
  }
  if (!err.empty()) return set_error(FLASHATTN_ERROR_INTERNAL, "fp8_v_keys_permuted16: %s", err.c_str());
  return FLASHATTN_SUCCESS;
}

}  // namespace flashattn::cpu
