// Dropout on P as one policy shared by every path (reference, cpu, sm80, sm90; forward and
// backward), so the same seed gives the same keep-mask everywhere:
//   keep(b, h, i, j)  iff  r16(b, h, i, j) >= threshold,  kept entries scaled by `scale`.
// The 16-bit numbers come from Philox4x32-10 in units of 8 elements,
//   {i0, i0 + 8} x {j0, j0 + 1, j0 + 8, j0 + 9}   (i0 % 16 < 8, j0 even, j0 % 16 < 8),
// exactly the 8 entries of a 16 x 16 block of S that one thread holds in the accumulator of
// an sm80 mma.sync or an sm90 WGMMA, so the forward kernels draw one Philox per 8 entries. The
// backward kernels hold S^T (keys x queries) and use half of each unit they draw.
// The counter is {unit column, unit row, stream low, stream high} with stream = offset +
// b * nheads_q + h (each (sequence, head) its own stream), the key is the 64-bit seed.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/hd.h"
#include "common/philox.h"

namespace flashattn {

struct Dropout {
  uint32_t threshold = 0;               // 0 = off; else in [1, 65535]
  float scale = 1.f;                    // 65536 / (65536 - threshold): 1 / keep probability
  uint64_t seed = 0, offset = 0;
  const uint64_t* rng_state = nullptr;  // {seed, offset} read when the call runs (overrides)

  // p in [0, 1), validated by the API. p > 0 never rounds to "off", nor to "drop everything".
  static Dropout make(float p, uint64_t seed, uint64_t offset, const uint64_t* rng_state) {
    Dropout d;
    if (!(p > 0.f)) return d;
    long t = std::lround(double(p) * 65536.0);
    d.threshold = uint32_t(t < 1 ? 1 : (t > 65535 ? 65535 : t));
    d.scale = float(65536.0 / double(65536 - d.threshold));
    d.seed = seed;
    d.offset = offset;
    d.rng_state = rng_state;
    return d;
  }
  FA_HD bool enabled() const { return threshold != 0; }
  // The drop probability actually applied: threshold / 65536.
  FA_HD double effective_p() const { return threshold / 65536.0; }

  // Seed and offset as the call sees them (rng_state, when set, lives in the memory the code
  // runs on: host for the host paths, device for the kernels).
  FA_HD void resolve(uint64_t* s, uint64_t* o) const {
    if (rng_state != nullptr) {
      *s = rng_state[0];
      *o = rng_state[1];
    } else {
      *s = seed;
      *o = offset;
    }
  }
  // The same, once per call: zeros when dropout is off (the host paths pass it to every block).
  struct SeedOffset {
    uint64_t seed = 0, offset = 0;
  };
  FA_HD SeedOffset resolved() const {
    SeedOffset r;
    if (enabled()) resolve(&r.seed, &r.offset);
    return r;
  }
  // The Philox stream of (sequence b, query head h).
  FA_HD static uint64_t stream(uint64_t offset, int b, int nheads_q, int h) {
    return offset + uint64_t(b) * uint64_t(nheads_q) + uint64_t(h);
  }

  // Unit coordinates of entry (i, j), and its lane (0..7) within the unit.
  FA_HD static uint32_t unit_row(int i) { return uint32_t(i >> 4) * 8u + uint32_t(i & 7); }
  FA_HD static uint32_t unit_col(int j) { return uint32_t(j >> 4) * 4u + uint32_t((j & 7) >> 1); }
  FA_HD static int lane(int i, int j) { return ((i >> 3) & 1) * 4 + ((j >> 3) & 1) * 2 + (j & 1); }

  FA_HD static Philox4 unit_bits(uint64_t seed, uint64_t stream, uint32_t urow, uint32_t ucol) {
    return philox4x32_10(ucol, urow, uint32_t(stream), uint32_t(stream >> 32), uint32_t(seed),
                         uint32_t(seed >> 32));
  }
  // The 16-bit number of lane l of a unit.
  FA_HD static uint32_t pick16(const Philox4& r, int l) { return (r.x[l >> 1] >> ((l & 1) * 16)) & 0xffffu; }

  FA_HD bool keep_r16(uint32_t r16) const { return r16 >= threshold; }
  // Scalar form (host paths and tests): one Philox per call.
  FA_HD bool keep(uint64_t seed_, uint64_t stream_, int i, int j) const {
    return keep_r16(pick16(unit_bits(seed_, stream_, unit_row(i), unit_col(j)), lane(i, j)));
  }
};

}  // namespace flashattn
