// FP8 (E4M3) attention through the C ABI (issue 16, host part): flashattn_fwd with dtype
// FLASHATTN_DTYPE_FP8_E4M3 and flashattn_fwd_params.fp8. The reference backend's result must equal
// fp64 attention of the dequantized inputs, computed here independently (dequantization, masks,
// softcap, GQA, varlen written out again), to the output's rounding; and every bad fp8 field is
// refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/fp8.h"
#include "common/half_convert.h"
#include "flashattn/flashattn.h"
#include "test_util.h"

namespace {

using flashattn::e4m3_to_float;
using flashattn::float_to_e4m3;

struct Fp8Case {
  int batch = 1, sq = 16, sk = 16, hq = 2, hkv = 1, d = 32;
  int q_block = 128, k_block = 128;
  flashattn_dtype out_dtype = FLASHATTN_DTYPE_BF16;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  std::vector<int> seqlens_q, seqlens_k;  // varlen when non-empty (batch, sq, sk derived)
  bool per_tensor = false;                // every scale of a tensor equal

  bool varlen() const { return !seqlens_q.empty(); }
  std::string str() const {
    std::string s = "b" + std::to_string(batch) + " sq" + std::to_string(sq) + " sk" + std::to_string(sk) + " hq" +
                    std::to_string(hq) + " hkv" + std::to_string(hkv) + " d" + std::to_string(d) + " qblock" +
                    std::to_string(q_block) + " kblock" + std::to_string(k_block) +
                    (out_dtype == FLASHATTN_DTYPE_FP16 ? " fp16" : " bf16");
    if (causal) s += " causal";
    if (window_left >= 0 || window_right >= 0)
      s += " window(" + std::to_string(window_left) + "," + std::to_string(window_right) + ")";
    if (softcap > 0) s += " softcap" + std::to_string(softcap);
    if (varlen()) s += " varlen";
    if (per_tensor) s += " per-tensor";
    return s;
  }
};

void PrintTo(const Fp8Case& c, std::ostream* os) { *os << c.str(); }

int blocks(int seqlen, int block) { return int((int64_t(seqlen) + block - 1) / block); }

// One FP8 problem: contiguous [b, s, h, d] code tensors (varlen: packed [1, total, h, d]), scales
// [batch, heads, ceil(max_seqlen / block)], poisoned outputs, and the C params that run it.
struct Fp8Problem {
  Fp8Case c;
  uint64_t seed;
  std::vector<int32_t> cu_q, cu_k;
  int rows_q = 0, rows_k = 0;  // rows of the (packed) tensors per batch entry
  std::vector<uint8_t> q, k, v;
  std::vector<float> q_scale, k_scale, v_scale;
  std::vector<uint16_t> out;
  std::vector<float> lse;

