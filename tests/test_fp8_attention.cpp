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
#include "fp8_problem.h"
#include "test_util.h"

namespace {

using flashattn::e4m3_to_float;
using flashattn::float_to_e4m3;

using namespace flashattn::test::fp8;

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
  c = Fp8Case{};
  c.batch = 2, c.sq = 113, c.sk = 799, c.hq = 4, c.hkv = 2, c.d = 32, c.q_block = 7, c.k_block = 128;
  c.alibi = true, c.causal = true;
  v.push_back(c);  // ALiBi (bottom-right aligned), causal
  c = Fp8Case{};
  c.batch = 2, c.sq = 113, c.sk = 799, c.hq = 2, c.hkv = 1, c.d = 32, c.k_block = 128, c.causal = true;
  c.zero_scale_every = 3;
  v.push_back(c);  // zero K and V scale blocks (a caller's own), causal
  c = Fp8Case{};
  c.seqlens_q = {7, 300}, c.seqlens_k = {113, 5}, c.hq = 2, c.hkv = 1, c.d = 64, c.q_block = 128, c.k_block = 1;
  c.alibi = true, c.softcap = 3.f;
  v.push_back(c);  // ALiBi after the softcap, varlen
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
  EXPECT_EQ(sizeof(flashattn_fwd_params), 704u);
#endif
  std::memset(&p.fp8, 0xA5, sizeof(p.fp8));
  ASSERT_EQ(flashattn_fwd(&p, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
  for (uint16_t x : o) ASSERT_TRUE(std::isfinite(flashattn::bf16_to_float(x)));
}

// fp8_v_layout keys_permuted16: the same V given as V^T with keys permuted in groups of 16 gives the
// same result, bit for bit (the reference reads each element through the layout), on ragged key
// counts (1, 7, 113: a partial last group whose padding is read as zeros) and row lengths past the
// minimum; and its bad strides, varlen and other dtypes are refused by name.
TEST(Fp8AttentionApi, KeysPermutedVGivesTheSameResult) {
  for (int sk : {1, 7, 16, 113}) {
    for (int extra : {0, 32}) {
      Fp8Case c;
      c.batch = 2, c.sq = 9, c.sk = sk, c.hq = 4, c.hkv = 2, c.d = 32, c.k_block = 7;
      Fp8Problem rows(c, 11 + sk), permuted(c, 11 + sk);
      flashattn_fwd_params pr = rows.params(FLASHATTN_BACKEND_REFERENCE);
      ASSERT_EQ(flashattn_fwd(&pr, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
      flashattn_fwd_params pp = permuted.params(FLASHATTN_BACKEND_REFERENCE);
      permuted.use_keys_permuted16(pp, (sk + 15) / 16 * 16 + extra);
      std::fill(permuted.v.begin(), permuted.v.end(), 0x7f);  // NaN codes: a read of the row layout shows
      ASSERT_EQ(flashattn_fwd(&pp, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
      ASSERT_EQ(rows.out, permuted.out) << "sk " << sk << " extra " << extra;
      for (size_t i = 0; i < rows.lse.size(); ++i)
        ASSERT_EQ(std::memcmp(&rows.lse[i], &permuted.lse[i], sizeof(float)), 0) << "lse " << i;
    }
  }
  struct Case { const char* field; flashattn_status status; void (*breaks)(flashattn_fwd_params&); };
  const Case bads[] = {
      {"v.stride[3]", FLASHATTN_ERROR_INVALID_ARGUMENT, [](flashattn_fwd_params& p) { p.v.stride[3] = 16; }},  // < 32
      {"v.stride[3]", FLASHATTN_ERROR_INVALID_ARGUMENT, [](flashattn_fwd_params& p) { p.v.stride[3] = 40; }},  // % 16
      {"v.stride[1]", FLASHATTN_ERROR_INVALID_ARGUMENT, [](flashattn_fwd_params& p) { p.v.stride[1] = 2; }},
      {"fp8_v_layout: 3", FLASHATTN_ERROR_INVALID_ARGUMENT, [](flashattn_fwd_params& p) { p.fp8_v_layout = 3; }},
      {"fp8_v_layout: -1", FLASHATTN_ERROR_INVALID_ARGUMENT, [](flashattn_fwd_params& p) { p.fp8_v_layout = -1; }},
      {"fp8_v_layout: keys_permuted16 is for fixed-length", FLASHATTN_ERROR_NOT_SUPPORTED,
       [](flashattn_fwd_params& p) {
         static const int32_t cu_q[2] = {0, 9}, cu_k[2] = {0, 20};
         p.q.shape[0] = p.out.shape[0] = 1;
         p.v.shape[0] = p.k.shape[0] = 1;
         p.varlen = flashattn_varlen{cu_q, cu_k, 1, 9, 20};
       }},
  };
  for (const Case& bad : bads) {
    Fp8Case c;
    c.batch = 2, c.sq = 9, c.sk = 20, c.hq = 2, c.hkv = 1, c.d = 32;
    Fp8Problem P(c, 5);
    flashattn_fwd_params p = P.params(FLASHATTN_BACKEND_REFERENCE);
    P.use_keys_permuted16(p, 32);
    bad.breaks(p);
    EXPECT_EQ(flashattn_fwd(&p, nullptr, 0, nullptr), bad.status) << bad.field << ": " << flashattn_last_error();
    EXPECT_NE(std::string(flashattn_last_error()).find(bad.field), std::string::npos)
        << "message '" << flashattn_last_error() << "' should name '" << bad.field << "'";
    for (uint16_t x : P.out) ASSERT_EQ(x, 0x7fc1) << bad.field << ": a refused call wrote its output";
  }
  // A v layout with another dtype is refused, not ignored.
  std::vector<uint16_t> q(2 * 4 * 16), o(2 * 4 * 16);
  flashattn_fwd_params p = flashattn_fwd_params_init();
  p.dtype = FLASHATTN_DTYPE_BF16;
  p.q = p.k = p.v = Fp8Problem::view(q.data(), 1, 4, 2, 16);
  p.out = Fp8Problem::view(o.data(), 1, 4, 2, 16);
  p.fp8_v_layout = FLASHATTN_FP8_V_KEYS_PERMUTED16;
  EXPECT_EQ(flashattn_fwd(&p, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("fp8_v_layout: 1, but dtype is bf16"), std::string::npos)
      << flashattn_last_error();
  p.fp8_v_layout = FLASHATTN_FP8_V_ROWS_AUTO;
  EXPECT_EQ(flashattn_fwd(&p, nullptr, 0, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashattn_last_error()).find("fp8_v_layout: 2, but dtype is bf16"), std::string::npos)
      << flashattn_last_error();
}

// fp8_v_layout rows_auto: v in rows, which only the sm90 path may copy (to V^T, where that pays); the host reference
// reads it as rows: the same result bit for bit, fixed length (above the sm90 copy rule too) and varlen, and no
// workspace.
TEST(Fp8AttentionApi, RowsAutoIsRowsOnTheHost) {
  for (bool varlen : {false, true}) {
    Fp8Case c;
    c.sq = 1600, c.sk = 37, c.hq = 2, c.hkv = 1, c.d = 16;
    if (varlen) c.seqlens_q = {1600, 3}, c.seqlens_k = {37, 1};
    Fp8Problem rows(c, 21), autos(c, 21);
    flashattn_fwd_params pr = rows.params(FLASHATTN_BACKEND_AUTO), pa = autos.params(FLASHATTN_BACKEND_AUTO);
    pr.fp8_v_layout = FLASHATTN_FP8_V_ROWS;
    pa.fp8_v_layout = FLASHATTN_FP8_V_ROWS_AUTO;
    size_t ws = 1;
    ASSERT_EQ(flashattn_fwd_workspace_size(&pa, &ws), FLASHATTN_SUCCESS) << flashattn_last_error();
    EXPECT_EQ(ws, 0u);
    ASSERT_EQ(flashattn_fwd(&pr, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
    ASSERT_EQ(flashattn_fwd(&pa, nullptr, 0, nullptr), FLASHATTN_SUCCESS) << flashattn_last_error();
    ASSERT_EQ(rows.out, autos.out) << "varlen " << varlen;
    for (uint16_t x : autos.out) ASSERT_NE(x, 0x7fc1) << "an output left poisoned";
    for (size_t i = 0; i < rows.lse.size(); ++i)
      ASSERT_EQ(std::memcmp(&rows.lse[i], &autos.lse[i], sizeof(float)), 0) << "lse " << i;
  }
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
