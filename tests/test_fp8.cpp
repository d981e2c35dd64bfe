// FP8 groundwork (issue 16): the E4M3 "fn" codec (src/common/fp8.h), the random Hadamard transform
// (src/common/hadamard.h) and the host block quantizer behind flashattn_fp8_quantize /
// flashattn_fp8_dequantize. Every check is against something derived independently here: the
// 256 codes from the format's definition, rounding from a slow nearest-value search, the
// transform from the matrix H[i][j] = (-1)^popcount(i & j), the quantizer from a naive
// per-block recomputation, and the error from E4M3's half step.
#include <gtest/gtest.h>

#include <algorithm>
#include <bitset>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/fast_div.h"
#include "common/fp8.h"
#include "common/hadamard.h"
#include "common/half_convert.h"
#include "flashattn/flashattn.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

// ---- independent E4M3 model ------------------------------------------------------------------

// The value of code v by the format's definition (bias 7, 3 mantissa bits, S.1111.111 = NaN).
double e4m3_by_definition(uint8_t v) {
  const int sign = v >> 7, e = (v >> 3) & 15, m = v & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return sign ? -mag : mag;
}

// Slow round-to-nearest-even with saturation: the neighbours of |x| among the 127 non-negative
// finite codes, the nearer one (the even code on a tie); |x| > 448 and inf give 448.
uint8_t e4m3_slow(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(double(x));
  if (a >= 448.0) return uint8_t(sign | 0x7E);
  uint8_t lo = 0;
  while (lo < 0x7E && e4m3_by_definition(uint8_t(lo + 1)) <= a) ++lo;
  const uint8_t hi = uint8_t(lo + 1);
  const double dlo = a - e4m3_by_definition(lo), dhi = e4m3_by_definition(hi) - a;  // exact here
  uint8_t code = lo;
  if (dhi < dlo || (dhi == dlo && (hi & 1) == 0)) code = hi;
  if (dlo == 0) code = lo;
  return uint8_t(sign | code);
}

std::string hex(uint8_t v) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "0x%02X", v);
  return buf;
}

TEST(Fp8E4M3, DecodesAll256CodesAsTheFormatDefines) {
  for (int v = 0; v < 256; ++v) {
    const double want = e4m3_by_definition(uint8_t(v));
    const float got = e4m3_to_float(uint8_t(v));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << hex(uint8_t(v));
    } else {
      EXPECT_EQ(double(got), want) << hex(uint8_t(v));
      EXPECT_EQ(std::signbit(got), v >= 128) << hex(uint8_t(v));  // -0 included
    }
  }
  // Anchors of the format itself, not of the table above.
  EXPECT_EQ(e4m3_to_float(0x7E), 448.f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.f);
  EXPECT_EQ(e4m3_to_float(0x38), 1.f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.f, -9));   // smallest subnormal
  EXPECT_EQ(e4m3_to_float(0x07), 7 * std::ldexp(1.f, -9));  // largest subnormal
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.f, -6));   // smallest normal
  EXPECT_EQ(e4m3_to_float(0x77), 240.f);                 // e = 14: 1.875 * 2^7
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
  EXPECT_EQ(kE4M3Max, 448.f);
}

// Every finite code encodes to itself, and encoding is monotone across all 256 decoded values.
TEST(Fp8E4M3, EveryCodeRoundTrips) {
  for (int v = 0; v < 256; ++v) {
    if ((v & 0x7F) == 0x7F) continue;
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(uint8_t(v))), uint8_t(v)) << hex(uint8_t(v));
  }
}

TEST(Fp8E4M3, RoundsTiesBoundariesSubnormalsAndSaturatesAsTheSlowReference) {
  std::vector<float> xs;
  // Each code, each midpoint of neighbours (exact ties: a float holds them) and one float ulp
  // either side of both.
  for (int v = 0; v < 0x7E; ++v) {
    const double lo = e4m3_by_definition(uint8_t(v)), hi = e4m3_by_definition(uint8_t(v + 1));
    for (double c : {lo, 0.5 * (lo + hi)}) {
      const float f = float(c);
      ASSERT_EQ(double(f), c);
      xs.insert(xs.end(), {f, std::nextafter(f, 0.f), std::nextafter(f, 1e9f)});
    }
  }
  // Saturation and the ends of the range: 448, the 448/480 tie (464), beyond, inf; half the
  // smallest subnormal (ties to 0), float subnormals, the top of the subnormal range.
  for (float f : {448.f, 449.f, 463.99f, 464.f, 464.01f, 480.f, 1e6f, FLT_MAX, std::numeric_limits<float>::infinity(),
                  std::ldexp(1.f, -10), std::ldexp(1.f, -11), std::ldexp(3.f, -11), FLT_MIN, FLT_TRUE_MIN,
                  std::ldexp(15.f, -10), std::ldexp(1.f, -6), 0.f}) {
    xs.insert(xs.end(), {f, std::nextafter(f, 0.f), std::nextafter(f, std::numeric_limits<float>::infinity())});
  }
  // Random floats: uniform bit patterns over the interesting exponents, and fully random bits.
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint32_t> exp_bits(100, 140), mant(0, (1u << 23) - 1), any;
  for (int i = 0; i < 200000; ++i) xs.push_back(bits_float((exp_bits(rng) << 23) | mant(rng)));
  for (int i = 0; i < 50000; ++i) xs.push_back(bits_float(any(rng)));
  int checked = 0;
  for (float f : xs) {
    for (float x : {f, -f}) {
      const uint8_t got = float_to_e4m3(x), want = e4m3_slow(x);
      if (std::isnan(x)) {
        EXPECT_TRUE(std::isnan(e4m3_to_float(got))) << x;
        continue;
      }
      ASSERT_EQ(got, want) << "x = " << x << " (bits " << std::hex << float_bits(x) << std::dec << "), seed " << seed;
      ++checked;
    }
  }
  EXPECT_GT(checked, 500000);
  // Spot checks that pin the rounding rule itself (ties to even, not away).
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);   // 1 + 1/16: tie between 1 (m=0) and 1.125 (m=1) -> 1
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3A);   // tie between 1.125 (m=1) and 1.25 (m=2) -> 1.25
  EXPECT_EQ(float_to_e4m3(464.f), 0x7E);     // tie between 448 and 480 (NaN): 448
  EXPECT_EQ(float_to_e4m3(-1e30f), 0xFE);    // saturates
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.f, -10)), 0x00);                    // tie to 0
  EXPECT_EQ(float_to_e4m3(std::nextafter(std::ldexp(1.f, -10), 1.f)), 0x01);
  EXPECT_EQ(float_to_e4m3(std::ldexp(3.f, -10)), 0x02);                    // 1.5 * 2^-9 ties to 2 * 2^-9
  EXPECT_EQ(float_to_e4m3(-0.f), 0x80);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7F, 0x7F);
}