  Fp8Problem(Fp8Case cs, uint64_t s) : c(std::move(cs)), seed(s) {
    if (c.varlen()) {
      c.batch = int(c.seqlens_q.size());
      cu_q = {0};
      cu_k = {0};
      c.sq = c.sk = 0;
      for (int b = 0; b < c.batch; ++b) {
        cu_q.push_back(cu_q.back() + c.seqlens_q[b]);
        cu_k.push_back(cu_k.back() + c.seqlens_k[b]);
        c.sq = std::max(c.sq, c.seqlens_q[b]);
        c.sk = std::max(c.sk, c.seqlens_k[b]);
      }
      rows_q = cu_q.back();
      rows_k = cu_k.back();
    } else {
      rows_q = c.sq;
      rows_k = c.sk;
    }
    std::mt19937_64 rng(seed);
    const int tensors_b = c.varlen() ? 1 : c.batch;
    auto codes = [&](std::vector<uint8_t>& t, size_t n) {
      // Values of magnitude up to 448 (saturating), a few subnormal: the whole E4M3 range is used.
      std::normal_distribution<float> nd(0.f, 60.f);
      t.resize(n);
      for (auto& x : t) x = float_to_e4m3(nd(rng));
    };
    codes(q, size_t(tensors_b) * rows_q * c.hq * c.d);
    codes(k, size_t(tensors_b) * rows_k * c.hkv * c.d);
    codes(v, size_t(tensors_b) * rows_k * c.hkv * c.d);
    // Scales spread over a factor 2^5 (u * 2^e / 60): a block read with another block's or head's
    // scale gives a visibly different value.
    std::uniform_real_distribution<float> ud(0.5f, 1.f);
    std::uniform_int_distribution<int> ed(-2, 2);
    auto scales = [&](std::vector<float>& t, size_t n) {
      t.resize(n);
      const float common = std::ldexp(ud(rng), ed(rng)) / 60.f;
      for (auto& x : t) x = c.per_tensor ? common : std::ldexp(ud(rng), ed(rng)) / 60.f;
    };
    scales(q_scale, size_t(c.batch) * c.hq * blocks(c.sq, c.q_block));
    scales(k_scale, size_t(c.batch) * c.hkv * blocks(c.sk, c.k_block));
    scales(v_scale, size_t(c.batch) * c.hkv * blocks(c.sk, c.k_block));
    out.assign(size_t(tensors_b) * rows_q * c.hq * c.d, 0x7fc1);  // NaN in fp16 and bf16
    lse.assign(size_t(c.batch) * c.hq * c.sq, std::numeric_limits<float>::quiet_NaN());
    if (c.varlen()) lse.assign(size_t(c.hq) * rows_q, std::numeric_limits<float>::quiet_NaN());
  }

  static flashattn_tensor view(void* data, int b, int s, int h, int d) {
    flashattn_tensor t{};
    t.data = data;
    t.shape[0] = b, t.shape[1] = s, t.shape[2] = h, t.shape[3] = d;
    t.stride[0] = int64_t(s) * h * d, t.stride[1] = int64_t(h) * d, t.stride[2] = d, t.stride[3] = 1;
    return t;
  }

  flashattn_fwd_params params(flashattn_backend backend = FLASHATTN_BACKEND_AUTO) {
    flashattn_fwd_params p = flashattn_fwd_params_init();
    const int tb = c.varlen() ? 1 : c.batch;
    p.dtype = FLASHATTN_DTYPE_FP8_E4M3;
    p.q = view(q.data(), tb, rows_q, c.hq, c.d);
    p.k = view(k.data(), tb, rows_k, c.hkv, c.d);
    p.v = view(v.data(), tb, rows_k, c.hkv, c.d);
    p.out = view(out.data(), tb, rows_q, c.hq, c.d);
    p.lse = lse.data();
    p.options.causal = c.causal;
    p.options.window_left = c.window_left;
    p.options.window_right = c.window_right;
    p.options.softcap = c.softcap;
    p.options.backend = backend;
    if (c.varlen()) {
      p.varlen.cu_seqlens_q = cu_q.data();
      p.varlen.cu_seqlens_k = cu_k.data();
      p.varlen.batch = c.batch;
      p.varlen.max_seqlen_q = c.sq;
      p.varlen.max_seqlen_k = c.sk;
    }
    p.fp8.q_scale = q_scale.data();
    p.fp8.k_scale = k_scale.data();
    p.fp8.v_scale = v_scale.data();
    p.fp8.q_block_size = c.q_block;
    p.fp8.k_block_size = c.k_block;
    p.fp8.out_dtype = c.out_dtype;
    return p;
  }

