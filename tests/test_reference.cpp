// The oracle against things that do not depend on it: hand-computed attention, closed forms
// (uniform keys, masked rows, softcap), identities (GQA = repeated K/V, varlen = separate
// sequences), and gradients against central finite differences in FP64.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/half_convert.h"
#include "reference/reference.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

constexpr flashattn_dtype kF64 = FLASHATTN_DTYPE_FP64;

// Runs the exact oracle forward (and backward) on p's own tensors.
void oracle_fwd(Problem& p) { ASSERT_EQ(reference::fwd(p.fwd_params(), Rounding::kExact), FLASHATTN_SUCCESS); }
void oracle_bwd(Problem& p) { ASSERT_EQ(reference::bwd(p.bwd_params(), Rounding::kExact), FLASHATTN_SUCCESS); }

// The visibility rule exactly as include/flashattn/flashattn.h states it.
bool header_allows(int i, int j, int sq, int sk, int wl, int wr) {
  if (j < 0 || j >= sk) return false;
  if (wl >= 0 && j < i + (sk - sq) - wl) return false;
  if (wr >= 0 && j > i + (sk - sq) + wr) return false;
  return true;
}

// A 2 x 3 problem, d = 1, scale 1: q = [1, 2], k = [0, ln 2, ln 3], v = [6, 12, 18], so
// exp(q_i k_j) = [1, 2, 3] and [1, 4, 9].
Problem hand_problem(flashattn_dtype dtype, bool causal, int wl, int wr) {
  Case c;
  c.batch = 1, c.sq = 2, c.sk = 3, c.hq = 1, c.hkv = 1, c.d = 1;
  c.dtype = dtype;
  c.causal = causal;
  c.window_left = wl;
  c.window_right = wr;
  c.softmax_scale = 1.f;
  Problem p(c, 1);
  p.q.set(0, 0, 0, 0, 1.0);
  p.q.set(0, 1, 0, 0, 2.0);
  const double kv[3][2] = {{0.0, 6.0}, {std::log(2.0), 12.0}, {std::log(3.0), 18.0}};
  for (int j = 0; j < 3; ++j) {
    p.k.set(0, j, 0, 0, kv[j][0]);
    p.v.set(0, j, 0, 0, kv[j][1]);
  }
  return p;
}

TEST(Reference, HandComputed2x3) {
  struct Expect {
    bool causal;
    int wl, wr;
    double o0, lse0, o1, lse1;
  };
  const Expect cases[] = {
      {false, -1, -1, (6 + 24 + 54) / 6.0, std::log(6.0), (6 + 48 + 162) / 14.0, std::log(14.0)},
      // Bottom-right causal: row 0 sees keys 0, 1; row 1 sees all three.
      {true, -1, -1, (6 + 24) / 3.0, std::log(3.0), (6 + 48 + 162) / 14.0, std::log(14.0)},
      // Window (0, 0): each row sees its diagonal key only (keys 1 and 2).
      {false, 0, 0, 12.0, std::log(2.0), 18.0, 2 * std::log(3.0)},
      // Window (1, -1): j >= i + 1 - 1, so row 0 sees keys 0-2 and row 1 keys 1-2.
      {false, 1, -1, (6 + 24 + 54) / 6.0, std::log(6.0), (48 + 162) / 13.0, std::log(13.0)},
  };
  for (const Expect& e : cases) {
    for (flashattn_dtype dt : {kF64, FLASHATTN_DTYPE_FP32}) {
      Problem p = hand_problem(dt, e.causal, e.wl, e.wr);
      oracle_fwd(p);
      const double tol = dt == kF64 ? 1e-12 : 1e-5;
      SCOPED_TRACE(p.describe());
      EXPECT_NEAR(p.out.get(0, 0, 0, 0), e.o0, tol * 20);
      EXPECT_NEAR(p.out.get(0, 1, 0, 0), e.o1, tol * 20);
      EXPECT_NEAR(p.lse[0], e.lse0, 1e-6);
      EXPECT_NEAR(p.lse[1], e.lse1, 1e-6);
    }
  }
}