// ---- Hadamard transform ------------------------------------------------------------------------

std::vector<int8_t> signs_for(uint64_t seed, int n) {
  std::vector<int8_t> s(static_cast<size_t>(n));
  for (int c = 0; c < n; ++c) s[size_t(c)] = int8_t(hadamard_sign(seed, c));
  return s;
}

// x' = M x with M[i][j] = (-1)^popcount(i & j) * signs[j] / sqrt(n), summed in long double.
std::vector<double> hadamard_naive(const std::vector<double>& x, const std::vector<int8_t>& signs) {
  const int n = int(x.size());
  std::vector<double> y(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    long double acc = 0;
    for (int j = 0; j < n; ++j) {
      const int h = (std::bitset<16>(unsigned(i & j)).count() & 1) ? -1 : 1;
      acc += (long double)(h * signs[size_t(j)]) * x[size_t(j)];
    }
    y[size_t(i)] = double(acc / std::sqrt((long double)n));
  }
  return y;
}

TEST(Fp8Hadamard, SupportedDims) {
  for (int n : {16, 32, 64, 128, 256}) EXPECT_TRUE(hadamard_dim_supported(n)) << n;
  for (int n : {-16, 0, 1, 2, 8, 24, 48, 96, 192, 255, 257, 512}) EXPECT_FALSE(hadamard_dim_supported(n)) << n;
}

TEST(Fp8Hadamard, SignsAreSeededAndBalanced) {
  const uint64_t seed = fresh_seed();
  const auto a = signs_for(seed, 256), again = signs_for(seed, 256), other = signs_for(seed ^ 0x9E3779B97F4A7C15ull, 256);
  EXPECT_EQ(a, again);
  EXPECT_NE(a, other) << "seed " << seed;
  const int neg = int(std::count(a.begin(), a.end(), int8_t(-1)));
  for (int8_t s : a) EXPECT_TRUE(s == 1 || s == -1);
  // Binomial(256, 1/2): 128 +- 8 sd; outside [64, 192] is a 8-sigma event.
  EXPECT_GT(neg, 64) << "seed " << seed;
  EXPECT_LT(neg, 192) << "seed " << seed;
  // Signs of the first 16 columns are the same whatever n: one sign per column, not per size.
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 16, signs_for(seed, 16).begin()));
}

TEST(Fp8Hadamard, IsTheOrthonormalMatrixForEverySize) {
  const uint64_t seed = fresh_seed();
  for (int n = 16; n <= 256; n *= 2) {
    const auto signs = signs_for(seed, n);
    const double inv = 1.0 / std::sqrt(double(n));
    // Column j of the map is the transform of e_j; it must be H[:, j] * signs[j] / sqrt(n) exactly.
    std::vector<std::vector<double>> cols(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
      std::vector<double> e(size_t(n), 0.0);
      e[size_t(j)] = 1.0;
      hadamard_forward(e.data(), signs.data(), n, inv);
      for (int i = 0; i < n; ++i) {
        const int h = (std::bitset<16>(unsigned(i & j)).count() & 1) ? -1 : 1;
        ASSERT_EQ(e[size_t(i)], h * signs[size_t(j)] * inv) << "n " << n << " (" << i << ", " << j << ")";
      }
      cols[size_t(j)] = e;
    }
    // M^T M = I.
    double worst = 0;
    for (int a = 0; a < n; ++a) {
      for (int b = 0; b < n; ++b) {
        double dot = 0;
        for (int i = 0; i < n; ++i) dot += cols[size_t(a)][size_t(i)] * cols[size_t(b)][size_t(i)];
        worst = std::max(worst, std::fabs(dot - (a == b ? 1.0 : 0.0)));
      }
    }
    EXPECT_LT(worst, 1e-14) << "n " << n;
  }
}

TEST(Fp8Hadamard, PreservesDotProductsAndInverts) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  for (int n = 16; n <= 256; n *= 2) {
    const auto signs = signs_for(seed + uint64_t(n), n);
    const double inv = 1.0 / std::sqrt(double(n));
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<double> q(static_cast<size_t>(n)), k(static_cast<size_t>(n));
      for (auto& v : q) v = normal(rng);
      for (auto& v : k) v = normal(rng);
      q[size_t(trial % n)] = 40.0;  // an outlier
      auto tq = q, tk = k;
      hadamard_forward(tq.data(), signs.data(), n, inv);
      hadamard_forward(tk.data(), signs.data(), n, inv);
      double dot = 0, tdot = 0, nq = 0, nk = 0;
      for (int c = 0; c < n; ++c) {
        dot += q[size_t(c)] * k[size_t(c)];
        tdot += tq[size_t(c)] * tk[size_t(c)];
        nq += q[size_t(c)] * q[size_t(c)];
        nk += k[size_t(c)] * k[size_t(c)];
      }
      EXPECT_LE(std::fabs(dot - tdot), 1e-13 * std::sqrt(nq * nk)) << "n " << n << ", seed " << seed;
      const auto naive = hadamard_naive(q, signs);
      for (int c = 0; c < n; ++c) EXPECT_NEAR(tq[size_t(c)], naive[size_t(c)], 1e-13 * std::sqrt(nq));
      hadamard_inverse(tq.data(), signs.data(), n, inv);
      for (int c = 0; c < n; ++c) EXPECT_NEAR(tq[size_t(c)], q[size_t(c)], 1e-13 * std::sqrt(nq));
    }
  }
}

TEST(Fp8Hadamard, SpreadsAnOutlierEvenly) {
  const uint64_t seed = fresh_seed();
  for (int n = 16; n <= 256; n *= 2) {
    const auto signs = signs_for(seed, n);
    std::vector<double> x(size_t(n), 0.0);
    x[size_t(n / 3)] = -1000.0;
    hadamard_forward(x.data(), signs.data(), n, 1.0 / std::sqrt(double(n)));
    for (int c = 0; c < n; ++c) EXPECT_DOUBLE_EQ(std::fabs(x[size_t(c)]), 1000.0 / std::sqrt(double(n))) << n;
  }
}

// ---- the quantizer through the C ABI --------------------------------------------------------

