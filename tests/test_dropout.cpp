// Dropout and ALiBi (issue 18) on the host paths: Philox4x32-10 against Random123's known
// answers, the 8-entry unit map and Dropout::make (src/common/dropout.h), the drop rate and the
// independence of streams, the fp64 oracle against a direct computation written out here and
// against finite differences, the tiled CPU path against the oracle over a grid of every option,
// the seed / offset / rng_state plumbing, and the validation of the new C ABI fields.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "api/backend.h"
#include "common/alibi.h"
#include "common/dropout.h"
#include "common/parallel.h"
#include "common/philox.h"
#include "cpu/cpu_attention.h"
#include "flashattn/flashattn.h"
#include "reference/reference.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

constexpr flashattn_dtype kBF16 = FLASHATTN_DTYPE_BF16;
constexpr flashattn_dtype kF32 = FLASHATTN_DTYPE_FP32;
constexpr flashattn_dtype kF64 = FLASHATTN_DTYPE_FP64;

// ---- Philox4x32-10 ---------------------------------------------------------------------------

// Random123's kat_vectors for philox4x32_10: counter c0..c3, key k0 k1 -> out.
TEST(Philox, Random123KnownAnswers) {
  struct Kat {
    uint32_t c[4], k[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& t : kats) {
    const Philox4 r = philox4x32_10(t.c[0], t.c[1], t.c[2], t.c[3], t.k[0], t.k[1]);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(r.x[w], t.out[w]) << "word " << w << " of counter " << std::hex << t.c[0];
  }
  // unit_bits puts (unit col, unit row, stream low, stream high) in the counter and the seed in
  // the key, low word first.
  const Philox4 u = Dropout::unit_bits(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3u, 0x243f6a88u);
  EXPECT_EQ(u.x[0], 0xd16cfe09u);
  EXPECT_EQ(u.x[3], 0x24126ea1u);
}

// ---- the unit map ----------------------------------------------------------------------------

using Triple = std::tuple<uint32_t, uint32_t, int>;
Triple unit_of(int i, int j) { return {Dropout::unit_row(i), Dropout::unit_col(j), Dropout::lane(i, j)}; }

// Within a 16 x 16 block, (unit_row, unit_col, lane) takes 256 distinct values: 32 units of 8
// lanes each, and each unit is {i0, i0 + 8} x {j0, j0 + 1, j0 + 8, j0 + 9} (i0 % 16 < 8, j0 even,
// j0 % 16 < 8) with lanes 4 * (row half) + 2 * (col half) + (col parity), as dropout.h states.
TEST(DropoutUnits, EachBlockIsOneToOneOnto32UnitsOf8Lanes) {
  std::mt19937_64 rng(fresh_seed());
  std::vector<std::pair<int, int>> origins = {{0, 0}, {16, 0}, {0, 16}, {160, 48}};
  for (int t = 0; t < 20; ++t) origins.push_back({int(rng() % (1 << 20)) * 16, int(rng() % (1 << 20)) * 16});
  for (auto [bi, bj] : origins) {
    std::set<Triple> seen;
    std::map<std::pair<uint32_t, uint32_t>, std::set<std::pair<int, int>>> units;
    for (int i = bi; i < bi + 16; ++i)
      for (int j = bj; j < bj + 16; ++j) {
        seen.insert(unit_of(i, j));
        units[{Dropout::unit_row(i), Dropout::unit_col(j)}].insert({i, j});
      }
    ASSERT_EQ(seen.size(), 256u) << "block at " << bi << "," << bj;
    ASSERT_EQ(units.size(), 32u) << "block at " << bi << "," << bj;
    for (const auto& [u, members] : units) {
      ASSERT_EQ(members.size(), 8u);
      const int i0 = members.begin()->first, j0 = members.begin()->second;
      EXPECT_LT(i0 % 16, 8);
      EXPECT_EQ(j0 % 2, 0);
      EXPECT_LT(j0 % 16, 8);
      int l = 0;
      for (int di : {0, 8})
        for (int dj : {0, 1, 8, 9}) {
          EXPECT_TRUE(members.count({i0 + di, j0 + dj})) << "unit of " << i0 << "," << j0;
          EXPECT_EQ(Dropout::lane(i0 + di, j0 + dj), l++) << i0 + di << "," << j0 + dj;
        }
    }
  }
}

// Across blocks the triples stay distinct: a 256 x 256 region (16 x 16 blocks) at the origin and
// at a large offset maps to 65536 different (unit_row, unit_col, lane).
TEST(DropoutUnits, NeighbouringBlocksNeverCollide) {
  for (int base : {0, 1 << 24}) {
    std::set<Triple> seen;
    for (int i = base; i < base + 256; ++i)
      for (int j = base; j < base + 256; ++j) seen.insert(unit_of(i, j));
    EXPECT_EQ(seen.size(), size_t(65536)) << "region at " << base;
  }
}

// ---- Dropout::make ---------------------------------------------------------------------------

TEST(DropoutMake, ThresholdsAndScale) {
  const uint64_t state[2] = {5, 6};
  const Dropout off = Dropout::make(0.f, 7, 8, nullptr);
  EXPECT_FALSE(off.enabled());
  EXPECT_EQ(off.threshold, 0u);
  EXPECT_EQ(off.scale, 1.f);
  EXPECT_FALSE(Dropout::make(NAN, 7, 8, nullptr).enabled());
  struct Want {
    float p;
    uint32_t t;
  };
  for (Want w : {Want{1e-9f, 1}, Want{1e-5f, 1}, Want{0.1f, 6554}, Want{0.3f, 19661}, Want{0.5f, 32768},
                 Want{0.9f, 58982}, Want{0.99999f, 65535}, Want{0.9999999f, 65535}}) {
    const Dropout d = Dropout::make(w.p, 11, 12, state);
    EXPECT_TRUE(d.enabled()) << w.p;
    EXPECT_EQ(d.threshold, w.t) << "p = " << w.p;
    EXPECT_EQ(d.scale, float(65536.0 / (65536.0 - double(w.t)))) << "p = " << w.p;
    EXPECT_EQ(d.effective_p(), w.t / 65536.0);
    EXPECT_EQ(d.seed, 11u);
    EXPECT_EQ(d.offset, 12u);
    EXPECT_EQ(d.rng_state, state);
    uint64_t s = 0, o = 0;
    d.resolve(&s, &o);  // rng_state wins over the fields
    EXPECT_EQ(s, 5u);
    EXPECT_EQ(o, 6u);
  }
  EXPECT_EQ(Dropout::make(0.5f, 1, 2, nullptr).scale, 2.f);
  // keep_r16: r >= threshold.
  const Dropout d = Dropout::make(0.1f, 0, 0, nullptr);
  EXPECT_FALSE(d.keep_r16(6553));
  EXPECT_TRUE(d.keep_r16(6554));
  EXPECT_TRUE(d.keep_r16(65535));
  EXPECT_FALSE(d.keep_r16(0));
}

// ---- drop rate and independence --------------------------------------------------------------

// |drops - n p| <= 5 sigma of Binomial(n, p).
::testing::AssertionResult within_5_sigma(int64_t drops, int64_t n, double p, const std::string& what) {
  const double mean = double(n) * p, sigma = std::sqrt(double(n) * p * (1 - p));
  if (std::fabs(double(drops) - mean) <= 5 * sigma) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << drops << " drops in " << n << ", expected " << mean
                                       << " +- 5 x " << sigma;
}

// Every element of a 1024 x 1024 block of one stream (1M entries): overall, per lane (each
// 16-bit half of each Philox word) and per 4 streams of (b, h) 512 x 512 each.
TEST(DropoutRate, WithinFiveSigmaOfEffectiveP) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("dropout seed " + std::to_string(seed));
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const Dropout d = Dropout::make(p, seed, 0, nullptr);
    const double pe = d.effective_p();
    int64_t drops = 0, lane_drops[8] = {}, lane_n[8] = {};
    const int n = 1024;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        const bool dropped = !d.keep(seed, 3, i, j);
        drops += dropped;
        lane_drops[Dropout::lane(i, j)] += dropped;
        ++lane_n[Dropout::lane(i, j)];
      }
    EXPECT_TRUE(within_5_sigma(drops, int64_t(n) * n, pe, "p " + std::to_string(p)));
    for (int l = 0; l < 8; ++l)
      EXPECT_TRUE(within_5_sigma(lane_drops[l], lane_n[l], pe, "p " + std::to_string(p) + " lane " + std::to_string(l)));
    // Streams of (b, h) with nheads_q = 3 and offset 17.
    for (auto [b, h] : {std::pair<int, int>{0, 0}, {0, 2}, {1, 0}, {5, 1}}) {
      const uint64_t stream = Dropout::stream(17, b, 3, h);
      int64_t sd = 0;
      for (int i = 0; i < 512; ++i)
        for (int j = 0; j < 512; ++j) sd += !d.keep(seed, stream, i, j);
      EXPECT_TRUE(within_5_sigma(sd, 512 * 512, pe,
                                 "p " + std::to_string(p) + " b " + std::to_string(b) + " h " + std::to_string(h)));
    }
  }
}

