// flashattn_combine (issue 17 item 3): merging partial attention results over key ranges.
// Random problems split into 1..4 ragged key ranges (empty ones included), each range run by the
// reference backend's forward, combined, and checked against the fp64 oracle of the full problem
// with the usual rule (2x standard attention's error + atol); hand-made rows with -inf LSEs
// (O = 0, LSE = -inf, partial outputs of empty splits never read), NaN-poisoned outputs, strided
// stacked layouts, fp64 LSEs, thread-count determinism, validation errors by field name, and the
// CUDA path's refusals (its kernel's results are checked in tests/gpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/half_convert.h"
#include "flashattn/flashattn.h"
#include "test_util.h"

namespace flashattn::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A stacked [S, b, s, h, d] buffer of `dtype`, contiguous unless strides are given.
struct Stacked {
  flashattn_dtype dtype;
  int64_t shape[5];
  int64_t stride[5];
  std::vector<unsigned char> bytes;
  Stacked(flashattn_dtype dt, int64_t S, int64_t b, int64_t s, int64_t h, int64_t d) : dtype(dt) {
    const int64_t sh[5] = {S, b, s, h, d};
    std::memcpy(shape, sh, sizeof(shape));
    stride[4] = 1;
    for (int i = 3; i >= 0; --i) stride[i] = stride[i + 1] * shape[i + 1];
    bytes.assign(size_t(std::max<int64_t>(1, S * stride[0])) * dtype_bytes(dt), 0);
  }
  int64_t idx(int64_t sp, int64_t b, int64_t s, int64_t h, int64_t c) const {
    return sp * stride[0] + b * stride[1] + s * stride[2] + h * stride[3] + c;
  }
  double get(int64_t sp, int64_t b, int64_t s, int64_t h, int64_t c) const {
    return load_double(bytes.data(), dtype, idx(sp, b, s, h, c));
  }
  void set(int64_t sp, int64_t b, int64_t s, int64_t h, int64_t c, double v) {
    store_double(bytes.data(), dtype, idx(sp, b, s, h, c), v);
  }
  flashattn_tensor split_view(int64_t sp) {
    flashattn_tensor t;
    t.data = bytes.data() + size_t(sp * stride[0]) * dtype_bytes(dtype);
    for (int i = 0; i < 4; ++i) {
      t.shape[i] = shape[i + 1];
      t.stride[i] = stride[i + 1];
    }
    return t;
  }
};

flashattn_combine_params combine_params(const Stacked& o, const float* lse_partial, const int64_t lse_stride[4],
                                        HostTensor& out, float* lse) {
  flashattn_combine_params c = flashattn_combine_params_init();
  c.dtype = o.dtype;
  c.num_splits = int32_t(o.shape[0]);
  c.out_partial = o.bytes.data();
  std::memcpy(c.out_partial_shape, o.shape, sizeof(o.shape));
  std::memcpy(c.out_partial_stride, o.stride, sizeof(o.stride));
  c.lse_partial = lse_partial;
  std::memcpy(c.lse_partial_stride, lse_stride, 4 * sizeof(int64_t));
  c.out = out.view();
  c.lse = lse;
  return c;
}

// Key range boundaries: S ragged ranges covering [0, sk), at least one empty when S >= 2 and
// `with_empty`.
std::vector<int> split_points(std::mt19937_64& rng, int sk, int S, bool with_empty) {
  std::vector<int> cut(size_t(S + 1));
  cut[0] = 0;
  cut[size_t(S)] = sk;
  for (int i = 1; i < S; ++i) cut[size_t(i)] = int(rng() % uint64_t(sk + 1));
  std::sort(cut.begin(), cut.end());
  if (with_empty && S >= 2) {
    int e = 1 + int(rng() % uint64_t(S - 1));  // make range e-1 or e empty
    cut[size_t(e)] = cut[size_t(e - 1)];
  }
  return cut;
}