// E4M3 codes [b, s, h, d], padded (a stride gap after each head and row) and poisoned, so a write
// outside the view shows.
struct Fp8Buffer {
  static constexpr uint8_t kPoison = 0x5A;
  int64_t shape[4], stride[4];
  std::vector<uint8_t> bytes;
  Fp8Buffer(int64_t b, int64_t s, int64_t h, int64_t d) {
    const int64_t sh[4] = {b, s, h, d};
    std::memcpy(shape, sh, sizeof(shape));
    stride[3] = 1;
    stride[2] = d + 3;
    stride[1] = h * stride[2] + 5;
    stride[0] = s * stride[1] + 7;
    bytes.assign(size_t(std::max<int64_t>(1, b * stride[0])), kPoison);
  }
  uint8_t& at(int64_t b, int64_t s, int64_t h, int64_t c) { return bytes[size_t(b * stride[0] + s * stride[1] + h * stride[2] + c)]; }
  flashattn_tensor view() {
    flashattn_tensor t;
    t.data = bytes.data();
    std::memcpy(t.shape, shape, sizeof(shape));
    std::memcpy(t.stride, stride, sizeof(stride));
    return t;
  }
  // Bytes outside the view that changed.
  int64_t padding_writes() const {
    std::vector<char> inside(bytes.size(), 0);
    for (int64_t b = 0; b < shape[0]; ++b)
      for (int64_t s = 0; s < shape[1]; ++s)
        for (int64_t h = 0; h < shape[2]; ++h)
          for (int64_t c = 0; c < shape[3]; ++c) inside[size_t(b * stride[0] + s * stride[1] + h * stride[2] + c)] = 1;
    int64_t n = 0;
    for (size_t i = 0; i < bytes.size(); ++i) n += !inside[i] && bytes[i] != kPoison;
    return n;
  }
};

struct QuantCase {
  int64_t b, s, h, d;
  int block;
  flashattn_dtype dtype;
  Layout layout;
  bool hadamard;
};

std::string str(const QuantCase& c) {
  return "[" + std::to_string(c.b) + "," + std::to_string(c.s) + "," + std::to_string(c.h) + "," + std::to_string(c.d) +
         "] block " + std::to_string(c.block) + " " + dtype_str(c.dtype) + " " + layout_str(c.layout) +
         (c.hadamard ? " hadamard" : "");
}

int64_t nblocks(int64_t s, int64_t block) { return (s + block - 1) / block; }

flashattn_fp8_quantize_params fp8_params(HostTensor& x, Fp8Buffer& q, std::vector<float>& scales, int block,
                                         bool hadamard, uint64_t seed) {
  flashattn_fp8_quantize_params p = flashattn_fp8_quantize_params_init();
  p.dtype = x.dtype;
  p.x = x.view();
  p.x_fp8 = q.view();
  p.scales = scales.data();
  p.block_size = block;
  p.hadamard = hadamard;
  p.hadamard_seed = seed;
  return p;
}

// The expected quantization, recomputed naively: row transform (naive matrix product in fp64,
// rounded to fp32), block amax over finite values, scale, codes by the slow reference. Checks
// `scales` and `q` against it; returns the transformed rows [b, s, h, d] for the error checks.
std::vector<float> check_quantized(const QuantCase& c, const HostTensor& x, Fp8Buffer& q,
                                   const std::vector<float>& scales, uint64_t seed, const std::string& what) {
  const auto signs = c.hadamard ? signs_for(seed, int(c.d)) : std::vector<int8_t>();
  std::vector<float> xt(size_t(c.b * c.s * c.h * c.d));
  auto xt_at = [&](int64_t b, int64_t s, int64_t h, int64_t k) -> float& {
    return xt[size_t(((b * c.s + s) * c.h + h) * c.d + k)];
  };
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t s = 0; s < c.s; ++s)
      for (int64_t h = 0; h < c.h; ++h) {
        std::vector<double> row(size_t(c.d));
        for (int64_t k = 0; k < c.d; ++k) row[size_t(k)] = x.get(b, s, h, k);
        if (c.hadamard) row = hadamard_naive(row, signs);
        for (int64_t k = 0; k < c.d; ++k) xt_at(b, s, h, k) = float(row[size_t(k)]);
      }
  const int64_t nb = nblocks(c.s, c.block);
  int bad = 0;
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t h = 0; h < c.h; ++h)
      for (int64_t blk = 0; blk < nb; ++blk) {
        const int64_t s0 = blk * c.block, s1 = std::min(c.s, s0 + c.block);
        float amax = 0;
        for (int64_t s = s0; s < s1; ++s)
          for (int64_t k = 0; k < c.d; ++k) {
            const float a = std::fabs(xt_at(b, s, h, k));
            if (std::isfinite(a)) amax = std::max(amax, a);
          }
        const float scale = amax == 0 ? 1.f : std::max(amax / 448.f, FLT_MIN);
        const float got_scale = scales[size_t((b * c.h + h) * nb + blk)];
        // The transform's last bits may differ between the fast and the naive product.
        const double scale_tol = c.hadamard ? 4e-7 * scale : 0.0;
        if (!(std::fabs(got_scale - scale) <= scale_tol)) {
          ADD_FAILURE() << what << ": scale (" << b << ", " << h << ", block " << blk << ") " << got_scale << ", expected "
                        << scale;
          if (++bad > 10) return xt;
        }
        for (int64_t s = s0; s < s1; ++s)
          for (int64_t k = 0; k < c.d; ++k) {
            const float qv = xt_at(b, s, h, k) / scale;
            const uint8_t got = q.at(b, s, h, k), want = e4m3_slow(qv);
            bool ok = got == want || (std::isnan(qv) && (got & 0x7F) == 0x7F);
            if (!ok && c.hadamard && !std::isnan(qv)) {
              // A last-bit difference in x' can only matter next to a rounding midpoint.
              const double dg = std::fabs(e4m3_to_float(got) - double(qv)), dw = std::fabs(e4m3_to_float(want) - double(qv));
              ok = dg <= dw + 1e-5 * std::fabs(double(qv));
            }
            if (!ok) {
              ADD_FAILURE() << what << ": code (" << b << ", " << s << ", " << h << ", " << k << ") " << hex(got)
                            << ", expected " << hex(want) << " for x'/scale = " << qv;
              if (++bad > 10) return xt;
            }
          }
      }
  return xt;
}