// Two masks from different streams or seeds disagree on a fraction 2p(1-p) of the entries, as
// independent masks do (within 5 sigma); the same stream and seed give the same mask.
TEST(DropoutRate, StreamsAndSeedsGiveIndependentMasks) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("dropout seed " + std::to_string(seed));
  const Dropout d = Dropout::make(0.3f, seed, 0, nullptr);
  const double pe = d.effective_p(), q = 2 * pe * (1 - pe);
  const int n = 384;
  auto mask = [&](uint64_t s, uint64_t stream) {
    std::vector<char> m(size_t(n) * n);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) m[size_t(i) * n + j] = d.keep(s, stream, i, j);
    return m;
  };
  auto differ = [&](const std::vector<char>& a, const std::vector<char>& b) {
    int64_t k = 0;
    for (size_t x = 0; x < a.size(); ++x) k += a[x] != b[x];
    return k;
  };
  const int hq = 4;
  const auto m00 = mask(seed, Dropout::stream(0, 0, hq, 0));
  EXPECT_EQ(differ(m00, mask(seed, Dropout::stream(0, 0, hq, 0))), 0) << "same seed and stream, different mask";
  const auto m01 = mask(seed, Dropout::stream(0, 0, hq, 1));        // another query head
  const auto m10 = mask(seed, Dropout::stream(0, 1, hq, 0));        // another sequence
  const auto s2 = mask(seed ^ 0x9e3779b97f4a7c15ull, Dropout::stream(0, 0, hq, 0));  // another seed
  const auto hi = mask(seed, Dropout::stream(uint64_t(1) << 32, 0, hq, 0));       // stream's high word
  EXPECT_TRUE(within_5_sigma(differ(m00, m01), int64_t(n) * n, q, "heads 0 vs 1"));
  EXPECT_TRUE(within_5_sigma(differ(m00, m10), int64_t(n) * n, q, "sequences 0 vs 1"));
  EXPECT_TRUE(within_5_sigma(differ(m01, m10), int64_t(n) * n, q, "(0, 1) vs (1, 0)"));
  EXPECT_TRUE(within_5_sigma(differ(m00, s2), int64_t(n) * n, q, "seeds"));
  EXPECT_TRUE(within_5_sigma(differ(m00, hi), int64_t(n) * n, q, "offset 2^32"));
  // The stream formula: offset + b * nheads_q + h.
  EXPECT_EQ(Dropout::stream(100, 2, hq, 3), uint64_t(100 + 2 * hq + 3));
}