// Identical keys: P is uniform over the visible keys, so O is the mean of their V and
// LSE = score + log(count), for any mask.
TEST(Reference, UniformKeysGiveMaskedMeans) {
  std::mt19937_64 rng(fresh_seed());
  for (int trial = 0; trial < 40; ++trial) {
    Case c;
    c.batch = 2;
    c.sq = 1 + int(rng() % 9);
    c.sk = 1 + int(rng() % 9);
    c.hq = 2, c.hkv = 1, c.d = 3;
    c.dtype = kF64;
    c.causal = rng() % 3 == 0;
    c.window_left = int(rng() % 5) - 1;
    c.window_right = c.causal ? -1 : int(rng() % 5) - 1;
    Problem p(c);
    for (int b = 0; b < c.batch; ++b)
      for (int j = 0; j < c.sk; ++j)
        for (int x = 0; x < c.d; ++x) p.k.set(b, j, 0, x, p.k.get(b, 0, 0, x));
    oracle_fwd(p);
    const int wr = c.causal ? 0 : c.window_right;
    for (int b = 0; b < c.batch; ++b)
      for (int h = 0; h < c.hq; ++h)
        for (int i = 0; i < c.sq; ++i) {
          SCOPED_TRACE(p.describe() + " row " + std::to_string(i));
          int n = 0;
          std::vector<double> mean(size_t(c.d), 0.0);
          for (int j = 0; j < c.sk; ++j)
            if (header_allows(i, j, c.sq, c.sk, c.window_left, wr)) {
              ++n;
              for (int x = 0; x < c.d; ++x) mean[x] += p.v.get(b, j, 0, x);
            }
          double s = 0;
          for (int x = 0; x < c.d; ++x) s += p.q.get(b, i, h, x) * p.k.get(b, 0, 0, x);
          s *= double(1.f / std::sqrt(float(c.d)));  // the default scale, computed in fp32
          const float lse = p.lse[size_t(p.lse_index(b, h, i))];
          if (n == 0) {
            EXPECT_EQ(lse, -INFINITY);
            for (int x = 0; x < c.d; ++x) EXPECT_EQ(p.out.get(b, i, h, x), 0.0);
            continue;
          }
          EXPECT_NEAR(lse, s + std::log(double(n)), 1e-5 * (1 + std::fabs(s)));
          for (int x = 0; x < c.d; ++x) EXPECT_NEAR(p.out.get(b, i, h, x), mean[x] / n, 1e-12);
        }
  }
}

TEST(Reference, FullyMaskedRowsAreZeroWithoutNaN) {
  // Causal with sq > sk: rows 0..sq-sk-1 see nothing.
  Case c;
  c.batch = 2, c.sq = 9, c.sk = 4, c.hq = 2, c.hkv = 2, c.d = 8;
  c.dtype = kF64;
  c.causal = true;
  Problem p(c);
  oracle_fwd(p);
  oracle_bwd(p);
  EXPECT_EQ(p.out.count_nan() + p.dq.count_nan() + p.dk.count_nan() + p.dv.count_nan(), 0);
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < c.sq; ++i) {
        const bool empty = i < c.sq - c.sk;
        EXPECT_EQ(p.lse[size_t(p.lse_index(b, h, i))] == -INFINITY, empty) << i;
        for (int x = 0; x < c.d; ++x) {
          if (empty) {
            EXPECT_EQ(p.out.get(b, i, h, x), 0.0);
            EXPECT_EQ(p.dq.get(b, i, h, x), 0.0);
          } else {
            EXPECT_NE(p.out.get(b, i, h, x), 0.0);
          }
        }
      }
}

// One query, two keys, d = 1: S_j = cap * tanh(scale * q k_j / cap) by hand.
TEST(Reference, SoftcapClosedForm) {
  Case c;
  c.batch = 1, c.sq = 1, c.sk = 2, c.hq = 1, c.hkv = 1, c.d = 1;
  c.dtype = kF64;
  c.softmax_scale = 0.5f;
  c.softcap = 3.f;
  Problem p(c, 7);
  p.q.set(0, 0, 0, 0, 4.0);
  p.k.set(0, 0, 0, 0, 2.0);
  p.k.set(0, 1, 0, 0, -1.5);
  p.v.set(0, 0, 0, 0, 1.0);
  p.v.set(0, 1, 0, 0, -2.0);
  oracle_fwd(p);
  const double s0 = 3.0 * std::tanh(0.5 * 8.0 / 3.0), s1 = 3.0 * std::tanh(0.5 * -6.0 / 3.0);
  const double e0 = std::exp(s0), e1 = std::exp(s1);
  EXPECT_NEAR(p.out.get(0, 0, 0, 0), (e0 * 1.0 + e1 * -2.0) / (e0 + e1), 1e-14);
  EXPECT_NEAR(p.lse[0], std::log(e0 + e1), 1e-6);
}