TEST(Fp8Quantize, MatchesTheNaiveQuantizerAndItsErrorBound) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const std::vector<QuantCase> cases = {
      {2, 1, 3, 64, 128, FLASHATTN_DTYPE_FP16, Layout::kContiguous, false},
      {1, 7, 2, 32, 128, FLASHATTN_DTYPE_BF16, Layout::kPadded, true},
      {2, 113, 2, 64, 16, FLASHATTN_DTYPE_FP32, Layout::kHeadMajor, false},
      {1, 113, 3, 128, 1, FLASHATTN_DTYPE_FP16, Layout::kPadded, true},
      {1, 799, 2, 64, 128, FLASHATTN_DTYPE_BF16, Layout::kContiguous, true},   // 799 = 6 * 128 + 31
      {1, 799, 1, 16, 100, FLASHATTN_DTYPE_FP32, Layout::kHeadMajor, false},  // 100 does not divide 799
      {2, 300, 2, 256, 1000, FLASHATTN_DTYPE_FP16, Layout::kContiguous, true}, // block >= seqlen: per (b, h)
      {1, 40, 2, 24, 8, FLASHATTN_DTYPE_FP64, Layout::kPadded, false},        // any headdim without the transform
  };
  for (const QuantCase& c : cases) {
    const std::string what = str(c) + ", seed " + std::to_string(seed);
    HostTensor x(c.dtype, c.b, c.s, c.h, c.d, c.layout);
    // Rows of very different magnitude so per-block scales differ, and outliers.
    std::normal_distribution<double> normal;
    for (int64_t b = 0; b < c.b; ++b)
      for (int64_t s = 0; s < c.s; ++s)
        for (int64_t h = 0; h < c.h; ++h) {
          const double mag = std::ldexp(1.0, int((b * 7 + s / std::max(1, c.block) * 5 + h * 3) % 17) - 8);
          for (int64_t k = 0; k < c.d; ++k) x.set(b, s, h, k, mag * normal(rng));
        }
    for (int o = 0; o < 1 + int(c.b * c.s * c.h / 50); ++o)
      x.set(int64_t(rng() % uint64_t(c.b)), int64_t(rng() % uint64_t(c.s)), int64_t(rng() % uint64_t(c.h)),
            int64_t(rng() % uint64_t(c.d)), (rng() & 1 ? 1 : -1) * 300.0);
    Fp8Buffer q(c.b, c.s, c.h, c.d);
    const int64_t nb = nblocks(c.s, c.block);
    std::vector<float> scales(size_t(c.b * c.h * nb), std::numeric_limits<float>::quiet_NaN());
    const uint64_t tseed = rng();
    flashattn_fp8_quantize_params p = fp8_params(x, q, scales, c.block, c.hadamard, tseed);
    ASSERT_EQ(flashattn_fp8_quantize(&p, nullptr), FLASHATTN_SUCCESS) << what << ": " << flashattn_last_error();
    EXPECT_EQ(q.padding_writes(), 0) << what;
    const std::vector<float> xt = check_quantized(c, x, q, scales, tseed, what);

    // Each block's largest |x'| lands on +-448 (the scale's purpose).
    for (int64_t b = 0; b < c.b; ++b)
      for (int64_t h = 0; h < c.h; ++h)
        for (int64_t blk = 0; blk < nb; ++blk) {
          int at_max = 0;
          for (int64_t s = blk * c.block; s < std::min(c.s, (blk + 1) * c.block); ++s)
            for (int64_t k = 0; k < c.d; ++k) at_max += (q.at(b, s, h, k) & 0x7F) == 0x7E;
          EXPECT_GE(at_max, 1) << what << ": block (" << b << ", " << h << ", " << blk << ")";
        }

    // Dequantize to fp32 and bound the error. In x' (the transformed values) each element is off by
    // at most half an E4M3 step times the scale: 2^-4 |x'| where |x'| >= 2^-6 scale (3 mantissa
    // bits), 2^-10 scale below (subnormal step 2^-9), plus fp32 rounding of x'/scale (2^-24
    // relative, folded into the factor 1 + 2^-20). The transform is orthogonal, so in x the row's
    // L2 error is bounded by the L2 norm of those per-element bounds (+ fp32 output rounding).
    HostTensor back(FLASHATTN_DTYPE_FP32, c.b, c.s, c.h, c.d, Layout::kPadded);
    back.fill_nan();
    flashattn_fp8_quantize_params pd = p;
    pd.dtype = FLASHATTN_DTYPE_FP32;
    pd.x = back.view();
    ASSERT_EQ(flashattn_fp8_dequantize(&pd, nullptr), FLASHATTN_SUCCESS) << what << ": " << flashattn_last_error();
    EXPECT_EQ(back.padding_writes(), 0) << what;
    int bad = 0;
    for (int64_t b = 0; b < c.b && bad < 10; ++b)
      for (int64_t s = 0; s < c.s && bad < 10; ++s)
        for (int64_t h = 0; h < c.h && bad < 10; ++h) {
          const double scale = scales[size_t((b * c.h + h) * nb + s / c.block)];
          double bound2 = 0, err2 = 0, norm2 = 0;
          for (int64_t k = 0; k < c.d; ++k) {
            const double xp = xt[size_t(((b * c.s + s) * c.h + h) * c.d + k)];
            const double elem_bound = std::max(std::ldexp(std::fabs(xp), -4), std::ldexp(scale, -10)) * (1 + 0x1p-20);
            const double orig = x.get(b, s, h, k), got = back.get(b, s, h, k);
            if (!c.hadamard && !(std::fabs(got - orig) <= elem_bound + std::ldexp(std::fabs(orig), -24))) {
              ADD_FAILURE() << what << ": element (" << b << ", " << s << ", " << h << ", " << k << ") " << got
                            << " vs " << orig << ", bound " << elem_bound;
              ++bad;
            }
            bound2 += elem_bound * elem_bound;
            err2 += (got - orig) * (got - orig);
            norm2 += orig * orig;
          }
          if (!(std::sqrt(err2) <= std::sqrt(bound2) + 1e-6 * std::sqrt(norm2))) {
            ADD_FAILURE() << what << ": row (" << b << ", " << s << ", " << h << ") L2 error " << std::sqrt(err2)
                          << " > bound " << std::sqrt(bound2);
            ++bad;
          }
        }
  }
}