  double out_at(size_t i) const {
    return c.out_dtype == FLASHATTN_DTYPE_FP16 ? flashattn::half_to_float(out[i]) : flashattn::bf16_to_float(out[i]);
  }
};

// The definition, written out: dequantize (code value times the scale of block row / block_size,
// rows counted from the sequence's start, k/v scales by kv head), then fp64 attention with the
// header's bottom-right aligned mask, softcap and GQA. Returns O [rows_q, hq, d] per batch entry
// (varlen: packed) and LSE in the layout of Fp8Problem::lse.
struct Expected {
  std::vector<double> o, lse;
};

Expected attention_of_dequantized(const Fp8Problem& P) {
  const Fp8Case& c = P.c;
  const int tb = c.varlen() ? 1 : c.batch;
  Expected e;
  e.o.assign(size_t(tb) * P.rows_q * c.hq * c.d, 0.0);
  e.lse.assign(P.lse.size(), 0.0);
  const double scale = 1.0 / std::sqrt(double(c.d));
  const int nbq = blocks(c.sq, c.q_block), nbk = blocks(c.sk, c.k_block);
  for (int b = 0; b < c.batch; ++b) {
    const int tbi = c.varlen() ? 0 : b;  // batch entry of the tensors
    const int q0 = c.varlen() ? P.cu_q[b] : 0, k0 = c.varlen() ? P.cu_k[b] : 0;
    const int sq = c.varlen() ? P.cu_q[b + 1] - q0 : c.sq;
    const int sk = c.varlen() ? P.cu_k[b + 1] - k0 : c.sk;
    for (int h = 0; h < c.hq; ++h) {
      const int kvh = h / (c.hq / c.hkv);
      for (int i = 0; i < sq; ++i) {
        const double qs = P.q_scale[(size_t(b) * c.hq + h) * nbq + i / c.q_block];
        std::vector<double> s(size_t(sk), -INFINITY);
        double m = -INFINITY;
        for (int j = 0; j < sk; ++j) {
          const int shift = sk - sq;  // bottom-right alignment
          const int wr = c.causal ? 0 : c.window_right;
          if (c.window_left >= 0 && j < i + shift - c.window_left) continue;
          if (wr >= 0 && j > i + shift + wr) continue;
          const double ks = P.k_scale[(size_t(b) * c.hkv + kvh) * nbk + j / c.k_block];
          double dot = 0;
          for (int x = 0; x < c.d; ++x) {
            const double qv = double(e4m3_to_float(P.q[((size_t(tbi) * P.rows_q + q0 + i) * c.hq + h) * c.d + x])) * qs;
            const double kv = double(e4m3_to_float(P.k[((size_t(tbi) * P.rows_k + k0 + j) * c.hkv + kvh) * c.d + x])) * ks;
            dot += qv * kv;
          }
          double sc = dot * double(float(scale));  // the library takes softmax_scale as a float
          if (c.softcap > 0) sc = double(c.softcap) * std::tanh(sc / double(c.softcap));
          s[j] = sc;
          m = std::max(m, sc);
        }
        const size_t li = c.varlen() ? size_t(h) * P.rows_q + q0 + i : (size_t(b) * c.hq + h) * c.sq + i;
        double* o = &e.o[((size_t(tbi) * P.rows_q + q0 + i) * c.hq + h) * c.d];
        if (m == -INFINITY) {  // no key: O = 0, LSE = -inf
          e.lse[li] = -INFINITY;
          continue;
        }
        double l = 0;
        for (int j = 0; j < sk; ++j) l += std::exp(s[j] - m);
        for (int j = 0; j < sk; ++j) {
          const double pj = std::exp(s[j] - m) / l;
          if (pj == 0) continue;
          const double vs = P.v_scale[(size_t(b) * c.hkv + kvh) * nbk + j / c.k_block];
          for (int x = 0; x < c.d; ++x)
            o[x] += pj * double(e4m3_to_float(P.v[((size_t(tbi) * P.rows_k + k0 + j) * c.hkv + kvh) * c.d + x])) * vs;
        }
        e.lse[li] = m + std::log(l);
      }
    }
  }
  return e;
}

// out equals the expected O rounded to out_dtype (one rounding: |out - O| <= u |O|, u the unit
// roundoff, plus fp16's subnormal spacing and fp64 noise between two summation orders); LSE equals
// the expected one rounded to fp32. Rows outside every sequence (varlen) are not checked.
void expect_matches(const Fp8Problem& P, const Expected& e) {
  const double u = flashattn::test::unit_roundoff(P.c.out_dtype);
  const double tiny = P.c.out_dtype == FLASHATTN_DTYPE_FP16 ? std::ldexp(1.0, -25) : 0.0;
  size_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < e.o.size(); ++i) {
    const double got = P.out_at(i), want = e.o[i];
    const double err = std::fabs(got - want), tol = u * std::fabs(want) * (1 + 1e-9) + tiny + 1e-12 * std::fabs(want);
    if (!(err <= tol)) {
      if (bad++ < 5)
        ADD_FAILURE() << P.c.str() << " seed " << P.seed << ": out[" << i << "] = " << got << ", expected " << want
                      << " (err " << err << " > " << tol << ")";
    }
    worst = std::max(worst, err / std::max(std::fabs(want), 1e-30));
  }
  EXPECT_EQ(bad, 0u) << P.c.str() << ": worst relative error " << worst;
  size_t bad_lse = 0;
  for (size_t i = 0; i < e.lse.size(); ++i) {
    const double got = P.lse[i], want = e.lse[i];
    const bool ok = std::isinf(want) ? got == want : std::fabs(got - want) <= std::ldexp(std::fabs(want), -24) + 1e-12;
    if (!ok && bad_lse++ < 5)
      ADD_FAILURE() << P.c.str() << " seed " << P.seed << ": lse[" << i << "] = " << got << ", expected " << want;
  }
  EXPECT_EQ(bad_lse, 0u);
}