// GQA is MHA with each kv head repeated over its group; dK/dV sum over the group.
TEST(Reference, GqaEqualsRepeatedKv) {
  Case g;
  g.batch = 2, g.sq = 6, g.sk = 11, g.hq = 6, g.hkv = 2, g.d = 5;
  g.dtype = kF64;
  g.causal = true;
  g.softcap = 4.f;
  Problem pg(g);
  Case m = g;
  m.hkv = g.hq;
  Problem pm(m);
  pm.q = pg.q;
  pm.dout = pg.dout;
  for (int b = 0; b < g.batch; ++b)
    for (int j = 0; j < g.sk; ++j)
      for (int h = 0; h < g.hq; ++h)
        for (int x = 0; x < g.d; ++x) {
          pm.k.set(b, j, h, x, pg.k.get(b, j, h / 3, x));
          pm.v.set(b, j, h, x, pg.v.get(b, j, h / 3, x));
        }
  oracle_fwd(pg);
  oracle_bwd(pg);
  oracle_fwd(pm);
  oracle_bwd(pm);
  for (int b = 0; b < g.batch; ++b) {
    for (int i = 0; i < g.sq; ++i)
      for (int h = 0; h < g.hq; ++h)
        for (int x = 0; x < g.d; ++x) {
          EXPECT_NEAR(pg.out.get(b, i, h, x), pm.out.get(b, i, h, x), 1e-13);
          EXPECT_NEAR(pg.dq.get(b, i, h, x), pm.dq.get(b, i, h, x), 1e-13);
        }
    for (int j = 0; j < g.sk; ++j)
      for (int kh = 0; kh < g.hkv; ++kh)
        for (int x = 0; x < g.d; ++x) {
          double dk = 0, dv = 0;
          for (int h = kh * 3; h < kh * 3 + 3; ++h) {
            dk += pm.dk.get(b, j, h, x);
            dv += pm.dv.get(b, j, h, x);
          }
          EXPECT_NEAR(pg.dk.get(b, j, kh, x), dk, 1e-13);
          EXPECT_NEAR(pg.dv.get(b, j, kh, x), dv, 1e-13);
        }
  }
}

// Varlen is the same as running each sequence on its own (empty sequences included).
TEST(Reference, VarlenEqualsSeparateSequences) {
  Case v;
  v.seqlens_q = {3, 0, 7, 5, 2};
  v.seqlens_k = {4, 3, 7, 0, 9};
  v.hq = 4, v.hkv = 2, v.d = 6;
  v.dtype = kF64;
  v.causal = true;
  v.window_left = 3;
  Problem pv(v);
  oracle_fwd(pv);
  oracle_bwd(pv);
  for (size_t s = 0; s < v.seqlens_q.size(); ++s) {
    Case f = v;
    f.seqlens_q.clear();
    f.seqlens_k.clear();
    f.batch = 1;
    f.sq = v.seqlens_q[s];
    f.sk = v.seqlens_k[s];
    Problem pf(f);
    const int b = int(s);
    auto copy_rows = [&](HostTensor& dst, const HostTensor& src, int rows, bool key) {
      for (int i = 0; i < rows; ++i)
        for (int h = 0; h < dst.shape[2]; ++h)
          for (int x = 0; x < f.d; ++x)
            dst.set(0, i, h, x, src.get(0, key ? pv.k_row(b, i) : pv.q_row(b, i), h, x));
    };
    copy_rows(pf.q, pv.q, f.sq, false);
    copy_rows(pf.dout, pv.dout, f.sq, false);
    copy_rows(pf.k, pv.k, f.sk, true);
    copy_rows(pf.v, pv.v, f.sk, true);
    oracle_fwd(pf);
    oracle_bwd(pf);
    for (int i = 0; i < f.sq; ++i)
      for (int h = 0; h < f.hq; ++h) {
        EXPECT_EQ(pf.lse[size_t(pf.lse_index(0, h, i))], pv.lse[size_t(pv.lse_index(b, h, i))]);
        for (int x = 0; x < f.d; ++x) {
          EXPECT_EQ(pf.out.get(0, i, h, x), pv.out.get(0, pv.q_row(b, i), h, x));
          EXPECT_EQ(pf.dq.get(0, i, h, x), pv.dq.get(0, pv.q_row(b, i), h, x));
        }
      }
    for (int j = 0; j < f.sk; ++j)
      for (int h = 0; h < f.hkv; ++h)
        for (int x = 0; x < f.d; ++x) {
          EXPECT_EQ(pf.dk.get(0, j, h, x), pv.dk.get(0, pv.k_row(b, j), h, x));
          EXPECT_EQ(pf.dv.get(0, j, h, x), pv.dv.get(0, pv.k_row(b, j), h, x));
        }
  }
}

