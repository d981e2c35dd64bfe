// Division by a divisor fixed for a whole launch, for dividends below 2^31: q = umulhi(n, mul) >> shift, with mul
// and shift picked on the host (Granlund-Montgomery, as CUTLASS's FastDivmod). A kernel's per-item index math
// (item -> block, head, batch) then costs a few instructions instead of a 64-bit division's subroutine (~100).
#pragma once

#include <cstdint>

#include "common/hd.h"

namespace flashattn {

struct FastDiv {
  uint32_t divisor = 1, mul = 0, shift = 0;  // divisor 1: mul unused

  // d >= 1. p = 31 + ceil(log2 d), mul = ceil(2^p / d) < 2^32; then floor(n mul / 2^p) = n / d for n < 2^31.
  static FastDiv make(uint32_t d) {
    FastDiv f;
    f.divisor = d;
    if (d > 1) {
      uint32_t l = 0;
      while ((uint64_t(1) << l) < d) ++l;
      const uint32_t p = 31 + l;
      f.mul = uint32_t(((uint64_t(1) << p) + d - 1) / d);
      f.shift = p - 32;
    }
    return f;
  }
  FA_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    return divisor == 1 ? n : __umulhi(n, mul) >> shift;
#else
    return divisor == 1 ? n : uint32_t((uint64_t(n) * mul) >> 32) >> shift;
#endif
  }
  // n / divisor and n % divisor.
  FA_HD void divmod(uint32_t n, uint32_t* q, uint32_t* r) const {
    *q = div(n);
    *r = n - *q * divisor;
  }
};

}  // namespace flashattn