TEST(Fp8Quantize, HadamardShrinksTheScaleOfAnOutlierBlock) {
  // One token of the block holds an entry 10^5 times its neighbours': it sets the block's scale,
  // and without the transform the other tokens fall to E4M3 subnormals (x / scale < 2^-6), where
  // the step is absolute. The transform spreads the entry over the row (amax / sqrt(128)), the
  // scale drops by ~sqrt(128), and the other tokens' scores through FP8 get much closer to exact.
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t S = 64, D = 128;
  HostTensor q(FLASHATTN_DTYPE_FP32, 1, S, 1, D), k(FLASHATTN_DTYPE_FP32, 1, S, 1, D);
  q.fill_random(rng, 1.0, 0);
  k.fill_random(rng, 1.0, 0);
  q.set(0, 0, 0, int64_t(rng() % D), 1e5);
  double err[2] = {0, 0}, scale[2] = {0, 0};
  for (int had = 0; had < 2; ++had) {
    Fp8Buffer fq(1, S, 1, D), fk(1, S, 1, D);
    std::vector<float> sq(1), sk(1);
    auto pq = fp8_params(q, fq, sq, 128, had, seed), pk = fp8_params(k, fk, sk, 128, had, seed);
    ASSERT_EQ(flashattn_fp8_quantize(&pq, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
    ASSERT_EQ(flashattn_fp8_quantize(&pk, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
    scale[had] = sq[0];
    // Scores of the tokens other than the outlier's, from the FP8 values (in the transformed space
    // when had = 1: the same scores), against the exact ones.
    for (int64_t i = 1; i < S; ++i)
      for (int64_t j = 0; j < S; ++j) {
        double exact = 0, fp8 = 0;
        for (int64_t c = 0; c < D; ++c) {
          exact += q.get(0, i, 0, c) * k.get(0, j, 0, c);
          fp8 += double(e4m3_to_float(fq.at(0, i, 0, c))) * sq[0] * double(e4m3_to_float(fk.at(0, j, 0, c))) * sk[0];
        }
        err[had] += (fp8 - exact) * (fp8 - exact);
      }
  }
  EXPECT_NEAR(scale[1] * std::sqrt(double(D)), scale[0], 0.05 * scale[0]) << "seed " << seed;
  EXPECT_LT(err[1], 0.25 * err[0]) << "seed " << seed << ": squared score error " << err[1] << " with the transform, "
                                  << err[0] << " without";
}

TEST(Fp8Quantize, NonFiniteZeroAndTinyBlocks) {
  const int64_t S = 12, D = 16;
  const int block = 4;  // blocks: rows 0-3 (NaN, inf), 4-7 (zeros), 8-11 (tiny)
  for (int had = 0; had < 2; ++had) {
    std::mt19937_64 rng(fresh_seed());
    HostTensor x(FLASHATTN_DTYPE_FP32, 1, S, 1, D);
    x.fill_random(rng);
    x.set(0, 1, 0, 3, NAN);
    x.set(0, 2, 0, 5, -INFINITY);
    for (int64_t s = 4; s < 8; ++s)
      for (int64_t c = 0; c < D; ++c) x.set(0, s, 0, c, 0.0);
    for (int64_t s = 8; s < 12; ++s)
      for (int64_t c = 0; c < D; ++c) x.set(0, s, 0, c, std::ldexp(double(c % 3) - 1.0, -140));  // fp32 subnormals
    Fp8Buffer q(1, S, 1, D);
    std::vector<float> scales(3, -1.f);
    auto p = fp8_params(x, q, scales, block, had, 7);
    ASSERT_EQ(flashattn_fp8_quantize(&p, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
    // Block 0: the scale comes from the finite values; NaN stays NaN, -inf saturates (without the
    // transform; with it, the whole row holding NaN or inf is non-finite, the other rows are fine).
    float amax = 0;
    for (int64_t s = 0; s < 4; ++s)
      for (int64_t c = 0; c < D; ++c)
        if (std::isfinite(x.get(0, s, 0, c))) amax = std::max(amax, float(std::fabs(x.get(0, s, 0, c))));
    EXPECT_TRUE(std::isfinite(scales[0]) && scales[0] > 0) << scales[0];
    if (!had) {
      EXPECT_EQ(scales[0], amax / 448.f);
      EXPECT_EQ(q.at(0, 1, 0, 3) & 0x7F, 0x7F);
      EXPECT_EQ(q.at(0, 2, 0, 5), 0xFE);
    } else {
      for (int64_t c = 0; c < D; ++c) EXPECT_EQ(q.at(0, 1, 0, c) & 0x7F, 0x7F) << c;  // NaN spreads over its row
    }
    for (int64_t s : {0, 3})
      for (int64_t c = 0; c < D; ++c) EXPECT_NE(q.at(0, s, 0, c) & 0x7F, 0x7F) << s << ", " << c;
    // Block 1: all zeros -> scale 1, codes 0.
    EXPECT_EQ(scales[1], 1.f);
    for (int64_t s = 4; s < 8; ++s)
      for (int64_t c = 0; c < D; ++c) EXPECT_EQ(q.at(0, s, 0, c) & 0x7F, 0) << s << ", " << c;
    // Block 2: amax / 448 underflows below FLT_MIN -> FLT_MIN, codes finite.
    EXPECT_EQ(scales[2], FLT_MIN);
    for (int64_t s = 8; s < 12; ++s)
      for (int64_t c = 0; c < D; ++c) EXPECT_NE(q.at(0, s, 0, c) & 0x7F, 0x7F);
  }
}

TEST(Fp8Quantize, ResultDoesNotDependOnThreadCount) {
  std::mt19937_64 rng(fresh_seed());
  HostTensor x(FLASHATTN_DTYPE_BF16, 2, 300, 4, 128);  // past the single-thread threshold
  x.fill_random(rng);
  std::vector<uint8_t> first;
  std::vector<float> first_scales;
  for (int threads : {1, 2, 3}) {
    Fp8Buffer q(2, 300, 4, 128);
    std::vector<float> scales(size_t(2 * 4 * 3));
    auto p = fp8_params(x, q, scales, 128, true, 99);
    p.options.num_threads = threads;
    ASSERT_EQ(flashattn_fp8_quantize(&p, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
    if (first.empty()) {
      first = q.bytes;
      first_scales = scales;
    } else {
      EXPECT_EQ(q.bytes, first) << threads << " threads";
      EXPECT_EQ(scales, first_scales) << threads << " threads";
    }
  }
}

TEST(Fp8Quantize, EmptyShapes) {
  // seqlen 0: no blocks, nothing read or written (NULL pointers are fine).
  flashattn_fp8_quantize_params p = flashattn_fp8_quantize_params_init();
  p.dtype = FLASHATTN_DTYPE_FP16;
  const int64_t shape[4] = {2, 0, 3, 64};
  std::memcpy(p.x.shape, shape, sizeof(shape));
  std::memcpy(p.x_fp8.shape, shape, sizeof(shape));
  EXPECT_EQ(flashattn_fp8_quantize(&p, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  EXPECT_EQ(flashattn_fp8_dequantize(&p, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  // headdim 0: blocks with no values get scale 1.
  p.x.shape[1] = p.x_fp8.shape[1] = 5;
  p.x.shape[3] = p.x_fp8.shape[3] = 0;
  p.block_size = 2;
  std::vector<float> scales(2 * 3 * 3, -1.f);
  p.scales = scales.data();
  EXPECT_EQ(flashattn_fp8_quantize(&p, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  for (float s : scales) EXPECT_EQ(s, 1.f);
}

TEST(Fp8Quantize, ParamsInitDefaults) {
  const flashattn_fp8_quantize_params p = flashattn_fp8_quantize_params_init();
  EXPECT_EQ(p.struct_size, sizeof(flashattn_fp8_quantize_params));
  EXPECT_EQ(p.dtype, FLASHATTN_DTYPE_BF16);
  EXPECT_EQ(p.block_size, 128);
  EXPECT_EQ(p.hadamard, 0);
  EXPECT_EQ(p.x.stride[3], 1);
  EXPECT_EQ(p.x_fp8.stride[3], 1);
  EXPECT_EQ(p.options.device, -1);
  EXPECT_EQ(p.options.backend, FLASHATTN_BACKEND_AUTO);
  EXPECT_EQ(p.scales, nullptr);
  EXPECT_EQ(p.x_fp8_layout, FLASHATTN_FP8_V_ROWS);
}

// Every refusal names its field, in both directions; the valid params succeed.
TEST(Fp8Quantize, ValidationNamesTheField) {
  std::mt19937_64 rng(fresh_seed());
  HostTensor x(FLASHATTN_DTYPE_FP32, 1, 9, 2, 32);
  x.fill_random(rng);
  Fp8Buffer q(1, 9, 2, 32);
  std::vector<float> scales(2 * 3 + 1);
  using Mutate = std::function<void(flashattn_fp8_quantize_params&)>;
  struct Bad {
    const char* field;
    flashattn_status status;
    Mutate mutate;
  };
  const Bad bads[] = {
      {"params.struct_size", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.struct_size -= 8; }},
      {"options.backend", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.options.backend = flashattn_backend(17); }},
      {"options.device", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.options.device = -2; }},
      {"options.device", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.options.backend = FLASHATTN_BACKEND_SM90; }},
      {"options.num_threads", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.options.num_threads = -1; }},
      {"dtype", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.dtype = flashattn_dtype(0); }},
      {"dtype", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.dtype = FLASHATTN_DTYPE_FP8_E4M3; }},
      {"x.shape[1]", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.x.shape[1] = p.x_fp8.shape[1] = -1; }},
      {"x_fp8.shape[2]", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.x_fp8.shape[2] = 3; }},
      {"x.stride[3]", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.x.stride[3] = 2; }},
      {"x.stride[0]", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.x.stride[0] = -5; }},
      {"x_fp8.stride[3]", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.x_fp8.stride[3] = 0; }},
      {"x_fp8.stride[1]", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.x_fp8.stride[1] = -1; }},
      {"block_size", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.block_size = 0; }},
      {"block_size", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.block_size = -128; }},
      {"hadamard", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.hadamard = 2; }},
      {"hadamard", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) {  // headdim 24 is no power of two
         p.hadamard = 1;
         p.x.shape[3] = p.x_fp8.shape[3] = 24;
       }},
      {"x.data", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.x.data = nullptr; }},
      {"x.data", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.x.data = static_cast<char*>(p.x.data) + 2; }},
      {"x_fp8.data", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.x_fp8.data = nullptr; }},
      {"scales", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.scales = nullptr; }},
      {"scales", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.scales = reinterpret_cast<float*>(reinterpret_cast<char*>(p.scales) + 1); }},
  };
  for (int dir = 0; dir < 2; ++dir) {
    auto call = [&](const flashattn_fp8_quantize_params* p) {
      return dir == 0 ? flashattn_fp8_quantize(p, nullptr) : flashattn_fp8_dequantize(p, nullptr);
    };
    const flashattn_fp8_quantize_params good = fp8_params(x, q, scales, 4, false, 0);
    ASSERT_EQ(call(&good), FLASHATTN_SUCCESS) << flashattn_last_error();
    EXPECT_STREQ(flashattn_last_error(), "");
    EXPECT_EQ(call(nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashattn_last_error()).find("params"), std::string::npos);
    for (const Bad& bad : bads) {
      flashattn_fp8_quantize_params p = good;
      bad.mutate(p);
      EXPECT_EQ(call(&p), bad.status) << (dir ? "dequantize " : "quantize ") << bad.field << ": " << flashattn_last_error();
      const std::string msg = flashattn_last_error();
      EXPECT_EQ(msg.rfind(bad.field, 0), 0u) << "message should start with " << bad.field << ": " << msg;
    }
  }
  // CUDA tensors: dequantize is refused by name; quantize runs on the GPU (tests/gpu), so host
  // pointers with options.device = 0 are refused as not device memory, or, without CUDA in the
  // build, the device is.
  flashattn_fp8_quantize_params p = fp8_params(x, q, scales, 4, false, 0);
  p.options.device = 0;
  EXPECT_EQ(flashattn_fp8_dequantize(&p, nullptr), FLASHATTN_ERROR_NOT_SUPPORTED);
  std::string msg = flashattn_last_error();
  EXPECT_EQ(msg.rfind("options.device", 0), 0u) << msg;
  EXPECT_NE(msg.find("not implemented yet"), std::string::npos) << msg;
  const bool cuda_build =
      (flashattn_compiled_backends() & ((1u << FLASHATTN_BACKEND_SM80) | (1u << FLASHATTN_BACKEND_SM90))) != 0;
  const flashattn_status st = flashattn_fp8_quantize(&p, nullptr);
  msg = flashattn_last_error();
  if (cuda_build) {
    EXPECT_EQ(st, FLASHATTN_ERROR_INVALID_ARGUMENT) << msg;
    EXPECT_EQ(msg.rfind("x.data", 0), 0u) << msg;
  } else {
    EXPECT_EQ(st, FLASHATTN_ERROR_NO_DEVICE) << msg;
    EXPECT_EQ(msg.rfind("options.device", 0), 0u) << msg;
  }
}


