// FP8 E4M3 "fn" (torch.float8_e4m3fn, NVIDIA __nv_fp8_e4m3): 1 sign, 4 exponent (bias 7) and
// 3 mantissa bits; no infinities, S.1111.111 (0x7F / 0xFF) is NaN, so the largest finite value
// is 1.75 * 2^8 = 448; subnormals (exponent field 0) are m * 2^-9, m = 1..7.
//
// float_to_e4m3 rounds to nearest, ties to even, and saturates: every |x| > 448, infinities
// included, becomes +-448 (what __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) does; torch's
// .to(float8_e4m3fn) instead turns |x| > 464 into NaN). NaN stays NaN (0x7F with x's sign).
// Integer-only, like half_convert.h: host and device code (--use_fast_math, flushed denormals)
// give identical bits.
#pragma once

#include <cstdint>

#include "common/half_convert.h"
#include "common/hd.h"

namespace flashattn {

constexpr float kE4M3Max = 448.f;
constexpr uint8_t kE4M3MaxCode = 0x7E;  // S.1111.110 = 448
constexpr uint8_t kE4M3NaNCode = 0x7F;  // S.1111.111

FA_HD float e4m3_to_float(uint8_t v) {
  const uint32_t sign = uint32_t(v & 0x80u) << 24;
  const uint32_t e = (v >> 3) & 0xfu;
  const uint32_t m = v & 0x7u;
  if (e == 0xfu && m == 0x7u) return bits_float(sign | 0x7fc00000u);
  if (e == 0) {
    const float sub = float(m) * 0.001953125f;  // m * 2^-9, exact
    return sign ? -sub : sub;
  }
  // Rebias 7 -> 127 and widen the mantissa 3 -> 23 bits.
  return bits_float(sign | ((e + 120u) << 23) | (m << 20));
}

FA_HD uint8_t float_to_e4m3(float f) {
  const uint32_t x = float_bits(f);
  const uint8_t sign = uint8_t((x >> 24) & 0x80u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return uint8_t(sign | kE4M3NaNCode);
  if (ax >= 0x43e00000u) return uint8_t(sign | kE4M3MaxCode);  // >= 448 (and inf): saturate
  if (ax >= 0x3c800000u) {
    // Normal E4M3 (>= 2^-6): round away the 20 low mantissa bits to even, then rebias the exponent
    // (127 -> 7: subtract 120 << 3 from the 8-bit exponent:mantissa). A mantissa carry bumps the
    // exponent, which is the right result; nothing below 448 rounds above it.
    const uint32_t r = (ax + 0x7ffffu + ((ax >> 20) & 1u)) >> 20;
    return uint8_t(sign | (r - (120u << 3)));
  }
  if (ax <= 0x3a800000u) return sign;  // <= 2^-10, half the smallest subnormal: ties to 0
  // Subnormal E4M3: round (significand * 2^(e - 150)) / 2^-9 = significand >> (141 - e) to even.
  // m = 8 (from just below 2^-6) is the code of 2^-6 itself.
  const uint32_t e = ax >> 23;  // 117..120
  const uint32_t sig = (ax & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 141u - e;  // 21..24
  uint32_t m = sig >> shift;
  const uint32_t rem = sig & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (m & 1u))) ++m;
  return uint8_t(sign | m);
}

}  // namespace flashattn