// L = sum(dout * O): dL/dx by central differences against the oracle's backward, for every
// element of q, k and v.
void finite_difference_check(const Case& c) {
  Problem p(c);
  SCOPED_TRACE(p.describe());
  oracle_fwd(p);
  oracle_bwd(p);
  HostTensor gq = p.dq, gk = p.dk, gv = p.dv;
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
  int checked = 0;
  for (auto [t, g] : {std::pair<HostTensor*, HostTensor*>{&p.q, &gq}, {&p.k, &gk}, {&p.v, &gv}}) {
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
            const double fd = (lp - lm) / (2 * step);
            const double an = g->get(b, s, h, x);
            ASSERT_FALSE(std::isnan(an));
            max_err = std::max(max_err, std::fabs(fd - an));
            max_grad = std::max(max_grad, std::fabs(an));
            ++checked;
          }
  }
  EXPECT_GT(max_grad, 1e-3);  // the check is not vacuous
  EXPECT_LT(max_err, 1e-7 * std::max(1.0, max_grad)) << "max |fd - analytic| over " << checked << " elements";
}

Case fd_case() {
  Case c;
  c.batch = 2, c.sq = 5, c.sk = 7, c.hq = 2, c.hkv = 1, c.d = 4;
  c.dtype = kF64;
  return c;
}

TEST(ReferenceGrad, Plain) { finite_difference_check(fd_case()); }

TEST(ReferenceGrad, CausalSqGreaterThanSk) {
  Case c = fd_case();
  c.sq = 8, c.sk = 5;
  c.causal = true;
  finite_difference_check(c);
}

TEST(ReferenceGrad, SlidingWindow) {
  Case c = fd_case();
  c.window_left = 2, c.window_right = 1;
  finite_difference_check(c);
}

TEST(ReferenceGrad, Softcap) {
  Case c = fd_case();
  c.softcap = 1.5f;  // small cap and large scale: deep in tanh's curved region
  c.softmax_scale = 1.3f;
  c.input_std = 1.5;
  finite_difference_check(c);
}

TEST(ReferenceGrad, GqaWithSoftcapAndCausal) {
  Case c = fd_case();
  c.hq = 4, c.hkv = 2;
  c.causal = true;
  c.softcap = 2.f;
  finite_difference_check(c);
}

TEST(ReferenceGrad, VarlenWithWindow) {
  Case c = fd_case();
  c.seqlens_q = {3, 0, 4, 2};
  c.seqlens_k = {5, 2, 3, 0};
  c.window_left = 1;
  c.causal = true;
  finite_difference_check(c);
}

// The yardstick: at FP64 precision the "standard" result is the exact one; at fp16 it is not.
TEST(Reference, InputPrecisionRoundsAtTheInputPrecision) {
  Case c;
  c.sq = 33, c.sk = 47, c.hq = 2, c.hkv = 1, c.d = 16;
  c.softcap = 10.f;
  c.dtype = FLASHATTN_DTYPE_FP16;
  Problem p(c);
  Oracle e = run_oracle(p, Rounding::kExact, true);
  Oracle s = run_oracle(p, Rounding::kInputPrecision, true);
  double diff = 0, scale = 0;
  for (int i = 0; i < c.sq; ++i)
    for (int x = 0; x < c.d; ++x) {
      diff = std::max(diff, std::fabs(e.out.get(0, i, 0, x) - s.out.get(0, i, 0, x)));
      scale = std::max(scale, std::fabs(e.out.get(0, i, 0, x)));
      // The unfused fp16 result is representable in fp16.
      EXPECT_EQ(s.out.get(0, i, 0, x), round_to(FLASHATTN_DTYPE_FP16, s.out.get(0, i, 0, x)));
      EXPECT_EQ(s.dq.get(0, i, 0, x), round_to(FLASHATTN_DTYPE_FP16, s.dq.get(0, i, 0, x)));
    }
  EXPECT_GT(diff, 0.1 * unit_roundoff(c.dtype) * scale);
  EXPECT_LT(diff, 64 * unit_roundoff(c.dtype) * std::max(1.0, scale));

  // FP64: the unfused computation at fp64 agrees with the oracle to fp64 rounding.
  Case c64 = c;
  c64.dtype = kF64;
  Problem p64(c64);
  Oracle e64 = run_oracle(p64, Rounding::kExact, true);
  Oracle s64 = run_oracle(p64, Rounding::kInputPrecision, true);
  for (int i = 0; i < c.sk; ++i)
    for (int x = 0; x < c.d; ++x) {
      EXPECT_NEAR(e64.dk.get(0, i, 0, x), s64.dk.get(0, i, 0, x), 1e-13);
      EXPECT_NEAR(e64.dv.get(0, i, 0, x), s64.dv.get(0, i, 0, x), 1e-13);
    }
  for (int i = 0; i < c.sq; ++i)
    for (int x = 0; x < c.d; ++x) EXPECT_NEAR(e64.out.get(0, i, 1, x), s64.out.get(0, i, 1, x), 1e-14);
}