// ---- the oracle against the definitions -------------------------------------------------------

// Attention with ALiBi and dropout straight from flashattn.h's top comment, in fp64, from the
// problem's (FP64) tensors: out in the problem's layout, LSE [b, h, i] flattened like p.lse.
struct Direct {
  HostTensor out;
  std::vector<double> lse;
  int64_t visible = 0, dropped = 0;
};

Direct direct_attention(const Problem& p, uint64_t seed, uint64_t offset) {
  const Case& c = p.c;
  const Dropout d = Dropout::make(c.dropout_p, 0, 0, nullptr);
  // The scale is an fp32 option (1/sqrt(d) rounded to fp32 by default).
  const double scale = c.softmax_scale > 0.f ? c.softmax_scale : 1.f / std::sqrt(float(c.d));
  const int wl = c.window_left, wr = c.causal ? 0 : c.window_right;
  Direct r;
  r.out = HostTensor(kF64, p.q.shape[0], p.q.shape[1], p.q.shape[2], p.q.shape[3]);
  r.lse.assign(p.lse.size(), NAN);
  const int group = c.hq / c.hkv;
  for (int b = 0; b < p.batch(); ++b) {
    const int sq = p.seqlen_q(b), sk = p.seqlen_k(b);
    for (int h = 0; h < c.hq; ++h) {
      const double slope = c.alibi_slopes.empty() ? 0.0 : c.alibi_slopes[size_t(b * c.alibi_batch_stride + h)];
      const uint64_t stream = offset + uint64_t(b) * uint64_t(c.hq) + uint64_t(h);
      for (int i = 0; i < sq; ++i) {
        std::vector<double> s(size_t(sk), -INFINITY);
        double m = -INFINITY;
        for (int j = 0; j < sk; ++j) {
          if (wl >= 0 && j < i + sk - sq - wl) continue;
          if (wr >= 0 && j > i + sk - sq + wr) continue;
          double x = 0;
          for (int e = 0; e < c.d; ++e)
            x += p.q.get(p.q_b(b), p.q_row(b, i), h, e) * p.k.get(p.k_b(b), p.k_row(b, j), h / group, e);
          x *= scale;
          if (c.softcap > 0.f) x = c.softcap * std::tanh(x / c.softcap);
          x += -slope * std::fabs(double(i + sk - sq - j));
          s[size_t(j)] = x;
          m = std::max(m, x);
        }
        double l = 0;
        for (int j = 0; j < sk; ++j) l += s[size_t(j)] == -INFINITY ? 0.0 : std::exp(s[size_t(j)] - m);
        r.lse[size_t(p.lse_index(b, h, i))] = l > 0 ? m + std::log(l) : -INFINITY;
        for (int e = 0; e < c.d; ++e) {
          double o = 0;
          for (int j = 0; j < sk; ++j) {
            if (s[size_t(j)] == -INFINITY) continue;
            double pij = std::exp(s[size_t(j)] - m) / l;
            if (d.enabled()) pij = d.keep(seed, stream, i, j) ? pij * double(d.scale) : 0.0;
            o += pij * p.v.get(p.k_b(b), p.k_row(b, j), h / group, e);
          }
          r.out.set(p.q_b(b), p.q_row(b, i), h, e, o);
        }
        if (d.enabled())
          for (int j = 0; j < sk; ++j)
            if (s[size_t(j)] != -INFINITY) {
              ++r.visible;
              r.dropped += !d.keep(seed, stream, i, j);
            }
      }
    }
  }
  return r;
}

// The oracle (reference backend, fp64 LSE) against direct_attention: equal to fp64 rounding.
void expect_oracle_matches_direct(const Case& c) {
  Problem p(c);
  p.seed_dropout_from_seed();
  SCOPED_TRACE(p.describe());
  std::vector<double> lse64(p.lse.size(), NAN);
  FwdParams f = p.fwd_params();
  f.lse = nullptr;
  f.lse_fp64 = lse64.data();
  ASSERT_EQ(reference::fwd(f, Rounding::kExact), FLASHATTN_SUCCESS);
  const Direct want = direct_attention(p, p.c.dropout_seed, p.c.dropout_offset);
  EXPECT_GT(want.dropped, 0);  // not vacuous: the mask removed entries...
  EXPECT_LT(want.dropped, want.visible);  // ...and kept some
  double max_err = 0, max_abs = 0;
  for (int b = 0; b < p.batch(); ++b)
    for (int i = 0; i < p.seqlen_q(b); ++i)
      for (int h = 0; h < c.hq; ++h) {
        for (int e = 0; e < c.d; ++e) {
          const double w = want.out.get(p.q_b(b), p.q_row(b, i), h, e);
          max_err = std::max(max_err, std::fabs(p.out.get(p.q_b(b), p.q_row(b, i), h, e) - w));
          max_abs = std::max(max_abs, std::fabs(w));
        }
        const double lw = want.lse[size_t(p.lse_index(b, h, i))], lo = lse64[size_t(p.lse_index(b, h, i))];
        if (lw == -INFINITY) {
          EXPECT_EQ(lo, -INFINITY) << "seq " << b << " head " << h << " row " << i;
        } else {
          EXPECT_NEAR(lo, lw, 1e-12 * std::max(1.0, std::fabs(lw))) << "seq " << b << " head " << h << " row " << i;
        }
      }
  EXPECT_GT(max_abs, 0.1);
  EXPECT_LE(max_err, 1e-12 * std::max(1.0, max_abs));
}