void run_and_check(const Fp8Case& c, flashattn_backend backend) {
  const uint64_t seed = flashattn::test::fresh_seed();
  Fp8Problem P(c, seed);
  flashattn_fwd_params p = P.params(backend);
  ASSERT_EQ(flashattn_fwd(&p, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << c.str() << ": " << flashattn_last_error();
  expect_matches(P, attention_of_dequantized(P));
}

class Fp8Attention : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(Fp8Attention, ReferenceEqualsAttentionOfTheDequantizedInputs) {
  run_and_check(GetParam(), FLASHATTN_BACKEND_REFERENCE);
}

// Block sizes 1, 7, 128 and >= seqlen (INT32_MAX too: the block count must not overflow), each on q
// and k; GQA/MQA; causal, windows and softcap; ragged seqlen_q != seqlen_k (1, 7, 113, 799); varlen.
std::vector<Fp8Case> cases() {
  std::vector<Fp8Case> v;
  Fp8Case c;
  c = Fp8Case{};
  c.batch = 2, c.sq = 7, c.sk = 113, c.hq = 4, c.hkv = 2, c.d = 64, c.q_block = 1, c.k_block = 7;
  v.push_back(c);
  c = Fp8Case{};
  c.batch = 1, c.sq = 113, c.sk = 7, c.hq = 2, c.hkv = 2, c.d = 32, c.q_block = 128, c.k_block = 1;
  c.out_dtype = FLASHATTN_DTYPE_FP16, c.causal = true;  // rows 0..105 see no key
  v.push_back(c);
  c = Fp8Case{};
  c.batch = 1, c.sq = 1, c.sk = 799, c.hq = 3, c.hkv = 1, c.d = 64, c.q_block = 1000, c.k_block = 128;
  c.softcap = 5.f;
  v.push_back(c);
  c = Fp8Case{};
  c.batch = 2, c.sq = 799, c.sk = 113, c.hq = 2, c.hkv = 1, c.d = 16, c.q_block = 7, c.k_block = INT32_MAX;
  c.window_left = 32, c.window_right = 8;
  v.push_back(c);
  c = Fp8Case{};
  c.sq = 128, c.sk = 128, c.hq = 2, c.hkv = 2, c.d = 128, c.q_block = 128, c.k_block = 128, c.per_tensor = true;
  c.out_dtype = FLASHATTN_DTYPE_FP16;
  v.push_back(c);
  c = Fp8Case{};
  c.seqlens_q = {1, 7, 113, 0}, c.seqlens_k = {799, 7, 113, 5}, c.hq = 4, c.hkv = 2, c.d = 32;
  c.q_block = 7, c.k_block = 128, c.causal = true;
  v.push_back(c);
  c = Fp8Case{};
  c.seqlens_q = {113, 1}, c.seqlens_k = {7, 113}, c.hq = 2, c.hkv = 1, c.d = 64, c.q_block = 1, c.k_block = 7;
  c.window_left = 3, c.softcap = 2.f, c.out_dtype = FLASHATTN_DTYPE_FP16;
  v.push_back(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, Fp8Attention, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Fp8Case>& info) { return "case" + std::to_string(info.index); });

// AUTO on host tensors runs FP8 (on the reference backend: the cpu backend refuses it).
TEST(Fp8AttentionApi, AutoPicksAHostPathThatRunsIt) {
  Fp8Case c;
  c.sq = 33, c.sk = 40, c.q_block = 7, c.k_block = 16;
  run_and_check(c, FLASHATTN_BACKEND_AUTO);
  Fp8Problem P(c, 1);
  flashattn_fwd_params p = P.params(FLASHATTN_BACKEND_AUTO);
  size_t bytes = 1;
  EXPECT_EQ(flashattn_fwd_workspace_size(&p, &bytes), FLASHATTN_SUCCESS) << flashattn_last_error();
  EXPECT_EQ(bytes, 0u);
}

// The quantizer's output feeds the attention as is (one scale layout): attention of
// flashattn_fp8_quantize(x) equals the oracle on the codes and scales it wrote.
TEST(Fp8AttentionApi, QuantizerOutputRunsDirectly) {
  Fp8Case c;
  c.batch = 2, c.sq = 113, c.sk = 7, c.hq = 2, c.hkv = 1, c.d = 64, c.q_block = 16, c.k_block = 4;
  const uint64_t seed = flashattn::test::fresh_seed();
  Fp8Problem P(c, seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  struct T { std::vector<uint8_t>* codes; std::vector<float>* scales; int s, h, block; };
  for (T t : {T{&P.q, &P.q_scale, c.sq, c.hq, c.q_block}, T{&P.k, &P.k_scale, c.sk, c.hkv, c.k_block},
              T{&P.v, &P.v_scale, c.sk, c.hkv, c.k_block}}) {
    std::vector<float> x(size_t(c.batch) * t.s * t.h * c.d);
    for (auto& e : x) e = nd(rng);
    flashattn_fp8_quantize_params qp = flashattn_fp8_quantize_params_init();
    qp.dtype = FLASHATTN_DTYPE_FP32;
    qp.x = Fp8Problem::view(x.data(), c.batch, t.s, t.h, c.d);
    qp.x_fp8 = Fp8Problem::view(t.codes->data(), c.batch, t.s, t.h, c.d);
    qp.scales = t.scales->data();
    qp.block_size = t.block;
    ASSERT_EQ(flashattn_fp8_quantize(&qp, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  }
  flashattn_fwd_params p = P.params();
  ASSERT_EQ(flashattn_fwd(&p, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  expect_matches(P, attention_of_dequantized(P));
}

// No keys (fixed length, seqlen_k = 0): O = 0 in out_dtype, LSE = -inf; k/v scales may be NULL then.
TEST(Fp8AttentionApi, NoKeys) {
  Fp8Case c;
  c.sq = 5, c.sk = 0;
  Fp8Problem P(c, 2);
  flashattn_fwd_params p = P.params();
  p.fp8.k_scale = p.fp8.v_scale = nullptr;
  ASSERT_EQ(flashattn_fwd(&p, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  for (uint16_t x : P.out) EXPECT_EQ(x, 0u);
  for (float x : P.lse) EXPECT_EQ(x, -INFINITY);
}

// ---- validation: every bad field named; nothing written -----------------------------------------

struct Bad {
  const char* field;
  flashattn_status status;
  void (*breaks)(flashattn_fwd_params&, Fp8Problem&);
};

TEST(Fp8AttentionApi, RefusesBadFieldsByName) {
  const Bad bads[] = {
      {"fp8.q_scale", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p, auto&) { p.fp8.q_scale = nullptr; }},
      {"fp8.k_scale", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p, auto&) { p.fp8.k_scale = nullptr; }},
      {"fp8.v_scale", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p, auto&) { p.fp8.v_scale = nullptr; }},
      {"fp8.q_scale", FLASHATTN_ERROR_INVALID_ARGUMENT,
       [](auto& p, auto& P) { p.fp8.q_scale = reinterpret_cast<const float*>(reinterpret_cast<const char*>(P.q_scale.data()) + 2); }},
      {"fp8.q_block_size", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p, auto&) { p.fp8.q_block_size = 0; }},
      {"fp8.k_block_size", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p, auto&) { p.fp8.k_block_size = -7; }},
      {"fp8.out_dtype", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p, auto&) { p.fp8.out_dtype = FLASHATTN_DTYPE_FP32; }},
      {"fp8.out_dtype", FLASHATTN_ERROR_INVALID_ARGUMENT,
       [](auto& p, auto&) { p.fp8.out_dtype = FLASHATTN_DTYPE_FP8_E4M3; }},
      {"fp8.out_dtype", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p, auto&) { p.fp8.out_dtype = flashattn_dtype(0); }},
      {"lse_fp64", FLASHATTN_ERROR_INVALID_ARGUMENT,
       [](auto& p, auto&) { p.lse = nullptr; p.lse_fp64 = reinterpret_cast<double*>(p.out.data); }},
      {"out.data", FLASHATTN_ERROR_INVALID_ARGUMENT,  // out is 16-bit: 2-byte aligned
       [](auto& p, auto&) { p.out.data = static_cast<char*>(p.out.data) + 1; }},
      {"dtype: fp8_e4m3 is not supported by the cpu backend", FLASHATTN_ERROR_NOT_SUPPORTED,
       [](auto& p, auto&) { p.options.backend = FLASHATTN_BACKEND_CPU; }},
      {"kv_cache.seqlens", FLASHATTN_ERROR_NOT_SUPPORTED,
       [](auto& p, auto& P) { p.kv_cache.seqlens = P.cu_k.empty() ? reinterpret_cast<const int32_t*>(P.q_scale.data()) : P.cu_k.data(); }},
      {"params.struct_size", FLASHATTN_ERROR_INVALID_ARGUMENT, [](auto& p, auto&) { p.struct_size += 8; }},
      {"fp8: params.struct_size", FLASHATTN_ERROR_INVALID_ARGUMENT,  // an older caller cannot give scales
       [](auto& p, auto&) { p.struct_size = uint32_t(offsetof(flashattn_fwd_params, fp8)); }},
  };
  for (const Bad& bad : bads) {
    Fp8Case c;
    c.sq = 9, c.sk = 12;
    Fp8Problem P(c, 3);
    flashattn_fwd_params p = P.params();
    bad.breaks(p, P);
    EXPECT_EQ(flashattn_fwd(&p, nullptr, 0, nullptr), bad.status) << bad.field << ": " << flashattn_last_error();
    EXPECT_NE(std::string(flashattn_last_error()).find(bad.field), std::string::npos)
        << "message '" << flashattn_last_error() << "' should name '" << bad.field << "'";
    for (uint16_t x : P.out) ASSERT_EQ(x, 0x7fc1) << bad.field << ": a refused call wrote its output";
  }
}

// The fp8 fields belong to dtype fp8_e4m3: set with another dtype they are refused, not ignored.
TEST(Fp8AttentionApi, Fp8FieldsWithAnotherDtypeAreRefused) {
  std::vector<uint16_t> q(2 * 4 * 16), o(2 * 4 * 16);
  float scale = 1.f;
  const char* fields[] = {"fp8.q_scale", "fp8.k_scale", "fp8.v_scale", "fp8.q_block_size", "fp8.k_block_size",
                          "fp8.out_dtype"};
  for (int which = 0; which < 6; ++which) {
    flashattn_fwd_params p = flashattn_fwd_params_init();
    p.dtype = FLASHATTN_DTYPE_BF16;
    p.q = p.k = p.v = Fp8Problem::view(q.data(), 1, 4, 2, 16);
    p.out = Fp8Problem::view(o.data(), 1, 4, 2, 16);
    ASSERT_EQ(flashattn_fwd(&p, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
    switch (which) {
      case 0: p.fp8.q_scale = &scale; break;
      case 1: p.fp8.k_scale = &scale; break;
      case 2: p.fp8.v_scale = &scale; break;
      case 3: p.fp8.q_block_size = 128; break;
      case 4: p.fp8.k_block_size = 128; break;
      case 5: p.fp8.out_dtype = FLASHATTN_DTYPE_BF16; break;
    }
    EXPECT_EQ(flashattn_fwd(&p, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashattn_last_error()).find(std::string(fields[which]) + ": set, but dtype is bf16"),
              std::string::npos)
        << flashattn_last_error();
  }
}

// A caller built against the header before `fp8` (struct_size 656) still runs its bf16 calls; the
// bytes past its struct are never read (poisoned here: read, they would be refused).
TEST(Fp8AttentionApi, StructSizeBeforeFp8StillWorks) {
  std::vector<uint16_t> q(2 * 4 * 16), o(2 * 4 * 16, 0x7fc1);
  for (size_t i = 0; i < q.size(); ++i) q[i] = flashattn::float_to_bf16(float(int(i % 7) - 3) / 4.f);
  flashattn_fwd_params p = flashattn_fwd_params_init();
  p.dtype = FLASHATTN_DTYPE_BF16;
  p.q = p.k = p.v = Fp8Problem::view(q.data(), 1, 4, 2, 16);
  p.out = Fp8Problem::view(o.data(), 1, 4, 2, 16);
  p.struct_size = uint32_t(offsetof(flashattn_fwd_params, fp8));
#if UINTPTR_MAX == UINT64_MAX
  EXPECT_EQ(p.struct_size, 656u);  // sizeof(flashattn_fwd_params) of the earlier header
  EXPECT_EQ(sizeof(flashattn_fwd_params), 696u);
#endif
  std::memset(&p.fp8, 0xA5, sizeof(p.fp8));
  ASSERT_EQ(flashattn_fwd(&p, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  for (uint16_t x : o) ASSERT_TRUE(std::isfinite(flashattn::bf16_to_float(x)));
}

// FP8 is forward-only: the backward names the dtype.
TEST(Fp8AttentionApi, BackwardRefusesFp8) {
  std::vector<uint8_t> x(4 * 2 * 16, 0x38);
  std::vector<uint16_t> g(4 * 2 * 16);
  std::vector<float> lse(2 * 4);
  flashattn_bwd_params b = flashattn_bwd_params_init();
  b.dtype = FLASHATTN_DTYPE_FP8_E4M3;
  b.q = b.k = b.v = Fp8Problem::view(x.data(), 1, 4, 2, 16);
  b.out = b.dout = b.dq = b.dk = b.dv = Fp8Problem::view(g.data(), 1, 4, 2, 16);
  b.lse = lse.data();
  EXPECT_EQ(flashattn_bwd(&b, nullptr, 0, nullptr), FLASHATTN_ERROR_NOT_SUPPORTED);
  EXPECT_NE(std::string(flashattn_last_error()).find("dtype: fp8_e4m3 has no backward"), std::string::npos)
      << flashattn_last_error();
  size_t bytes = 0;
  EXPECT_EQ(flashattn_bwd_workspace_size(&b, &bytes), FLASHATTN_ERROR_NOT_SUPPORTED);
}

}  // namespace