// flashattn_fp8_v_keys_permuted16 on host tensors: every key lands where flashattn.h's layout puts it
// (perm written out from the header's bit formula, not the library's helper), every keyless position
// of a row is 0 (the output is poisoned with NaN codes first), from a v with padded, non-contiguous
// strides; ragged key counts and row lengths past the minimum.
int header_key_position(int j) {
  const int k = j % 16, k3 = k >> 3 & 1, k2 = k >> 2 & 1, k1 = k >> 1 & 1, k0 = k & 1;
  return j / 16 * 16 + 8 * k2 + 4 * k1 + 2 * k3 + k0;
}

flashattn_fp8_v_permute_params v_permute_params(uint8_t* v, uint8_t* out, int b, int s, int h, int d, int64_t L) {
  flashattn_fp8_v_permute_params p = flashattn_fp8_v_permute_params_init();
  const int64_t vs[4] = {int64_t(s) * (h + 1) * (d + 3), int64_t(h + 1) * (d + 3), d + 3, 1};  // padded
  const int64_t os[4] = {int64_t(h) * d * L, 1, int64_t(d) * L, L};
  p.v.data = v;
  p.v_out.data = out;
  for (int i = 0; i < 4; ++i) {
    p.v.stride[i] = vs[i], p.v_out.stride[i] = os[i];
    p.v.shape[i] = p.v_out.shape[i] = i == 0 ? b : i == 1 ? s : i == 2 ? h : d;
  }
  return p;
}