TEST(DropoutOracle, MatchesDirectComputation) {
  Case c;
  c.batch = 2, c.sq = 37, c.sk = 53, c.hq = 4, c.hkv = 2, c.d = 16;
  c.dtype = kF64;
  c.causal = true;
  c.softcap = 3.f;
  c.dropout_p = 0.3f;  // seed and offset: from the problem's seed
  c.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f, 0.f, 0.f, 1.f, 0.3f, 0.03f, 2.f};  // [2, 5], stride 5
  c.alibi_batch_stride = 5;
  expect_oracle_matches_direct(c);
}

TEST(DropoutOracle, MatchesDirectComputationVarlen) {
  Case c;
  c.hq = 3, c.hkv = 1, c.d = 8;
  c.dtype = kF64;
  c.seqlens_q = {20, 1, 0, 33};
  c.seqlens_k = {45, 7, 3, 18};
  c.window_left = 9, c.window_right = 4;
  c.dropout_p = 0.1f;
  c.alibi_slopes = alibi_standard_slopes(3);
  expect_oracle_matches_direct(c);
}

// ---- the oracle's backward against finite differences ------------------------------------------

// L = sum(dout * O) for a fixed mask: dL/dx by central differences against the oracle's backward,
// for every element of q, k and v.
void finite_difference_check(const Case& c) {
  Problem p(c);
  SCOPED_TRACE(p.describe());
  ASSERT_EQ(reference::fwd(p.fwd_params(), Rounding::kExact), FLASHATTN_SUCCESS);
  ASSERT_EQ(reference::bwd(p.bwd_params(), Rounding::kExact), FLASHATTN_SUCCESS);
  const HostTensor gq = p.dq, gk = p.dk, gv = p.dv;
  auto loss = [&]() {
    EXPECT_EQ(reference::fwd(p.fwd_params(), Rounding::kExact), FLASHATTN_SUCCESS);
    double l = 0;
    for (int b = 0; b < p.batch(); ++b)
      for (int i = 0; i < p.seqlen_q(b); ++i)
        for (int h = 0; h < c.hq; ++h)
          for (int x = 0; x < c.d; ++x)
            l += p.dout.get(p.q_b(b), p.q_row(b, i), h, x) * p.out.get(p.q_b(b), p.q_row(b, i), h, x);
    return l;
  };
  const double step = 1e-5;
  double max_err = 0, max_grad = 0;
  for (auto [t, g] : {std::pair<HostTensor*, const HostTensor*>{&p.q, &gq}, {&p.k, &gk}, {&p.v, &gv}})
    for (int64_t b = 0; b < t->shape[0]; ++b)
      for (int64_t s = 0; s < t->shape[1]; ++s)
        for (int64_t h = 0; h < t->shape[2]; ++h)
          for (int64_t x = 0; x < t->shape[3]; ++x) {
            const double x0 = t->get(b, s, h, x);
            t->set(b, s, h, x, x0 + step);
            const double lp = loss();
            t->set(b, s, h, x, x0 - step);
            const double lm = loss();
            t->set(b, s, h, x, x0);
            const double an = g->get(b, s, h, x);
            ASSERT_FALSE(std::isnan(an));
            max_err = std::max(max_err, std::fabs((lp - lm) / (2 * step) - an));
            max_grad = std::max(max_grad, std::fabs(an));
          }
  EXPECT_GT(max_grad, 1e-3);  // the check is not vacuous
  EXPECT_LT(max_err, 1e-7 * std::max(1.0, max_grad));
  // ... nor the mask: entries this problem sees are dropped, others kept.
  const Direct d = direct_attention(p, c.dropout_seed, c.dropout_offset);
  EXPECT_GT(d.dropped, 0);
  EXPECT_LT(d.dropped, d.visible);
}

TEST(DropoutOracleGrad, DropoutAlibiSoftcapCausal) {
  Case c;
  c.batch = 2, c.sq = 6, c.sk = 9, c.hq = 2, c.hkv = 1, c.d = 4;
  c.dtype = kF64;
  c.causal = true;
  c.softcap = 2.f;
  c.softmax_scale = 1.1f;
  c.dropout_p = 0.3f;
  c.dropout_seed = 0x1234abcd5678ef01ull;  // fixed: the mask is part of the function
  c.dropout_offset = 3;
  c.alibi_slopes = {0.7f, 0.2f, 0.05f, 1.3f};
  c.alibi_batch_stride = 2;
  finite_difference_check(c);
}

TEST(DropoutOracleGrad, VarlenGqaWindowDropoutAlibi) {
  Case c;
  c.hq = 4, c.hkv = 2, c.d = 3;
  c.dtype = kF64;
  c.seqlens_q = {5, 0, 7};
  c.seqlens_k = {8, 3, 4};
  c.window_left = 3, c.window_right = 1;
  c.dropout_p = 0.5f;
  c.dropout_seed = 42;
  c.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  finite_difference_check(c);
}

// ---- the CPU path against the oracle ----------------------------------------------------------

