// Host test helpers shared by every C++ test (cpu, reference, api, gpu):
//   * HostTensor: a [batch, seqlen, heads, headdim] tensor of any dtype in a contiguous, padded
//     or head-major (non-contiguous) layout, with random fill (fresh seed, a few outliers),
//     NaN poisoning (padding included, so writes outside the view are caught);
//   * Case / Problem: one attention problem (every option, varlen) with its tensors, and the
//     normalized FwdParams/BwdParams or C ABI params that run it;
//   * run_oracle + check_*: the correctness rule. A path passes when
//       max|ours - exact| <= 2 x max|standard - exact| + atol
//     where exact is the fp64 oracle and standard is unfused attention at the input precision
//     (reference::Rounding::kInputPrecision); any NaN fails.
// Typical use (host path; a GPU test copies the inputs' bytes to the device, runs with views of
// the device copies, copies the outputs' bytes back into the Problem, and checks the same way):
//   Problem p(Case{...});
//   p.poison_outputs();
//   ASSERT_EQ(kCpuBackend.fwd(p.fwd_params(), nullptr, nullptr), FLASHATTN_SUCCESS);
//   Oracle exact = run_oracle(p, Rounding::kExact, false);
//   Oracle standard = run_oracle(p, Rounding::kInputPrecision, false);
//   EXPECT_TRUE(check_fwd(p, exact, standard));
//   (backward: run_oracle(..., true) for both, run the backward on p.bwd_params() with p.out
//   from the forward, then EXPECT_TRUE(check_bwd(p, exact, standard)).)
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/params.h"
#include "flashattn/flashattn.h"
#include "reference/reference.h"

namespace flashattn::test {

using reference::Rounding;

size_t dtype_bytes(flashattn_dtype dtype);
const char* dtype_str(flashattn_dtype dtype);
// Unit roundoff: 2^-11 fp16, 2^-8 bf16, 2^-24 fp32, 2^-53 fp64.
double unit_roundoff(flashattn_dtype dtype);
// `v` rounded to nearest-even in `dtype`.
double round_to(flashattn_dtype dtype, double v);

// A seed for this test: FLASHATTN_TEST_SEED if set (to reproduce a failure), else fresh
// from std::random_device. Failure messages print the Problem's seed; a test whose problems
// take fresh_seed() directly is reproduced by FLASHATTN_TEST_SEED=<that seed>, one that draws
// several from a generator prints its master seed.
uint64_t fresh_seed();

enum class Layout {
  kContiguous,  // [b, s, h, d] packed
  kPadded,      // each head padded to d + 8 elements, each row by 24 more, each batch by 40 more
  kHeadMajor,   // memory is [b, h, s, d]: the seqlen dimension is not the outer one
};
const char* layout_str(Layout l);

struct HostTensor {
  flashattn_dtype dtype = FLASHATTN_DTYPE_FP32;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 1};  // elements
  std::vector<unsigned char> bytes;  // the whole storage, padding included

  HostTensor() = default;
  HostTensor(flashattn_dtype dtype, int64_t b, int64_t s, int64_t h, int64_t d,
             Layout layout = Layout::kContiguous);

  int64_t numel() const { return shape[0] * shape[1] * shape[2] * shape[3]; }
  int64_t index(int64_t b, int64_t s, int64_t h, int64_t c) const {
    return b * stride[0] + s * stride[1] + h * stride[2] + c;
  }
  double get(int64_t b, int64_t s, int64_t h, int64_t c) const;
  void set(int64_t b, int64_t s, int64_t h, int64_t c, double v);  // rounds to dtype
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  size_t size_bytes() const { return bytes.size(); }

  // C ABI view of this layout; `data` overrides the pointer (e.g. a device copy of bytes).
  flashattn_tensor view(void* data = nullptr) const;
  // The normalized strides src/api builds (varlen: batch stride 0).
  RowStrides row_strides(bool varlen) const;
  // The same values in another dtype (exact when widening) and layout.
  HostTensor converted(flashattn_dtype to, Layout layout = Layout::kContiguous) const;