// The partial outputs and LSEs of problem p over the key ranges `cut`, from the reference
// backend's forward on K/V slices (non-causal: a slice's bottom-right alignment would differ).
void run_splits(Problem& p, const std::vector<int>& cut, Stacked& o, std::vector<float>& lse) {
  const int S = int(cut.size()) - 1;
  const int64_t rows = int64_t(p.c.batch) * p.c.hq * p.c.sq;
  lse.assign(size_t(S * rows), NAN);
  const size_t es = dtype_bytes(p.c.dtype);
  for (int s = 0; s < S; ++s) {
    flashattn_fwd_params f = p.c_fwd_params(FLASHATTN_BACKEND_REFERENCE);
    for (flashattn_tensor* t : {&f.k, &f.v}) {
      t->data = static_cast<unsigned char*>(t->data) + size_t(cut[size_t(s)] * t->stride[1]) * es;
      t->shape[1] = cut[size_t(s) + 1] - cut[size_t(s)];
    }
    f.out = o.split_view(s);
    f.lse = lse.data() + s * rows;
    ASSERT_EQ(flashattn_fwd(&f, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  }
}

TEST(Combine, RandomSplitsMatchTheFullForward) {
  const uint64_t master = fresh_seed();
  std::mt19937_64 rng(master);
  const flashattn_dtype dtypes[] = {FLASHATTN_DTYPE_FP16, FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP32,
                                    FLASHATTN_DTYPE_FP64};
  int n = 0;
  for (flashattn_dtype dt : dtypes) {
    for (int S = 1; S <= 4; ++S) {
      for (int rep = 0; rep < 3; ++rep, ++n) {
        Case c;
        c.dtype = dt;
        c.batch = 1 + int(rng() % 2);
        c.sq = 1 + int(rng() % 40);
        c.sk = 1 + int(rng() % 120);
        c.hkv = 1 + int(rng() % 2);
        c.hq = c.hkv * (1 + int(rng() % 2));
        const int ds[] = {16, 40, 64};
        c.d = ds[rng() % 3];
        c.layout = rep == 1 ? Layout::kPadded : rep == 2 ? Layout::kHeadMajor : Layout::kContiguous;
        Problem p(c, rng());
        const std::vector<int> cut = split_points(rng, c.sk, S, rep != 0);
        Stacked o(dt, S, c.batch, c.sq, c.hq, c.d);
        std::vector<float> lse_partial;
        run_splits(p, cut, o, lse_partial);
        if (HasFatalFailure()) return;
        p.poison_outputs();
        const int64_t ls[4] = {int64_t(c.batch) * c.hq * c.sq, int64_t(c.hq) * c.sq, c.sq, 1};
        flashattn_combine_params cp = combine_params(o, lse_partial.data(), ls, p.out, p.lse.data());
        ASSERT_EQ(flashattn_combine(&cp, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
        Oracle exact = run_oracle(p, Rounding::kExact, false);
        Oracle standard = run_oracle(p, Rounding::kInputPrecision, false);
        EXPECT_TRUE(check_fwd(p, exact, standard)) << S << " splits at " << ::testing::PrintToString(cut)
                                                   << ", master seed " << master;
      }
    }
  }
  EXPECT_EQ(n, 48);
}

// Rows that see no key in some splits (LSE_s = -inf, O_s NaN: must not be read) and rows that see
// none at all (O = 0, LSE = -inf), against a direct fp64 computation.
TEST(Combine, MinusInfRowsAndNaNPoisonedEmptySplits) {
  std::mt19937_64 rng(fresh_seed());
  for (flashattn_dtype dt : {FLASHATTN_DTYPE_FP32, FLASHATTN_DTYPE_BF16, FLASHATTN_DTYPE_FP64}) {
    const int S = 3, B = 2, Sq = 5, H = 3, D = 8;
    Stacked o(dt, S, B, Sq, H, D);
    std::vector<float> lse(size_t(S * B * H * Sq));
    const int64_t ls[4] = {B * H * Sq, H * Sq, Sq, 1};
    std::normal_distribution<double> N(0.0, 1.0);
    for (int s = 0; s < S; ++s)
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
          for (int i = 0; i < Sq; ++i) {
            // Row pattern by i: 0 all -inf; 1 only split 0 finite; 2 only split 2; 3 all finite;
            // 4 splits 0 and 2 finite with a wide gap (|dLSE| = 80).
            bool finite = i == 3 || (i == 1 && s == 0) || (i == 2 && s == 2) || (i == 4 && s != 1);
            double l = finite ? (i == 4 ? (s == 0 ? 40.0 : -40.0) : N(rng)) : -kInf;
            lse[size_t(s * ls[0] + b * ls[1] + h * ls[2] + i)] = float(l);
            for (int c = 0; c < D; ++c) o.set(s, b, i, h, c, finite ? N(rng) : NAN);
          }
    HostTensor out(dt, B, Sq, H, D, Layout::kPadded);
    out.fill_nan();
    std::vector<float> lse_out(size_t(B * H * Sq), NAN);
    flashattn_combine_params cp = combine_params(o, lse.data(), ls, out, lse_out.data());
    ASSERT_EQ(flashattn_combine(&cp, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
    EXPECT_EQ(out.count_nan(), 0);
    EXPECT_EQ(out.padding_writes(), 0);
    const double tol = dt == FLASHATTN_DTYPE_BF16 ? 1e-2 : dt == FLASHATTN_DTYPE_FP32 ? 1e-6 : 1e-6;
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < Sq; ++i) {
          double m = -kInf;
          for (int s = 0; s < S; ++s) m = std::max(m, double(lse[size_t(s * ls[0] + b * ls[1] + h * ls[2] + i)]));
          const float got_lse = lse_out[size_t((b * H + h) * Sq + i)];
          if (m == -kInf) {
            EXPECT_TRUE(std::isinf(got_lse) && got_lse < 0) << "row " << i << " lse " << got_lse;
            for (int c = 0; c < D; ++c) EXPECT_EQ(out.get(b, i, h, c), 0.0) << "row " << i;
            continue;
          }
          double sum = 0;
          for (int s = 0; s < S; ++s) sum += std::exp(double(lse[size_t(s * ls[0] + b * ls[1] + h * ls[2] + i)]) - m);
          const double L = m + std::log(sum);
          EXPECT_NEAR(got_lse, L, 1e-5 * std::max(1.0, std::fabs(L))) << "row " << i;
          for (int c = 0; c < D; ++c) {
            double want = 0;
            for (int s = 0; s < S; ++s) {
              const double w = std::exp(double(lse[size_t(s * ls[0] + b * ls[1] + h * ls[2] + i)]) - L);
              if (w > 0) want += w * o.get(s, b, i, h, c);
            }
            EXPECT_NEAR(out.get(b, i, h, c), want, tol * std::max(1.0, std::fabs(want)))
                << dtype_str(dt) << " row " << i << " col " << c;
          }
        }
  }
}

TEST(Combine, AllSplitsEmptyGivesZeroAndMinusInf) {
  for (int S : {1, 3}) {
    Case c;
    c.dtype = FLASHATTN_DTYPE_BF16;
    c.sq = 9;
    c.sk = 0;
    Problem p(c);
    Stacked o(c.dtype, S, c.batch, c.sq, c.hq, c.d);
    std::vector<float> lse_partial;
    run_splits(p, std::vector<int>(size_t(S + 1), 0), o, lse_partial);
    if (HasFatalFailure()) return;
    for (float l : lse_partial) ASSERT_TRUE(std::isinf(l) && l < 0);
    std::fill(o.bytes.begin(), o.bytes.end(), 0xff);  // NaN everywhere: never read
    p.poison_outputs();
    const int64_t ls[4] = {int64_t(c.batch) * c.hq * c.sq, int64_t(c.hq) * c.sq, c.sq, 1};
    flashattn_combine_params cp = combine_params(o, lse_partial.data(), ls, p.out, p.lse.data());
    ASSERT_EQ(flashattn_combine(&cp, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
    EXPECT_EQ(p.out.count_nan(), 0);
    for (int i = 0; i < c.sq; ++i)
      for (int h = 0; h < c.hq; ++h)
        for (int d = 0; d < c.d; ++d) ASSERT_EQ(p.out.get(0, i, h, d), 0.0);
    for (float l : p.lse) EXPECT_TRUE(std::isinf(l) && l < 0) << l;
  }
}

// Splits interleaved in memory ([b, S, s, h, d] storage) and LSEs as [b, h, S, s]: same result
// as the contiguous stacks, bitwise.
TEST(Combine, StridedStacksGiveTheSameResult) {
  std::mt19937_64 rng(fresh_seed());
  const int S = 3, B = 2, Sq = 7, H = 2, D = 24;
  Stacked o(FLASHATTN_DTYPE_FP16, S, B, Sq, H, D);
  Stacked t = o;  // the same elements in [b, S, s, h, d] storage
  t.stride[4] = 1;
  t.stride[3] = D + 8;
  t.stride[2] = H * t.stride[3];
  t.stride[0] = Sq * t.stride[2];
  t.stride[1] = S * t.stride[0];
  t.bytes.assign(size_t(B * t.stride[1]) * 2, 0xff);
  std::vector<float> lse(size_t(S * B * H * Sq)), lse_t(lse.size());
  const int64_t ls[4] = {B * H * Sq, H * Sq, Sq, 1};
  const int64_t ls_t[4] = {Sq, H * S * Sq, S * Sq, 1};
  std::normal_distribution<double> N(0.0, 2.0);
  for (int s = 0; s < S; ++s)
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < Sq; ++i)
        for (int h = 0; h < H; ++h) {
          const float l = float(N(rng));
          lse[size_t(s * ls[0] + b * ls[1] + h * ls[2] + i)] = l;
          lse_t[size_t(s * ls_t[0] + b * ls_t[1] + h * ls_t[2] + i)] = l;
          for (int c = 0; c < D; ++c) {
            const double v = N(rng);
            o.set(s, b, i, h, c, v);
            t.set(s, b, i, h, c, v);
          }
        }
  HostTensor out1(o.dtype, B, Sq, H, D), out2(o.dtype, B, Sq, H, D, Layout::kHeadMajor);
  out1.fill_nan();
  out2.fill_nan();
  std::vector<float> l1(size_t(B * H * Sq), NAN), l2(l1);
  flashattn_combine_params c1 = combine_params(o, lse.data(), ls, out1, l1.data());
  flashattn_combine_params c2 = combine_params(t, lse_t.data(), ls_t, out2, l2.data());
  ASSERT_EQ(flashattn_combine(&c1, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  ASSERT_EQ(flashattn_combine(&c2, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  EXPECT_TRUE(bitwise_equal(out1, out2));
  EXPECT_EQ(std::memcmp(l1.data(), l2.data(), l1.size() * 4), 0);
  EXPECT_EQ(out1.count_nan(), 0);
}

// fp64: fp64 LSEs in and out (lse_partial_fp64 / lse_fp64) reproduce the full forward's to ~1e-12.
TEST(Combine, Fp64LsesAreExact) {
  Case c;
  c.dtype = FLASHATTN_DTYPE_FP64;
  c.sq = 17;
  c.sk = 50;
  c.hq = 2;
  c.hkv = 2;
  c.d = 32;
  Problem p(c);
  const std::vector<int> cut = {0, 11, 11, 50};
  const int S = 3;
  const int64_t rows = int64_t(c.batch) * c.hq * c.sq;
  Stacked o(c.dtype, S, c.batch, c.sq, c.hq, c.d);
  std::vector<double> lse_partial(size_t(S * rows));
  for (int s = 0; s < S; ++s) {
    flashattn_fwd_params f = p.c_fwd_params(FLASHATTN_BACKEND_REFERENCE);
    for (flashattn_tensor* t : {&f.k, &f.v}) {
      t->data = static_cast<double*>(t->data) + cut[size_t(s)] * t->stride[1];
      t->shape[1] = cut[size_t(s) + 1] - cut[size_t(s)];
    }
    f.out = o.split_view(s);
    f.lse = nullptr;
    f.lse_fp64 = lse_partial.data() + s * rows;
    ASSERT_EQ(flashattn_fwd(&f, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  }
  flashattn_fwd_params full = p.c_fwd_params(FLASHATTN_BACKEND_REFERENCE);
  HostTensor want(c.dtype, c.batch, c.sq, c.hq, c.d);
  std::vector<double> want_lse(static_cast<size_t>(rows));
  full.out = want.view();
  full.lse = nullptr;
  full.lse_fp64 = want_lse.data();
  ASSERT_EQ(flashattn_fwd(&full, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();

  const int64_t ls[4] = {rows, int64_t(c.hq) * c.sq, c.sq, 1};
  flashattn_combine_params cp = combine_params(o, nullptr, ls, p.out, nullptr);
  cp.lse_partial_fp64 = lse_partial.data();
  std::vector<double> got_lse(size_t(rows), NAN);
  cp.lse_fp64 = got_lse.data();
  ASSERT_EQ(flashattn_combine(&cp, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  for (int64_t r = 0; r < rows; ++r) EXPECT_NEAR(got_lse[size_t(r)], want_lse[size_t(r)], 1e-12);
  double err = 0;
  for (int i = 0; i < c.sq; ++i)
    for (int h = 0; h < c.hq; ++h)
      for (int d = 0; d < c.d; ++d) err = std::max(err, std::fabs(p.out.get(0, i, h, d) - want.get(0, i, h, d)));
  EXPECT_LT(err, 1e-12);
}

// Enough work to use threads: any thread count and backend give the same bits.
TEST(Combine, ThreadCountAndBackendDoNotChangeTheResult) {
  std::mt19937_64 rng(fresh_seed());
  const int S = 4, B = 2, Sq = 200, H = 4, D = 64;
  Stacked o(FLASHATTN_DTYPE_BF16, S, B, Sq, H, D);
  std::normal_distribution<double> N(0.0, 1.0);
  for (size_t e = 0; e < o.bytes.size() / 2; ++e) store_double(o.bytes.data(), o.dtype, int64_t(e), N(rng));
  std::vector<float> lse(size_t(S * B * H * Sq));
  for (float& l : lse) l = float(3 * N(rng));
  const int64_t ls[4] = {B * H * Sq, H * Sq, Sq, 1};
  HostTensor first(o.dtype, B, Sq, H, D);
  std::vector<float> first_lse(size_t(B * H * Sq));
  int k = 0;
  for (int threads : {1, 3, 0})
    for (flashattn_backend be : {FLASHATTN_BACKEND_AUTO, FLASHATTN_BACKEND_CPU, FLASHATTN_BACKEND_REFERENCE}) {
      HostTensor out(o.dtype, B, Sq, H, D);
      out.fill_nan();
      std::vector<float> l(size_t(B * H * Sq), NAN);
      flashattn_combine_params cp = combine_params(o, lse.data(), ls, out, l.data());
      cp.options.num_threads = threads;
      cp.options.backend = be;
      ASSERT_EQ(flashattn_combine(&cp, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
      if (k++ == 0) {
        first = out;
        first_lse = l;
        EXPECT_EQ(out.count_nan(), 0);
      } else {
        EXPECT_TRUE(bitwise_equal(first, out)) << threads << " threads, backend " << flashattn_backend_name(be);
        EXPECT_EQ(std::memcmp(first_lse.data(), l.data(), l.size() * 4), 0);
      }
    }
}

// ---- validation ------------------------------------------------------------------------------

struct Valid {
  Stacked o{FLASHATTN_DTYPE_FP32, 2, 1, 4, 2, 8};
  std::vector<float> lse = std::vector<float>(2 * 1 * 2 * 4, 0.f);
  HostTensor out{FLASHATTN_DTYPE_FP32, 1, 4, 2, 8};
  std::vector<float> lse_out = std::vector<float>(8, 0.f);
  const int64_t ls[4] = {8, 8, 4, 1};
  flashattn_combine_params params() { return combine_params(o, lse.data(), ls, out, lse_out.data()); }
};

void expect_error(const flashattn_combine_params* p, flashattn_status want, const std::string& field) {
  const flashattn_status got = flashattn_combine(p, nullptr);
  EXPECT_EQ(got, want) << "expected an error naming " << field << "; got: " << flashattn_last_error();
  EXPECT_NE(std::string(flashattn_last_error()).find(field), std::string::npos)
      << "message does not name " << field << ": " << flashattn_last_error();
}

TEST(CombineApi, ValidParamsSucceed) {
  Valid v;
  flashattn_combine_params p = v.params();
  EXPECT_EQ(flashattn_combine(&p, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  EXPECT_STREQ(flashattn_last_error(), "");
  const flashattn_combine_params init = flashattn_combine_params_init();
  EXPECT_EQ(init.struct_size, sizeof(flashattn_combine_params));
  EXPECT_EQ(init.num_splits, 1);
  EXPECT_EQ(init.options.device, -1);
}

TEST(CombineApi, BadFieldsAreNamed) {
  constexpr flashattn_status kInv = FLASHATTN_ERROR_INVALID_ARGUMENT;
  Valid v;
  expect_error(nullptr, kInv, "params");
  struct Bad {
    const char* field;
    flashattn_status status;
    void (*edit)(flashattn_combine_params&, Valid&);
  };
  const Bad bad[] = {
      {"params.struct_size", kInv, [](flashattn_combine_params& p, Valid&) { p.struct_size -= 8; }},
      {"num_splits", kInv, [](flashattn_combine_params& p, Valid&) { p.num_splits = 0; }},
      {"out_partial_shape[0]", kInv, [](flashattn_combine_params& p, Valid&) { p.num_splits = 3; }},
      {"out_partial_shape[3]", kInv, [](flashattn_combine_params& p, Valid&) { p.out_partial_shape[3] = -1; }},
      {"out.shape[2]", kInv, [](flashattn_combine_params& p, Valid&) { p.out.shape[2] = 3; }},
      {"out.shape[3]", kInv, [](flashattn_combine_params& p, Valid&) { p.out.shape[3] = 16; }},
      {"out_partial_stride[4]", kInv, [](flashattn_combine_params& p, Valid&) { p.out_partial_stride[4] = 2; }},
      {"out_partial_stride[0]", kInv, [](flashattn_combine_params& p, Valid&) { p.out_partial_stride[0] = -64; }},
      {"out.stride[3]", kInv, [](flashattn_combine_params& p, Valid&) { p.out.stride[3] = 0; }},
      {"out.stride[1]", kInv, [](flashattn_combine_params& p, Valid&) { p.out.stride[1] = -1; }},
      {"lse_partial_stride[2]", kInv, [](flashattn_combine_params& p, Valid&) { p.lse_partial_stride[2] = -4; }},
      {"lse_partial", kInv, [](flashattn_combine_params& p, Valid&) { p.lse_partial = nullptr; }},
      {"lse_partial", kInv,
       [](flashattn_combine_params& p, Valid& v) { p.lse_partial = reinterpret_cast<const float*>(
                                                       reinterpret_cast<const char*>(v.lse.data()) + 2); }},
      {"lse_partial_fp64", kInv,
       [](flashattn_combine_params& p, Valid&) { p.lse_partial_fp64 = reinterpret_cast<const double*>(p.lse_partial); }},
      {"lse_fp64", kInv, [](flashattn_combine_params& p, Valid& v) { p.lse_fp64 = reinterpret_cast<double*>(v.lse_out.data()); }},
      {"out_partial", kInv, [](flashattn_combine_params& p, Valid&) { p.out_partial = nullptr; }},
      {"out_partial", kInv,
       [](flashattn_combine_params& p, Valid&) { p.out_partial = static_cast<const char*>(p.out_partial) + 1; }},
      {"out.data", kInv, [](flashattn_combine_params& p, Valid&) { p.out.data = nullptr; }},
      {"lse", kInv,
       [](flashattn_combine_params& p, Valid&) { p.lse = reinterpret_cast<float*>(reinterpret_cast<char*>(p.lse) + 1); }},
      {"dtype", kInv, [](flashattn_combine_params& p, Valid&) { p.dtype = flashattn_dtype(99); }},
      {"dtype", FLASHATTN_ERROR_NOT_SUPPORTED, [](flashattn_combine_params& p, Valid&) { p.dtype = FLASHATTN_DTYPE_FP8_E4M3; }},
      {"options.backend", kInv, [](flashattn_combine_params& p, Valid&) { p.options.backend = flashattn_backend(17); }},
      {"options.device", kInv, [](flashattn_combine_params& p, Valid&) { p.options.device = -2; }},
      {"options.device", kInv,
       [](flashattn_combine_params& p, Valid&) { p.options.backend = FLASHATTN_BACKEND_CPU; p.options.device = 0; }},
      {"options.device", kInv, [](flashattn_combine_params& p, Valid&) { p.options.backend = FLASHATTN_BACKEND_SM90; }},
      {"options.num_threads", kInv, [](flashattn_combine_params& p, Valid&) { p.options.num_threads = -1; }},
  };
  for (const Bad& b : bad) {
    flashattn_combine_params p = v.params();
    b.edit(p, v);
    expect_error(&p, b.status, b.field);
  }
  // fp64-only LSE fields with an fp64 problem are fine; both LSE inputs at once are not.
  Valid w;
  w.o = Stacked(FLASHATTN_DTYPE_FP64, 2, 1, 4, 2, 8);
  w.out = HostTensor(FLASHATTN_DTYPE_FP64, 1, 4, 2, 8);
  std::vector<double> l64(w.lse.size(), 0.0), lo64(w.lse_out.size());
  flashattn_combine_params p = w.params();
  p.lse_partial_fp64 = l64.data();
  expect_error(&p, kInv, "lse_partial_fp64");
  p.lse_partial = nullptr;
  p.lse = nullptr;
  p.lse_fp64 = lo64.data();
  EXPECT_EQ(flashattn_combine(&p, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
}

TEST(CombineApi, EmptyProblemsSucceedWithoutPointers) {
  flashattn_combine_params p = flashattn_combine_params_init();
  p.dtype = FLASHATTN_DTYPE_FP16;
  p.num_splits = 2;
  const int64_t shape[5] = {2, 0, 5, 2, 8};
  std::memcpy(p.out_partial_shape, shape, sizeof(shape));
  for (int i = 0; i < 4; ++i) p.out.shape[i] = shape[i + 1];
  EXPECT_EQ(flashattn_combine(&p, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
}

TEST(CombineApi, CudaTensorsNeedTheDevice) {
  const bool cuda_build =
      (flashattn_compiled_backends() & ((1u << FLASHATTN_BACKEND_SM80) | (1u << FLASHATTN_BACKEND_SM90))) != 0;
  Valid v;
  flashattn_combine_params p = v.params();
  p.options.device = 0;
  if (cuda_build) {
    // Host pointers with options.device = 0 are named first.
    expect_error(&p, FLASHATTN_ERROR_INVALID_ARGUMENT, "out_partial");
  } else {
    expect_error(&p, FLASHATTN_ERROR_NO_DEVICE, "no CUDA support");
  }
  // fp64 stays on the host: refused by name before any pointer is looked at.
  flashattn_combine_params e = flashattn_combine_params_init();
  e.dtype = FLASHATTN_DTYPE_FP64;
  e.options.device = 0;
  e.out_partial_shape[0] = 1;
  expect_error(&e, FLASHATTN_ERROR_NOT_SUPPORTED, "fp64 combines run on host tensors only");
}

}  // namespace
}  // namespace flashattn::test