struct GridCase {
  std::string name;
  Case c;
};
void PrintTo(const GridCase& g, std::ostream* os) { *os << g.name << " [" << g.c.str() << "]"; }

Case make(int b, int sq, int sk, int hq, int hkv, int d, flashattn_dtype dt, float p) {
  Case c;
  c.batch = b, c.sq = sq, c.sk = sk, c.hq = hq, c.hkv = hkv, c.d = d;
  c.dtype = dt;
  c.dropout_p = p;
  c.dropout_seed = fresh_seed();
  c.dropout_offset = fresh_seed() >> 8;
  return c;
}

// Per-head slopes: the standard ones, or larger ones (0.25 .. 2: a few keys around the diagonal
// carry the row).
std::vector<float> large_slopes(int n) {
  std::vector<float> s;
  for (int h = 0; h < n; ++h) s.push_back(0.25f * float(1 + (h * 7) % 8));
  return s;
}
// [batch, stride] slopes (stride > hq: the gap is never read), mixing both kinds.
void batch_slopes(Case& c, int batch, int stride) {
  c.alibi_slopes.assign(size_t(batch) * stride, NAN);
  const auto std_s = alibi_standard_slopes(c.hq), big = large_slopes(c.hq);
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < c.hq; ++h) c.alibi_slopes[size_t(b * stride + h)] = (b + h) % 2 ? big[h] : std_s[h];
  c.alibi_batch_stride = stride;
}

std::vector<GridCase> grid() {
  std::vector<GridCase> g;
  Case c;
  c = make(2, 113, 203, 4, 2, 64, kF32, 0.1f);
  g.push_back({"Fp32Dropout", c});
  c = make(1, 203, 113, 4, 1, 64, kBF16, 0.3f), c.causal = true, c.alibi_slopes = alibi_standard_slopes(4);
  g.push_back({"Bf16DropoutAlibiCausalSqGtSkMqa", c});  // sq > sk: rows that see no key
  c = make(3, 113, 799, 2, 2, 32, kF32, 0.3f), c.window_left = 48, c.window_right = 16;
  batch_slopes(c, 3, 5);
  g.push_back({"Fp32DropoutAlibiBatchWindowSkGtSq", c});
  c = make(1, 799, 799, 6, 2, 64, kBF16, 0.1f), c.causal = true, c.softcap = 20.f;
  g.push_back({"Bf16DropoutSoftcapCausalGqa", c});
  c = make(1, 1, 1, 4, 2, 40, kF32, 0.3f), c.seqlens_q = {1, 7, 113, 799}, c.seqlens_k = {799, 113, 7, 1};
  c.causal = true;
  batch_slopes(c, 4, 4);
  g.push_back({"Fp32VarlenRaggedDropoutAlibiBatchCausal", c});
  c = make(1, 1, 1, 4, 2, 64, kBF16, 0.1f), c.seqlens_q = {799, 1, 113, 7}, c.seqlens_k = {113, 7, 799, 1};
  c.window_left = 64, c.window_right = 0, c.softcap = 10.f, c.alibi_slopes = large_slopes(4);
  g.push_back({"Bf16VarlenRaggedDropoutAlibiLocalSoftcap", c});
  c = make(2, 7, 113, 3, 3, 16, kBF16, 0.3f), c.softcap = 5.f, c.alibi_slopes = large_slopes(3);
  c.layout = Layout::kPadded;
  g.push_back({"Bf16DropoutAlibiSoftcapPadded", c});
  c = make(1, 300, 77, 2, 1, 80, kF32, 0.1f), c.window_left = 20, c.window_right = 20;
  c.alibi_slopes = alibi_standard_slopes(2), c.layout = Layout::kHeadMajor;
  g.push_back({"Fp32DropoutAlibiWindowHeadMajorD80", c});
  c = make(1, 799, 113, 2, 2, 64, kBF16, 0.3f), c.lse = true, c.input_std = 2.0;
  g.push_back({"Bf16DropoutSharpLogits", c});
  // ALiBi alone (dropout off): the bias-only branch of the tile loops.
  c = make(2, 113, 203, 4, 2, 64, kF32, 0.f), c.causal = true, c.alibi_slopes = large_slopes(4);
  g.push_back({"Fp32AlibiCausal", c});
  c = make(1, 1, 1, 2, 1, 64, kBF16, 0.f), c.seqlens_q = {113, 799, 1}, c.seqlens_k = {799, 113, 7};
  c.softcap = 15.f;
  batch_slopes(c, 3, 2);
  g.push_back({"Bf16VarlenAlibiBatchSoftcap", c});
  c = make(1, 203, 203, 2, 2, 64, kF32, 0.f), c.window_left = 32, c.window_right = 7;
  c.alibi_slopes = alibi_standard_slopes(2);
  g.push_back({"Fp32AlibiWindow", c});
  return g;
}

// Values equal (+0 == -0): the two backward schemes may differ in the sign of an exact zero.
bool values_equal(const HostTensor& a, const HostTensor& b) {
  for (int64_t x = 0; x < a.shape[0]; ++x)
    for (int64_t s = 0; s < a.shape[1]; ++s)
      for (int64_t h = 0; h < a.shape[2]; ++h)
        for (int64_t c = 0; c < a.shape[3]; ++c)
          if (!(a.get(x, s, h, c) == b.get(x, s, h, c))) return false;
  return true;
}

class DropoutCpuGrid : public ::testing::TestWithParam<GridCase> {};