  // N(0, stddev) entries plus `outliers` entries of magnitude 6..10 x stddev (-1: about one
  // per 1000 elements, at least one), all rounded to the dtype.
  void fill_random(std::mt19937_64& rng, double stddev = 1.0, int outliers = -1);
  void fill(double v);
  void fill_nan();  // all storage, padding included
  int64_t count_nan() const;  // over the view's elements
  // Elements of the storage outside the view that are no longer NaN (after fill_nan): > 0
  // means something wrote outside the tensor.
  int64_t padding_writes() const;
};

struct Case {
  int batch = 1, sq = 64, sk = 64, hq = 2, hkv = 1, d = 64;
  flashattn_dtype dtype = FLASHATTN_DTYPE_FP16;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  float softmax_scale = 0.f;  // 0 = 1/sqrt(d)
  // Varlen when non-empty: one entry per sequence (batch, sq, sk are then derived).
  std::vector<int> seqlens_q, seqlens_k;
  Layout layout = Layout::kContiguous;
  bool lse = true;          // forward writes LSE (the backward always needs it)
  double input_std = 1.0;   // stddev of q, k, v, dout
  // Dropout (p > 0: on), with the Philox seed and counter offset the forward and backward share.
  float dropout_p = 0.f;
  uint64_t dropout_seed = 0, dropout_offset = 0;
  // ALiBi when non-empty: [hq] slopes (alibi_batch_stride 0) or [batch, stride] with stride >= hq.
  std::vector<float> alibi_slopes;
  int64_t alibi_batch_stride = 0;

  bool varlen() const { return !seqlens_q.empty(); }
  std::string str() const;
};

// Standard ALiBi slopes for n heads: 2^(-8k/n), k = 1..n (Press et al.).
std::vector<float> alibi_standard_slopes(int n);

// A case's tensors (in case.dtype and case.layout) and the params that run it.
struct Problem {
  Case c;
  uint64_t seed = 0;
  HostTensor q, k, v, out, dout, dq, dk, dv;
  std::vector<float> lse;             // [b, hq, sq] or varlen [hq, total_q]
  std::vector<int32_t> cu_q, cu_k;    // varlen only

  explicit Problem(const Case& c, uint64_t seed = fresh_seed());

  int batch() const { return c.varlen() ? int(c.seqlens_q.size()) : c.batch; }
  int max_seqlen_q() const;
  int max_seqlen_k() const;
  // (sequence b, row i) -> first index of q/out/dq: batch index and packed row.
  int64_t q_b(int b) const { return c.varlen() ? 0 : b; }
  int64_t q_row(int b, int i) const { return c.varlen() ? cu_q[b] + i : i; }
  int64_t k_b(int b) const { return q_b(b); }
  int64_t k_row(int b, int j) const { return c.varlen() ? cu_k[b] + j : j; }
  int seqlen_q(int b) const { return c.varlen() ? cu_q[b + 1] - cu_q[b] : c.sq; }
  int seqlen_k(int b) const { return c.varlen() ? cu_k[b + 1] - cu_k[b] : c.sk; }
  int64_t lse_index(int b, int h, int i) const;

  void poison_outputs();  // out, lse, dq, dk, dv := NaN

  // Normalized params on this problem's own tensors, as src/api would build them (dropout and
  // ALiBi included; the slopes are c.alibi_slopes' host memory).
  FwdParams fwd_params();
  BwdParams bwd_params();
  // C ABI params (host pointers) for the given backend.
  flashattn_fwd_params c_fwd_params(flashattn_backend backend = FLASHATTN_BACKEND_AUTO);
  flashattn_bwd_params c_bwd_params(flashattn_backend backend = FLASHATTN_BACKEND_AUTO);

  std::string describe() const;  // "[case; seed N]"
  // Dropout seed and offset drawn from this problem's seed, so FLASHATTN_TEST_SEED=<seed>
  // reproduces the mask along with the inputs.
  void seed_dropout_from_seed();
};

