// fp16 / bf16 <-> float conversion on raw bits, round-to-nearest-even, with inf/NaN and fp16
// subnormals handled. Integer-only (no reliance on the FPU rounding mode or denormal flags),
// so host code and device code built with --use_fast_math give identical results.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/hd.h"
#include "flashattn/flashattn.h"

namespace flashattn {

FA_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

FA_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

FA_HD float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0x1fu) return bits_float(sign | 0x7f800000u | (m << 13));  // inf / NaN
  if (e == 0) {
    // Zero or subnormal: m * 2^-24 is exact in float.
    float v = float(m) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

FA_HD uint16_t float_to_half(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN (quiet)
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (ax >= 0x38800000u) {                                 // normal half (>= 2^-14)
    // Rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to even; a carry
    // into the exponent is the correct result.
    const uint32_t r = ax + 0x0fffu + ((ax >> 13) & 1u);
    return uint16_t(sign | ((r - 0x38000000u) >> 13));
  }
  if (ax < 0x33000000u) return uint16_t(sign);  // < 2^-25 (2^-25 itself ties to 0)
  // Subnormal half: round (significand * 2^(e-150)) / 2^-24 = m >> (126 - e) to even.
  const uint32_t e = ax >> 23;
  const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14..24
  uint32_t r = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (r & 1u))) ++r;
  return uint16_t(sign | r);
}

FA_HD float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

FA_HD uint16_t float_to_bf16(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // NaN stays NaN
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);  // overflow rounds to inf, as it should
}

// Element `i` of a buffer of `dtype` as float / double (FP64 is narrowed only by to_float).
FA_HD float load_float(const void* base, flashattn_dtype dtype, int64_t i) {
  switch (dtype) {
    case FLASHATTN_DTYPE_FP16: return half_to_float(static_cast<const uint16_t*>(base)[i]);
    case FLASHATTN_DTYPE_BF16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case FLASHATTN_DTYPE_FP32: return static_cast<const float*>(base)[i];
    case FLASHATTN_DTYPE_FP64: return float(static_cast<const double*>(base)[i]);
    default: return 0.f;
  }
}

FA_HD double load_double(const void* base, flashattn_dtype dtype, int64_t i) {
  if (dtype == FLASHATTN_DTYPE_FP64) return static_cast<const double*>(base)[i];
  return double(load_float(base, dtype, i));
}

// Stores `v` rounded to `dtype`. Doubles go through float first for fp16/bf16 (a double
// rounding that can differ from a direct rounding only on exact float ties; irrelevant here).
FA_HD void store_float(void* base, flashattn_dtype dtype, int64_t i, float v) {
  switch (dtype) {
    case FLASHATTN_DTYPE_FP16: static_cast<uint16_t*>(base)[i] = float_to_half(v); break;
    case FLASHATTN_DTYPE_BF16: static_cast<uint16_t*>(base)[i] = float_to_bf16(v); break;
    case FLASHATTN_DTYPE_FP32: static_cast<float*>(base)[i] = v; break;
    case FLASHATTN_DTYPE_FP64: static_cast<double*>(base)[i] = double(v); break;
    default: break;
  }
}

FA_HD void store_double(void* base, flashattn_dtype dtype, int64_t i, double v) {
  if (dtype == FLASHATTN_DTYPE_FP64) {
    static_cast<double*>(base)[i] = v;
    return;
  }
  store_float(base, dtype, i, float(v));
}

// `v` rounded to the precision of `dtype` (FP64: unchanged).
FA_HD double round_to_dtype(flashattn_dtype dtype, double v) {
  switch (dtype) {
    case FLASHATTN_DTYPE_FP16: return double(half_to_float(float_to_half(float(v))));
    case FLASHATTN_DTYPE_BF16: return double(bf16_to_float(float_to_bf16(float(v))));
    case FLASHATTN_DTYPE_FP32: return double(float(v));
    default: return v;
  }
}

}  // namespace flashattn