TEST(Fp8VPermute, PutsEveryKeyWhereTheHeaderSaysAndZeroesTheRest) {
  std::mt19937 rng(fresh_seed());
  for (int s : {1, 7, 16, 113, 799}) {
    for (int extra : {0, 48}) {
      const int b = 2, h = 3, d = s == 113 ? 80 : 16;
      const int64_t L = (s + 15) / 16 * 16 + extra;
      std::vector<uint8_t> v(size_t(b) * s * (h + 1) * (d + 3));
      for (auto& x : v) x = uint8_t(rng() % 0x7f);  // finite codes (0x7f is NaN)
      std::vector<uint8_t> out(size_t(b) * h * d * L, 0x7f);
      flashattn_fp8_v_permute_params p = v_permute_params(v.data(), out.data(), b, s, h, d, L);
      ASSERT_EQ(flashattn_fp8_v_keys_permuted16(&p, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
      std::vector<uint8_t> expect(out.size(), 0);
      for (int bi = 0; bi < b; ++bi)
        for (int j = 0; j < s; ++j)
          for (int hi = 0; hi < h; ++hi)
            for (int c = 0; c < d; ++c)
              expect[((size_t(bi) * h + hi) * d + c) * L + header_key_position(j)] =
                  v[size_t(bi * p.v.stride[0] + j * p.v.stride[1] + hi * p.v.stride[2] + c)];
      ASSERT_EQ(out, expect) << "s " << s << " extra " << extra;
    }
  }
}

TEST(Fp8VPermute, RefusesBadInputByName) {
  const int b = 2, s = 20, h = 2, d = 16;
  const int64_t L = 32;
  std::vector<uint8_t> v(size_t(b) * s * (h + 1) * (d + 3), 0x38), out(size_t(b) * h * d * L, 0x7f);
  struct Case { const char* field; flashattn_status status; std::function<void(flashattn_fp8_v_permute_params&)> breaks; };
  const Case bads[] = {
      {"params.struct_size", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.struct_size -= 8; }},
      {"v_out.shape[1]", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.v_out.shape[1] = 19; }},
      {"v.shape[3]", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.v.shape[3] = p.v_out.shape[3] = -1; }},
      {"v.stride[3]", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.v.stride[3] = 2; }},
      {"v_out.stride[1]", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.v_out.stride[1] = 2; }},
      {"v_out.stride[3]", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.v_out.stride[3] = 16; }},  // < 32
      {"v_out.stride[3]", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.v_out.stride[3] = 40; }},  // % 16
      {"v_out.stride[2]", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.v_out.stride[2] = 16 * 31; }},
      {"v_out.stride[0]", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.v_out.stride[0] = 16 * 32; }},
      {"v.data: NULL", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.v.data = nullptr; }},
      {"v_out.data: NULL", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p) { p.v_out.data = nullptr; }},
      {"v_out.data: overlaps v", FLASHATTN_ERROR_INVALID_ARGUMENT,
       [&](auto& p) { p.v_out.data = static_cast<uint8_t*>(p.v.data) + 40; }},
  };
  for (const Case& bad : bads) {
    std::fill(out.begin(), out.end(), 0x7f);
    flashattn_fp8_v_permute_params p = v_permute_params(v.data(), out.data(), b, s, h, d, L);
    bad.breaks(p);
    EXPECT_EQ(flashattn_fp8_v_keys_permuted16(&p, nullptr), bad.status) << bad.field << ": " << flashattn_last_error();
    EXPECT_NE(std::string(flashattn_last_error()).find(bad.field), std::string::npos)
        << "message '" << flashattn_last_error() << "' should name '" << bad.field << "'";
    for (uint8_t x : out) ASSERT_EQ(x, 0x7f) << bad.field << ": a refused call wrote its output";
  }
  EXPECT_EQ(flashattn_fp8_v_keys_permuted16(nullptr, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
}

// flashattn_fp8_quantize with x_fp8_layout keys_permuted16: the codes and scales of the rows layout, the codes
// where flashattn_fp8_v_keys_permuted16 puts them (0 at every keyless position of a row, up to L), nothing
// written between the rows (stride gaps stay poisoned); dequantize reads the layout back to the rows' values.
// Ragged key counts, block sizes that do and do not divide 16, the transform on and off, rows longer than needed.
TEST(Fp8Quantize, KeysPermuted16IsTheRowsCodesPermuted) {
  std::mt19937_64 rng(fresh_seed());
  constexpr uint8_t kNanCode = 0x7f;
  int cases = 0;
  for (int s : {1, 7, 16, 113, 799}) {
    for (int block : {1, 7, 16, 128, 1000}) {
      for (bool hadamard : {false, true}) {
        const int b = 2, h = 3, d = s == 113 ? 64 : 16, extra = s == 7 ? 48 : 0;
        const flashattn_dtype dtype = hadamard ? FLASHATTN_DTYPE_FP32 : FLASHATTN_DTYPE_BF16;
        const std::string what = "s " + std::to_string(s) + " block " + std::to_string(block) +
                                 (hadamard ? " hadamard" : "");
        SCOPED_TRACE(what);
        HostTensor x(dtype, b, s, h, d);
        x.fill_random(rng);
        // Rows, then the permute pass: the expected bytes.
        Fp8Buffer rows(b, s, h, d);
        std::vector<float> sc_rows(size_t(b * h * nblocks(s, block)), -1.f), sc_perm = sc_rows;
        flashattn_fp8_quantize_params p = fp8_params(x, rows, sc_rows, block, hadamard, 99);
        ASSERT_EQ(flashattn_fp8_quantize(&p, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
        const int64_t L = (s + 15) / 16 * 16 + extra, head = int64_t(d) * L + 32;  // a 32-byte gap after each head
        std::vector<uint8_t> expect(size_t(b * h * head), kNanCode), got = expect;
        flashattn_fp8_v_permute_params vp = flashattn_fp8_v_permute_params_init();
        vp.v = rows.view();
        vp.v_out = rows.view();
        vp.v_out.data = expect.data();
        const int64_t os[4] = {h * head, 1, head, L};
        std::memcpy(vp.v_out.stride, os, sizeof(os));
        ASSERT_EQ(flashattn_fp8_v_keys_permuted16(&vp, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
        // Quantized straight into the layout.
        p = fp8_params(x, rows, sc_perm, block, hadamard, 99);
        p.x_fp8 = vp.v_out;
        p.x_fp8.data = got.data();
        p.x_fp8_layout = FLASHATTN_FP8_V_KEYS_PERMUTED16;
        ASSERT_EQ(flashattn_fp8_quantize(&p, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
        ASSERT_EQ(sc_perm, sc_rows);
        ASSERT_EQ(got, expect);
        // Dequantized from either layout: the same values.
        HostTensor from_rows(FLASHATTN_DTYPE_FP32, b, s, h, d), from_perm(FLASHATTN_DTYPE_FP32, b, s, h, d);
        flashattn_fp8_quantize_params dq = fp8_params(from_rows, rows, sc_rows, block, hadamard, 99);
        ASSERT_EQ(flashattn_fp8_dequantize(&dq, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
        dq = fp8_params(from_perm, rows, sc_rows, block, hadamard, 99);
        dq.x_fp8 = p.x_fp8;
        dq.x_fp8_layout = FLASHATTN_FP8_V_KEYS_PERMUTED16;
        ASSERT_EQ(flashattn_fp8_dequantize(&dq, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
        for (int64_t i = 0; i < b * s * h * d; ++i) {
          const int64_t c = i % d, hh = i / d % h, ss = i / d / h % s, bb = i / d / h / s;
          const double a = from_rows.get(bb, ss, hh, c), e = from_perm.get(bb, ss, hh, c);
          ASSERT_TRUE(a == e || (std::isnan(a) && std::isnan(e))) << "(" << bb << ", " << ss << ", " << hh << ", " << c
                                                                  << "): " << e << " vs rows " << a;
        }
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 50);
}

TEST(Fp8Quantize, KeysPermuted16RefusesBadStridesByName) {
  std::mt19937_64 rng(fresh_seed());
  const int b = 2, s = 20, h = 2, d = 16;
  const int64_t L = 32;
  HostTensor x(FLASHATTN_DTYPE_BF16, b, s, h, d);
  x.fill_random(rng);
  Fp8Buffer rows(b, s, h, d);
  std::vector<float> scales(size_t(b * h), -1.f);
  std::vector<uint8_t> out(size_t(b * h * d * L), 0x7f);
  auto good = [&] {
    flashattn_fp8_quantize_params p = fp8_params(x, rows, scales, 128, false, 0);
    p.x_fp8.data = out.data();
    const int64_t os[4] = {h * d * L, 1, d * L, L};
    std::memcpy(p.x_fp8.stride, os, sizeof(os));
    p.x_fp8_layout = FLASHATTN_FP8_V_KEYS_PERMUTED16;
    return p;
  };
  struct Case { const char* field; std::function<void(flashattn_fp8_quantize_params&)> breaks; };
  const Case bads[] = {
      {"x_fp8_layout", [](auto& p) { p.x_fp8_layout = FLASHATTN_FP8_V_ROWS_AUTO; }},
      {"x_fp8_layout", [](auto& p) { p.x_fp8_layout = -1; }},
      {"x_fp8.stride[1]", [](auto& p) { p.x_fp8.stride[1] = 16; }},
      {"x_fp8.stride[3]", [](auto& p) { p.x_fp8.stride[3] = 16; }},  // < 20 rounded up to 16
      {"x_fp8.stride[3]", [](auto& p) { p.x_fp8.stride[3] = 40; }},  // not a multiple of 16
      {"x_fp8.stride[2]", [](auto& p) { p.x_fp8.stride[2] = d * L - 16; }},
      {"x_fp8.stride[0]", [](auto& p) { p.x_fp8.stride[0] = d * L; }},
      {"x_fp8.stride[3]", [](auto& p) { p.x_fp8_layout = FLASHATTN_FP8_V_ROWS; }},  // the rows layout's rule
  };
  for (int dir = 0; dir < 2; ++dir) {
    flashattn_fp8_quantize_params p = good();
    ASSERT_EQ(dir == 0 ? flashattn_fp8_quantize(&p, nullptr) : flashattn_fp8_dequantize(&p, nullptr), FLASHATTN_SUCCESS)
        << flashattn_last_error();
    for (const Case& bad : bads) {
      const std::vector<uint8_t> before = out;
      p = good();
      bad.breaks(p);
      EXPECT_EQ(dir == 0 ? flashattn_fp8_quantize(&p, nullptr) : flashattn_fp8_dequantize(&p, nullptr),
                FLASHATTN_ERROR_INVALID_ARGUMENT) << bad.field;
      const std::string msg = flashattn_last_error();
      EXPECT_EQ(msg.rfind(bad.field, 0), 0u) << "message should start with " << bad.field << ": " << msg;
      ASSERT_EQ(out, before) << bad.field << ": a refused call wrote its output";
    }
  }
}

// The GPU quantizer's index math (common/fast_div.h): every divisor's edge dividends and random ones, against '/' and
// '%', for divisors 1-4096, powers of two and their neighbours up to 2^31, and random 32-bit ones.
TEST(FastDiv, MatchesIntegerDivisionBelowTwoToThe31) {
  std::mt19937_64 rng(fresh_seed());
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int k = 12; k <= 31; ++k)
    for (int64_t dd : {-1, 0, 1}) divisors.push_back(uint32_t((int64_t(1) << k) + dd));
  for (int i = 0; i < 2000; ++i) divisors.push_back(uint32_t(rng() % 0x7fffffffu) + 1u);
  int64_t checked = 0;
  for (uint32_t d : divisors) {
    const FastDiv f = FastDiv::make(d);
    auto check = [&](uint32_t n) {
      uint32_t q = 0, r = 0;
      f.divmod(n, &q, &r);
      ASSERT_EQ(q, n / d) << "n " << n << " d " << d;
      ASSERT_EQ(r, n % d) << "n " << n << " d " << d;
      ++checked;
    };
    const uint32_t top = 0x7fffffffu;
    for (uint32_t n : {0u, 1u, d - 1, d, d + 1, top, top - 1, top - d, top / d * d, top / d * d - 1}) {
      check(n & top);
      if (HasFatalFailure()) return;
    }
    for (int i = 0; i < 64; ++i) {
      check(uint32_t(rng()) & top);
      const uint64_t m = rng() % (uint64_t(top) / d + 1);  // a multiple of d and its neighbours
      for (int64_t e : {-1, 0, 1}) {
        const int64_t n = int64_t(m * d) + e;
        if (n >= 0 && n <= int64_t(top)) check(uint32_t(n));
      }
      if (HasFatalFailure()) return;
    }
  }
  EXPECT_GT(checked, 1000000);
}

}  // namespace
}  // namespace flashattn::test