TEST_P(DropoutCpuGrid, MatchesOracle) {
  Problem p(GetParam().c);
  p.seed_dropout_from_seed();
  SCOPED_TRACE(p.describe());
  ASSERT_EQ(kCpuBackend.fwd(p.fwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  const Oracle exact = run_oracle(p, Rounding::kExact, true);
  const Oracle standard = run_oracle(p, Rounding::kInputPrecision, true);
  EXPECT_TRUE(check_fwd(p, exact, standard));
  // The backward both ways (common/parallel.h's thread count picks the scheme): whole heads per
  // item with one thread, separate dK/dV and dQ passes when items < 2 x threads.
  const int items = p.batch() * p.c.hkv;
  {
    ScopedHostThreads one(1);
    ASSERT_EQ(kCpuBackend.bwd(p.bwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  }
  // Given the forward's LSE too (checked just above) where ALiBi makes |LSE| large: see
  // check_bwd's given_lse. Elsewhere the plain rule (with given_lse the yardstick, standard vs
  // exact, no longer matches the target, and fp32 dV failed ~1 run in 150 at 1.2x tolerance).
  EXPECT_TRUE(check_bwd(p, exact, standard, Rule(), /*given_lse=*/!p.c.alibi_slopes.empty()));
  const HostTensor dq = p.dq, dk = p.dk, dv = p.dv;
  for (HostTensor* t : {&p.dq, &p.dk, &p.dv}) t->fill_nan();
  {
    ScopedHostThreads many(items);
    ASSERT_EQ(kCpuBackend.bwd(p.bwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  }
  EXPECT_TRUE(values_equal(p.dq, dq) && values_equal(p.dk, dk) && values_equal(p.dv, dv))
      << "the two backward schemes differ";
}

INSTANTIATE_TEST_SUITE_P(Cpu, DropoutCpuGrid, ::testing::ValuesIn(grid()),
                         [](const ::testing::TestParamInfo<GridCase>& pi) { return pi.param.name; });

// Small random problems over every option at once, fresh each run.
TEST(DropoutCpuRandom, SmallProblemsAllOptions) {
  const uint64_t master = fresh_seed();
  SCOPED_TRACE("FLASHATTN_TEST_SEED=" + std::to_string(master) + " reproduces this test");
  std::mt19937_64 rng(master);
  const int lens[] = {1, 7, 16, 31, 65, 113, 150};
  const int dims[] = {8, 16, 40, 64};
  for (int t = 0; t < 40; ++t) {
    Case c = make(1 + int(rng() % 2), lens[rng() % 7], lens[rng() % 7], 1, 1 + int(rng() % 2), dims[rng() % 4],
                  rng() % 2 ? kF32 : kBF16, rng() % 4 == 0 ? 0.f : (rng() % 2 ? 0.1f : 0.3f));
    c.dropout_seed = rng();
    c.dropout_offset = rng() % 1000;
    c.hq = c.hkv * (1 + int(rng() % 3));
    if (rng() % 3 == 0) {
      const int n = 1 + int(rng() % 3);
      for (int s = 0; s < n; ++s) {
        c.seqlens_q.push_back(rng() % 5 == 0 ? 0 : lens[rng() % 7]);
        c.seqlens_k.push_back(rng() % 5 == 0 ? 0 : lens[rng() % 7]);
      }
    }
    const int batch = c.varlen() ? int(c.seqlens_q.size()) : c.batch;
    c.causal = rng() % 2;
    c.window_left = rng() % 3 ? -1 : int(rng() % 40);
    c.window_right = c.causal || rng() % 3 ? -1 : int(rng() % 40);
    c.softcap = rng() % 3 ? 0.f : 8.f;
    switch (rng() % 3) {
      case 0: break;
      case 1: c.alibi_slopes = rng() % 2 ? alibi_standard_slopes(c.hq) : large_slopes(c.hq); break;
      default: batch_slopes(c, batch, c.hq + int(rng() % 3)); break;
    }
    if (c.dropout_p == 0.f && c.alibi_slopes.empty()) c.dropout_p = 0.2f;
    // Not fp32 dropout where every row sees at most one key: there the exact dK is 0 and the
    // target (given the fp32 O) is O's rounding, u |dO . V|, which fp32 dP and D cannot resolve
    // below their own rounding of the same size; the rule's atol (64 u max|dK|) is then 64 u.
    // (Without dropout O = V exactly and the cpu path's D and dP round alike: dK is 0 exactly.)
    const int max_sk = c.varlen() ? *std::max_element(c.seqlens_k.begin(), c.seqlens_k.end()) : c.sk;
    if (c.dtype == kF32 && max_sk <= 1) c.dropout_p = 0.f;
    if (c.dropout_p == 0.f && c.alibi_slopes.empty()) c.alibi_slopes = alibi_standard_slopes(c.hq);
    c.layout = Layout(rng() % 3);
    Problem p(c, rng());
    SCOPED_TRACE(p.describe());
    ASSERT_EQ(kCpuBackend.fwd(p.fwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
    ASSERT_EQ(kCpuBackend.bwd(p.bwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
    const Oracle exact = run_oracle(p, Rounding::kExact, true);
    const Oracle standard = run_oracle(p, Rounding::kInputPrecision, true);
    EXPECT_TRUE(check_fwd(p, exact, standard));
    EXPECT_TRUE(check_bwd(p, exact, standard, Rule(), /*given_lse=*/true));
  }
}

// ---- seed, offset and rng_state ---------------------------------------------------------------

struct Outputs {
  HostTensor out, dq, dk, dv;
  std::vector<float> lse;
};

// Forward then backward through the C ABI on `backend`, with `edit` applied to both params.
template <class Edit>
Outputs run_abi(Problem& p, flashattn_backend backend, int threads, Edit edit) {
  p.poison_outputs();
  flashattn_fwd_params f = p.c_fwd_params(backend);
  f.options.num_threads = threads;
  edit(f);
  EXPECT_EQ(flashattn_fwd(&f, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  flashattn_bwd_params b = p.c_bwd_params(backend);
  b.options.num_threads = threads;
  edit(b);
  EXPECT_EQ(flashattn_bwd(&b, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  return Outputs{p.out, p.dq, p.dk, p.dv, p.lse};
}
Outputs run_abi(Problem& p, flashattn_backend backend, int threads = 0) {
  return run_abi(p, backend, threads, [](auto&) {});
}

bool same_bits(const Outputs& a, const Outputs& b) {
  return bitwise_equal(a.out, b.out) && bitwise_equal(a.dq, b.dq) && bitwise_equal(a.dk, b.dk) &&
         bitwise_equal(a.dv, b.dv) && std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)) == 0;
}

TEST(DropoutCpu, SameSeedIsBitwiseReproducibleAcrossThreadCounts) {
  Case c = make(1, 1, 1, 4, 2, 64, kBF16, 0.2f);
  c.seqlens_q = {300, 77, 513};
  c.seqlens_k = {200, 513, 129};
  c.causal = true;
  c.softcap = 12.f;
  batch_slopes(c, 3, 4);
  Problem p(c);
  SCOPED_TRACE(p.describe());
  const Outputs ref = run_abi(p, FLASHATTN_BACKEND_CPU, 1);
  // 6 (sequence, kv head) items: whole heads up to 3 threads, separate passes from 4 on.
  for (int threads : {2, 3, 4, 7}) EXPECT_TRUE(same_bits(run_abi(p, FLASHATTN_BACKEND_CPU, threads), ref)) << threads;
  // Another seed changes every output.
  Problem q = p;
  q.c.dropout_seed ^= 1;
  const Outputs other = run_abi(q, FLASHATTN_BACKEND_CPU, 2);
  EXPECT_FALSE(bitwise_equal(other.out, ref.out));
  EXPECT_FALSE(bitwise_equal(other.dk, ref.dk));
  EXPECT_EQ(0, std::memcmp(other.lse.data(), ref.lse.data(), ref.lse.size() * sizeof(float)))
      << "the LSE is of the undropped P: the seed must not change it";
}

// dropout_rng_state (host memory here) is read instead of dropout_seed / dropout_offset.
TEST(DropoutCpu, RngStateOverridesSeedAndOffset) {
  Case c = make(2, 77, 130, 2, 1, 32, kF32, 0.3f);
  c.causal = true;
  Problem p(c);
  SCOPED_TRACE(p.describe());
  for (flashattn_backend be : {FLASHATTN_BACKEND_CPU, FLASHATTN_BACKEND_REFERENCE}) {
    const Outputs fields = run_abi(p, be);
    const uint64_t state[2] = {c.dropout_seed, c.dropout_offset};
    const Outputs from_state = run_abi(p, be, 0, [&](auto& prm) {
      prm.dropout_seed = c.dropout_seed + 1;  // ignored
      prm.dropout_offset = c.dropout_offset + 5;
      prm.dropout_rng_state = state;
    });
    EXPECT_TRUE(same_bits(from_state, fields)) << flashattn_backend_name(be);
    const uint64_t other[2] = {c.dropout_seed + 1, c.dropout_offset};
    const Outputs from_other = run_abi(p, be, 0, [&](auto& prm) { prm.dropout_rng_state = other; });
    EXPECT_FALSE(bitwise_equal(from_other.out, fields.out)) << flashattn_backend_name(be);
  }
}

// Stream = offset + b * nheads_q + h: with the same inputs in both sequences, offset + nheads_q
// gives sequence 0 the mask sequence 1 had at the offset, so its outputs become sequence 1's.
TEST(DropoutCpu, OffsetShiftsTheStreams) {
  Case c = make(2, 130, 97, 3, 1, 32, kBF16, 0.3f);
  c.window_left = 40;
  c.alibi_slopes = alibi_standard_slopes(3);  // per head, the same for both sequences
  Problem p(c);
  SCOPED_TRACE(p.describe());
  for (HostTensor* t : {&p.q, &p.k, &p.v, &p.dout})
    for (int64_t s = 0; s < t->shape[1]; ++s)
      for (int64_t h = 0; h < t->shape[2]; ++h)
        for (int64_t x = 0; x < t->shape[3]; ++x) t->set(1, s, h, x, t->get(0, s, h, x));
  auto seq = [](const HostTensor& t, int b) {
    HostTensor r(t.dtype, 1, t.shape[1], t.shape[2], t.shape[3]);
    for (int64_t s = 0; s < t.shape[1]; ++s)
      for (int64_t h = 0; h < t.shape[2]; ++h)
        for (int64_t x = 0; x < t.shape[3]; ++x) r.set(0, s, h, x, t.get(b, s, h, x));
    return r;
  };
  for (flashattn_backend be : {FLASHATTN_BACKEND_CPU, FLASHATTN_BACKEND_REFERENCE}) {
    const Outputs base = run_abi(p, be);
    EXPECT_FALSE(bitwise_equal(seq(base.out, 0), seq(base.out, 1))) << "both sequences got the same mask";
    const Outputs shifted = run_abi(p, be, 0, [&](auto& prm) { prm.dropout_offset = c.dropout_offset + 3; });
    for (auto [a, b] : {std::pair<const HostTensor*, const HostTensor*>{&shifted.out, &base.out},
                        {&shifted.dq, &base.dq}, {&shifted.dk, &base.dk}, {&shifted.dv, &base.dv}})
      EXPECT_TRUE(bitwise_equal(seq(*a, 0), seq(*b, 1))) << flashattn_backend_name(be);
  }
}

// ---- validation through the C ABI -------------------------------------------------------------

struct AbiCase {
  Problem p;
  AbiCase() : p(make(2, 9, 11, 2, 1, 16, kF32, 0.f)) {}
};

bool untouched(const Problem& p) {
  if (p.out.count_nan() != p.out.numel() || p.dq.count_nan() != p.dq.numel()) return false;
  for (float x : p.lse)
    if (!std::isnan(x)) return false;
  return true;
}

// Both calls refuse with INVALID_ARGUMENT naming `field`, writing nothing.
template <class Edit>
void expect_refused(const std::string& field, Edit edit) {
  AbiCase a;
  flashattn_fwd_params f = a.p.c_fwd_params(FLASHATTN_BACKEND_AUTO);
  edit(f);
  EXPECT_EQ(flashattn_fwd(&f, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT) << field;
  EXPECT_NE(std::string(flashattn_last_error()).find(field), std::string::npos)
      << "'" << flashattn_last_error() << "' should name " << field;
  a.p.lse.assign(a.p.lse.size(), 0.f);  // a valid LSE, so only the field under test is wrong
  flashattn_bwd_params b = a.p.c_bwd_params(FLASHATTN_BACKEND_AUTO);
  edit(b);
  EXPECT_EQ(flashattn_bwd(&b, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT) << field;
  EXPECT_NE(std::string(flashattn_last_error()).find(field), std::string::npos)
      << "'" << flashattn_last_error() << "' should name " << field;
  a.p.lse.assign(a.p.lse.size(), NAN);
  EXPECT_TRUE(untouched(a.p)) << "a refused call wrote outputs (" << field << ")";
}

TEST(DropoutApi, BadDropoutP) {
  for (float p : {-0.1f, 1.f, NAN, 1.5f, INFINITY})
    expect_refused("options.dropout_p", [&](auto& prm) { prm.options.dropout_p = p; });
}

TEST(DropoutApi, BadAlibiBatchStride) {
  static const float slopes[8] = {0.5f, 0.25f, 0.5f, 0.25f, 0.5f, 0.25f, 0.5f, 0.25f};
  expect_refused("alibi_batch_stride", [&](auto& prm) { prm.alibi_batch_stride = 2; });  // no slopes
  expect_refused("alibi_batch_stride", [&](auto& prm) {
    prm.alibi_slopes = slopes;
    prm.alibi_batch_stride = 1;  // 0 < stride < nheads_q = 2
  });
  expect_refused("alibi_batch_stride", [&](auto& prm) {
    prm.alibi_slopes = slopes;
    prm.alibi_batch_stride = -2;
  });
}

TEST(DropoutApi, RngStateWithoutDropout) {
  static const uint64_t state[2] = {1, 2};
  expect_refused("dropout_rng_state", [&](auto& prm) { prm.dropout_rng_state = state; });
}

// A caller built against the header before the dropout/ALiBi fields passes struct_size =
// offsetof(dropout_seed): the library reads none of them (poisoned here: read, the slopes would
// give NaN and the stride be refused), so no ALiBi, seed 0 and offset 0.
TEST(DropoutApi, OldStructSizeMeansNoAlibiAndSeedZero) {
  static const float nan_slopes[4] = {NAN, NAN, NAN, NAN};
  static const uint64_t state[2] = {99, 99};
  for (float p : {0.f, 0.2f}) {
    AbiCase a;
    a.p.c.dropout_p = p;
    a.p.c.dropout_seed = 0;
    a.p.c.dropout_offset = 0;
    const Outputs want = run_abi(a.p, FLASHATTN_BACKEND_CPU);
    const Outputs old = run_abi(a.p, FLASHATTN_BACKEND_CPU, 0, [&](auto& prm) {
      using P = std::remove_reference_t<decltype(prm)>;
      prm.struct_size = uint32_t(offsetof(P, dropout_seed));
      prm.dropout_seed = 12345;
      prm.dropout_offset = 678;
      prm.dropout_rng_state = p > 0.f ? state : nullptr;
      prm.alibi_slopes = nan_slopes;
      prm.alibi_batch_stride = 1;
    });
    EXPECT_TRUE(same_bits(old, want)) << "dropout_p " << p;
    EXPECT_EQ(old.out.count_nan(), 0);
  }
}

// The new options run on the host backends through the ABI and match the oracle there.
TEST(DropoutApi, HostBackendsRunDropoutAndAlibi) {
  Case c = make(2, 65, 80, 2, 2, 32, kF32, 0.2f);
  c.causal = true;
  batch_slopes(c, 2, 3);
  Problem p(c);
  SCOPED_TRACE(p.describe());
  const Oracle exact = run_oracle(p, Rounding::kExact, true);
  const Oracle standard = run_oracle(p, Rounding::kInputPrecision, true);
  for (flashattn_backend be : {FLASHATTN_BACKEND_AUTO, FLASHATTN_BACKEND_CPU, FLASHATTN_BACKEND_REFERENCE}) {
    run_abi(p, be);
    EXPECT_TRUE(check_fwd(p, exact, standard)) << flashattn_backend_name(be);
    EXPECT_TRUE(check_bwd(p, exact, standard, Rule(), /*given_lse=*/true)) << flashattn_backend_name(be);
  }
}

}  // namespace
}  // namespace flashattn::test