// The rule itself must be able to fail: a perturbed element, a NaN, a write into padding.
TEST(CheckRule, CanFail) {
  Case c;
  c.sq = 20, c.sk = 30, c.hq = 2, c.hkv = 2, c.d = 16;
  c.layout = Layout::kPadded;
  Problem p(c);
  Oracle e = run_oracle(p, Rounding::kExact, false);
  Oracle s = run_oracle(p, Rounding::kInputPrecision, false);
  auto fill_from = [&](const HostTensor& src) {
    for (int i = 0; i < c.sq; ++i)
      for (int h = 0; h < c.hq; ++h)
        for (int x = 0; x < c.d; ++x) p.out.set(0, i, h, x, src.get(0, i, h, x));
    p.lse = e.lse;
  };
  fill_from(e.out);
  EXPECT_TRUE(check_fwd(p, e, s));
  fill_from(s.out);  // the standard result itself passes
  EXPECT_TRUE(check_fwd(p, e, s));
  fill_from(e.out);
  p.out.set(0, 7, 1, 3, p.out.get(0, 7, 1, 3) + 0.05);
  EXPECT_FALSE(check_fwd(p, e, s));
  fill_from(e.out);
  p.out.set(0, 19, 0, 15, NAN);
  EXPECT_FALSE(check_fwd(p, e, s));
  fill_from(e.out);
  p.lse[5] += 0.1f;
  EXPECT_FALSE(check_fwd(p, e, s));
  fill_from(e.out);
  p.out.bytes[p.out.index(0, 3, 0, 16) * 2] = 0;  // first padding element after head 0 of row 3
  p.out.bytes[p.out.index(0, 3, 0, 16) * 2 + 1] = 0;
  EXPECT_FALSE(check_fwd(p, e, s));
}

TEST(HalfConvert, RoundTripAndRounding) {
  // Every fp16 / bf16 bit pattern survives float and back (NaNs stay NaN).
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = half_to_float(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(half_to_float(float_to_half(f))));
    } else {
      ASSERT_EQ(float_to_half(f), h) << h;
    }
    const float g = bf16_to_float(uint16_t(h));
    if (!std::isnan(g)) {
      ASSERT_EQ(float_to_bf16(g), h) << h;
    }
  }
  // Round to nearest even, overflow, subnormals.
  EXPECT_EQ(half_to_float(float_to_half(1.f + std::ldexp(1.f, -11))), 1.f);  // tie -> even
  EXPECT_EQ(half_to_float(float_to_half(1.f + 3 * std::ldexp(1.f, -11))), 1.f + std::ldexp(1.f, -9));
  EXPECT_EQ(half_to_float(float_to_half(65519.f)), 65504.f);
  EXPECT_EQ(half_to_float(float_to_half(65520.f)), INFINITY);
  EXPECT_EQ(half_to_float(float_to_half(std::ldexp(1.f, -24))), std::ldexp(1.f, -24));
  EXPECT_EQ(half_to_float(float_to_half(std::ldexp(1.f, -25))), 0.f);
  EXPECT_EQ(half_to_float(float_to_half(std::ldexp(1.5f, -25))), std::ldexp(1.f, -24));
  EXPECT_EQ(half_to_float(float_to_half(-std::ldexp(3.f, -25))), -std::ldexp(2.f, -24));  // 1.5 ulp -> 2
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.f + std::ldexp(1.f, -8))), 1.f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.f + 3 * std::ldexp(1.f, -8))), 1.f + std::ldexp(1.f, -6));
  EXPECT_EQ(bf16_to_float(float_to_bf16(3.4e38f)), INFINITY);
  // Every float to fp16 agrees with a double-based rounding on a sweep.
  std::mt19937 rng(3);
  for (int n = 0; n < 200000; ++n) {
    uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f) || std::fabs(f) > 65000.f) continue;
    const float r = half_to_float(float_to_half(f));
    const double err = std::fabs(double(r) - double(f));
    const double ulp = std::ldexp(1.0, std::max(-24, std::ilogb(std::fabs(f) > 0 ? f : 1e-30f) - 10));
    ASSERT_LE(err, ulp / 2 * (1 + 1e-12)) << f;
  }
}

}  // namespace
}  // namespace flashattn::test