// Normalized params of problem p's case and sequences on other tensors of the same shapes
// (e.g. FP64 copies for the oracle); the dtype is the tensors'.
FwdParams make_fwd_params(const Problem& p, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                          HostTensor& out, float* lse);
BwdParams make_bwd_params(const Problem& p, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                          const HostTensor& out, const HostTensor& dout, const float* lse, HostTensor& dq,
                          HostTensor& dk, HostTensor& dv);

// The oracle's outputs in FP64 (contiguous), from FP64 copies of the problem's inputs.
struct Oracle {
  HostTensor out, dq, dk, dv;
  std::vector<float> lse;
};
// kInputPrecision rounds the intermediates to the problem's dtype.
Oracle run_oracle(const Problem& p, Rounding rounding, bool backward);

// Tolerance: max|ours - exact| <= factor * max|standard - exact| + atol, with
// atol = atol_ulps * u * max(1, max|exact|), u = unit_roundoff of the dtype, but at least fp32's:
// a fused path computes in fp32 whatever the input, so for fp32/fp64 inputs its error is that of
// fp32 arithmetic with a stored fp32 LSE (a few times the unfused fp32 error), not 2x of it.
// atol_ulps < 0 picks the default: 2 for fp16/bf16, 64 for fp32/fp64.
struct Rule {
  double factor = 2.0;
  double atol_ulps = -1.0;
};
// The u and atol_ulps a rule uses for `dtype`.
double rule_unit(flashattn_dtype dtype);
double rule_atol_ulps(const Rule& rule, flashattn_dtype dtype);

// One tensor of the problem against the oracle; only elements inside the sequences are
// compared. Fails on any NaN there, on writes into padding, and on the tolerance.
::testing::AssertionResult check_tensor(const Problem& p, const char* name, const HostTensor& ours,
                                        const HostTensor& exact, const HostTensor& standard, bool key_side,
                                        Rule rule = Rule());
::testing::AssertionResult check_lse(const Problem& p, const std::vector<float>& ours,
                                     const std::vector<float>& exact, const std::vector<float>& standard,
                                     Rule rule = Rule());
// out (+ lse when the case writes it).
::testing::AssertionResult check_fwd(const Problem& p, const Oracle& exact, const Oracle& standard,
                                     Rule rule = Rule());
// dq, dk, dv. A fused backward takes D = rowsum(dO * O) from the O it is handed, so its
// gradients are compared with the exact gradients *given p.out* (Rounding::kExactGivenOutput,
// computed here: p.out must hold the output the backward used), while the yardstick stays
// standard vs exact. Without this, O's rounding to fp16/bf16 times an outlier in dO, which
// unfused attention does not suffer, fails short rows.
// given_lse: the exact gradients given p.out *and* p.lse (P = exp(S - LSE) from the fp32 LSE the
// backward is handed). The LSE's fp32 rounding, 2^-25 |LSE| relative in every P of the row, is
// then not counted against the backward; it matters where |LSE| is large (ALiBi rows far from
// the diagonal: |LSE| ~ slope * distance), and unfused attention, which stores no LSE, lacks it.
// Check the forward's LSE against the exact one (check_fwd) in the same test.
::testing::AssertionResult check_bwd(const Problem& p, const Oracle& exact, const Oracle& standard,
                                     Rule rule = Rule(), bool given_lse = false);
// The exact gradients given p.out (and p.lse with given_lse): what check_bwd compares with.
Oracle run_oracle_given_output(const Problem& p, bool given_lse = false);

// For sequences too long for the O(N^2) oracle on every row: checks `rows` sampled query rows
// (always including the first and last of each sequence) of out/lse via reference::fwd_row.
::testing::AssertionResult check_fwd_sampled(const Problem& p, int rows, std::mt19937_64& rng,
                                             Rule rule = Rule());

// Bitwise equality of two tensors' views (determinism).
bool bitwise_equal(const HostTensor& a, const HostTensor& b);

}  // namespace flashattn::test
