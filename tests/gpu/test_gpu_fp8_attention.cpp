// The sm90 FP8 (E4M3) forward (issue 16) against fp64 attention of the dequantized inputs
// (tests/fp8_problem.h), on CUDA tensors. The kernel rounds P to E4M3 (2^8 times P, so each
// entry moves by at most 2^-4 of itself in E4M3's normal range, 2^-10 / 2^8 below it) and
// accumulates Q K^T of the codes in the tensor cores (reported to keep ~14 bits), so per output
// element (normalized P, c the head-dim column):
//   |out - O| <= 2^-4 sum_j P_ij |v_jc| + sum_j P_ij ds_ij (|v_jc| + |O_ic|) + 2^-18 sum_j |v_jc| P>0
//               + u |O| (the output's rounding) + 1e-6 sum_j P_ij |v_jc| (fp32 sums)
// with ds_ij = 2^-9 scale sum_c |q_ic k_jc| (fp8_problem.h says why); the bound's terms come from Expected. LSE: within
// max_j ds_ij + 1e-5 |LSE| + 1e-5. The cases make attention sharp (a large softmax scale) as well
// as flat, so that V read in another key order than P's (the transpose's permutation) cannot hide
// in a near-uniform average. Outputs are poisoned with NaN first. Skips without an sm90 device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "flashattn/flashattn.h"
#include "fp8_problem.h"
#include "gpu_test_env.h"
#include "test_util.h"

namespace flashattn::test::fp8 {
namespace {

bool have_sm90(std::string* why) { return sm90_available(why); }

template <class T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, h.size() * sizeof(T) + 16), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

// Runs P on the GPU (backend sm90): its host buffers are copied in, out/lse copied back.
// vt_row_len > 0: V given as V^T with keys permuted in groups of 16, rows of that length
// (fp8_v_layout keys_permuted16).
// rows_layout: v's layout when not V^T (FLASHATTN_FP8_V_ROWS or _ROWS_AUTO). caller_workspace: pass a workspace
// of exactly the queried size, filled with E4M3 NaN codes (0x7F) first, instead of NULL (the library's own).
// ws_query (fixed length): the workspace query's answer for fp8_v_layout rows [0] and for this call's layout [1].
flashattn_status run_on_gpu(Fp8Problem& P, flashattn_backend backend = FLASHATTN_BACKEND_SM90, int vt_row_len = 0,
                            int32_t rows_layout = FLASHATTN_FP8_V_ROWS, bool caller_workspace = false,
                            size_t* ws_query = nullptr) {
  flashattn_fwd_params p = P.params(backend);
  p.options.device = 0;
  p.fp8_v_layout = rows_layout;
  if (vt_row_len > 0) P.use_keys_permuted16(p, vt_row_len);
  uint8_t* q = to_device(P.q);
  uint8_t* k = to_device(P.k);
  uint8_t* v = to_device(vt_row_len > 0 ? P.vt : P.v);
  uint16_t* out = to_device(P.out);  // NaN-poisoned by Fp8Problem
  float* lse = to_device(P.lse);
  float* qs = to_device(P.q_scale);
  float* ks = to_device(P.k_scale);
  float* vs = to_device(P.v_scale);
  int32_t* cu_q = P.c.varlen() ? to_device(P.cu_q) : nullptr;
  int32_t* cu_k = P.c.varlen() ? to_device(P.cu_k) : nullptr;
  float* slopes = P.c.alibi ? to_device(P.slopes) : nullptr;
  p.q.data = q, p.k.data = k, p.v.data = v, p.out.data = out, p.lse = lse;
  p.fp8.q_scale = qs, p.fp8.k_scale = ks, p.fp8.v_scale = vs;
  if (P.c.varlen()) p.varlen.cu_seqlens_q = cu_q, p.varlen.cu_seqlens_k = cu_k;
  if (P.c.alibi) p.alibi_slopes = slopes;
  void* ws = nullptr;
  size_t ws_bytes = 0;
  if (ws_query != nullptr) {
    const int32_t layout = p.fp8_v_layout;
    p.fp8_v_layout = FLASHATTN_FP8_V_ROWS;
    EXPECT_EQ(flashattn_fwd_workspace_size(&p, &ws_query[0]), FLASHATTN_SUCCESS) << flashattn_last_error();
    p.fp8_v_layout = layout;
    EXPECT_EQ(flashattn_fwd_workspace_size(&p, &ws_query[1]), FLASHATTN_SUCCESS) << flashattn_last_error();
  }
  if (caller_workspace) {
    EXPECT_EQ(flashattn_fwd_workspace_size(&p, &ws_bytes), FLASHATTN_SUCCESS) << flashattn_last_error();
    if (ws_bytes > 0) {
      EXPECT_EQ(cudaMalloc(&ws, ws_bytes), cudaSuccess);
      EXPECT_EQ(cudaMemset(ws, 0x7F, ws_bytes), cudaSuccess);
    }
  }
  const flashattn_status st = flashattn_fwd(&p, ws, ws_bytes, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (ws) cudaFree(ws);
  if (st == FLASHATTN_SUCCESS) {
    EXPECT_EQ(cudaMemcpy(P.out.data(), out, P.out.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(P.lse.data(), lse, P.lse.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  for (void* x : {(void*)q, (void*)k, (void*)v, (void*)out, (void*)lse, (void*)qs, (void*)ks, (void*)vs,
                  (void*)cu_q, (void*)cu_k, (void*)slopes})
    if (x) cudaFree(x);
  return st;
}

void expect_within_fp8_bound(const Fp8Problem& P, const Expected& e) {
  const double u = unit_roundoff(P.c.out_dtype);
  size_t bad = 0, checked = 0;
  double worst = 0, err2 = 0, ref2 = 0;
  for (size_t i = 0; i < e.o.size(); ++i) {
    const double got = P.out_at(i), want = e.o[i];
    const double tol = std::ldexp(e.pv_abs[i], -4) + e.ds_pv[i] + 1e-6 * e.pv_abs[i] + u * std::fabs(want) +
                       std::ldexp(e.pv_abs[i], -18) + e.p_flush[i] + 1e-6;
    const double err = std::fabs(got - want);
    if (!(err <= tol) && bad++ < 5)
      ADD_FAILURE() << P.c.str() << " seed " << P.seed << ": out[" << i << "] = " << got << ", expected " << want
                    << " (err " << err << " > bound " << tol << ")";
    if (std::isfinite(err)) worst = std::max(worst, err / tol);
    err2 += err * err;
    ref2 += want * want;
    ++checked;
  }
  EXPECT_EQ(bad, 0u) << P.c.str() << ": worst error / bound " << worst;
  // Not a pass rule, just in the log: how far inside the bound the kernel is.
  std::printf("  %s: max err/bound %.3f, relative RMS error %.2e over %zu elements\n", P.c.str().c_str(), worst,
              std::sqrt(err2 / std::max(ref2, 1e-300)), checked);
  size_t bad_lse = 0;
  for (size_t i = 0; i < e.lse.size(); ++i) {
    const double got = P.lse[i], want = e.lse[i];
    const bool ok = std::isinf(want) ? got == want
                                     : std::fabs(got - want) <= e.ds_max[i] + 1e-5 * std::fabs(want) + 1e-5;
    if (!ok && bad_lse++ < 5)
      ADD_FAILURE() << P.c.str() << " seed " << P.seed << ": lse[" << i << "] = " << got << ", expected " << want;
  }
  EXPECT_EQ(bad_lse, 0u);
}

// A head dim this build did not compile (-DFLASHATTN_HEADDIMS): the case skips, naming it.
bool skip_uncompiled(flashattn_status st) {
  return st == FLASHATTN_ERROR_NOT_SUPPORTED &&
         std::string(flashattn_last_error()).find("no sm90 FP8 kernel for it in this build") != std::string::npos;
}

class GpuFp8Attention : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(GpuFp8Attention, WithinE4M3BoundOfTheDequantizedAttention) {
  std::string why;
  if (!have_sm90(&why)) GTEST_SKIP() << why;
  const uint64_t seed = fresh_seed();
  Fp8Problem P(GetParam(), seed);
  const flashattn_status st = run_on_gpu(P);
  if (skip_uncompiled(st)) GTEST_SKIP() << flashattn_last_error();
  ASSERT_EQ(st, FLASHATTN_SUCCESS) << P.c.str() << ": " << flashattn_last_error();
  expect_within_fp8_bound(P, attention_of_dequantized(P));
}

// hdim 64, 128 and 256 (the FP8 kernels') and 32/96/112/192 (run on them, columns past them zero-filled); block sizes
// that are multiples of the kernel's 64 query rows and 128 keys, and one block per sequence;
// ragged seqlens (1, 7, 113, 799, 4097), seqlen_q != seqlen_k; causal, windows, softcap, ALiBi-free
// GQA/MQA, varlen; sharp attention (softmax scale 0.5 on scores of ~10) and flat.
std::vector<Fp8Case> gpu_cases() {
  std::vector<Fp8Case> v;
  Fp8Case c;
  c = Fp8Case{};
  c.batch = 2, c.sq = 256, c.sk = 256, c.hq = 2, c.hkv = 2, c.d = 128, c.per_tensor = true;
  v.push_back(c);  // per-tensor scale, tile multiples
  c.per_tensor = false, c.softmax_scale = 0.5f;
  v.push_back(c);  // block scales, sharp
  c = Fp8Case{};
  c.batch = 1, c.sq = 799, c.sk = 4097, c.hq = 4, c.hkv = 1, c.d = 128, c.q_block = 64, c.k_block = 256;
  c.softmax_scale = 0.3f;
  v.push_back(c);  // MQA, ragged, coarser key blocks
  c = Fp8Case{};
  c.batch = 2, c.sq = 113, c.sk = 799, c.hq = 4, c.hkv = 2, c.d = 128, c.causal = true;
  c.out_dtype = FLASHATTN_DTYPE_FP16;
  v.push_back(c);  // causal, bottom-right, fp16 out
  c = Fp8Case{};
  c.batch = 1, c.sq = 1, c.sk = 1000, c.hq = 2, c.hkv = 1, c.d = 96, c.q_block = 1000, c.k_block = INT32_MAX;
  c.softcap = 5.f;
  v.push_back(c);  // one query, hdim 96 on the 128 kernel, softcap, one block per sequence
  c = Fp8Case{};
  c.batch = 1, c.sq = 1031, c.sk = 1031, c.hq = 2, c.hkv = 2, c.d = 128, c.window_left = 100, c.window_right = 7;
  c.softmax_scale = 0.5f;
  v.push_back(c);  // local window
  c = Fp8Case{};
  c.seqlens_q = {1, 7, 300, 0, 129}, c.seqlens_k = {799, 7, 113, 5, 1000}, c.hq = 4, c.hkv = 2, c.d = 128;
  c.q_block = 128, c.k_block = 128, c.causal = true;
  v.push_back(c);  // varlen, empty sequence, causal
  c = Fp8Case{};
  c.seqlens_q = {200, 64}, c.seqlens_k = {64, 300}, c.hq = 2, c.hkv = 1, c.d = 112, c.q_block = 64, c.k_block = 128;
  c.softcap = 2.f, c.window_left = 50, c.out_dtype = FLASHATTN_DTYPE_FP16;
  v.push_back(c);  // varlen, hdim 112, softcap + window
  c = Fp8Case{};
  c.batch = 2, c.sq = 300, c.sk = 1031, c.hq = 2, c.hkv = 1, c.d = 256, c.q_block = 64, c.k_block = 256;
  c.softmax_scale = 0.2f;
  v.push_back(c);  // hdim 256, sharp, GQA
  c = Fp8Case{};
  c.batch = 1, c.sq = 799, c.sk = 799, c.hq = 2, c.hkv = 2, c.d = 192, c.causal = true;
  c.out_dtype = FLASHATTN_DTYPE_FP16;
  v.push_back(c);  // hdim 192 on the 256 kernel, causal
  c = Fp8Case{};
  c.batch = 2, c.sq = 300, c.sk = 1031, c.hq = 4, c.hkv = 2, c.d = 128, c.alibi = true, c.softmax_scale = 0.3f;
  v.push_back(c);  // ALiBi: the kernel scales S explicitly there (mainloop.h fp8_scales)
  c = Fp8Case{};
  c.seqlens_q = {129, 7}, c.seqlens_k = {1000, 300}, c.hq = 2, c.hkv = 1, c.d = 128, c.alibi = true;
  c.softcap = 4.f, c.causal = true;
  v.push_back(c);  // ALiBi after the softcap (folded into its pre-scale), varlen, causal
  c = Fp8Case{};
  c.batch = 2, c.sq = 200, c.sk = 2000, c.hq = 2, c.hkv = 1, c.d = 128, c.v_scale_exp = 40;
  v.push_back(c);  // V scales 2^+-40 apart: P shifted by ratios past the 2^-64 clamp, new V maxima
  c.d = 256, c.causal = true, c.sq = 700, c.batch = 1;
  v.push_back(c);  // the same at hdim 256, causal
  c = Fp8Case{};
  c.batch = 2, c.sq = 300, c.sk = 1000, c.hq = 4, c.hkv = 2, c.d = 128, c.causal = true, c.zero_scale_every = 3;
  v.push_back(c);  // zero K and V scale blocks (the last, partial one included), causal: no NaN from masking
  c.d = 256, c.window_left = 200, c.window_right = 0, c.causal = false, c.zero_scale_every = 2;
  v.push_back(c);  // the same at hdim 256 with a window
  c = Fp8Case{};
  c.batch = 2, c.sq = 300, c.sk = 1000, c.hq = 4, c.hkv = 2, c.d = 128, c.zero_scale_every = 3;
  v.push_back(c);  // zero scale blocks without a mask: the unmasked key blocks' path
  c = Fp8Case{};
  c.batch = 2, c.sq = 300, c.sk = 1031, c.hq = 4, c.hkv = 2, c.d = 64, c.causal = true, c.softmax_scale = 0.3f;
  v.push_back(c);  // hdim 64 (V's 64-byte swizzle in the transpose), causal, sharp, GQA
  c = Fp8Case{};
  c.seqlens_q = {113, 1, 64}, c.seqlens_k = {799, 7, 300}, c.hq = 2, c.hkv = 1, c.d = 32, c.q_block = 64;
  c.softcap = 3.f, c.window_left = 100, c.out_dtype = FLASHATTN_DTYPE_FP16;
  v.push_back(c);  // hdim 32 on the 64 kernel, varlen, softcap + window, fp16 out
  return v;
}

INSTANTIATE_TEST_SUITE_P(Sm90, GpuFp8Attention, ::testing::ValuesIn(gpu_cases()),
                         [](const ::testing::TestParamInfo<Fp8Case>& info) { return "case" + std::to_string(info.index); });

// V given as V^T, keys permuted in groups of 16 (fp8_v_layout keys_permuted16): the kernel loads it
// by TMA without its in-kernel transpose. Fixed-length cases of every FP8 head dim (and ones run on
// them), ragged key counts (a partial last group and tile), row lengths past the minimum, the
// options of the main grid; the same bound.
class GpuFp8AttentionVt : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(GpuFp8AttentionVt, KeysPermutedVWithinE4M3Bound) {
  std::string why;
  if (!have_sm90(&why)) GTEST_SKIP() << why;
  const uint64_t seed = fresh_seed();
  Fp8Problem P(GetParam(), seed);
  const int row_len = (P.c.sk + 15) / 16 * 16 + (P.c.sk % 2 ? 48 : 0);
  const flashattn_status st = run_on_gpu(P, FLASHATTN_BACKEND_SM90, row_len);
  if (skip_uncompiled(st)) GTEST_SKIP() << flashattn_last_error();
  ASSERT_EQ(st, FLASHATTN_SUCCESS) << P.c.str() << ": " << flashattn_last_error();
  expect_within_fp8_bound(P, attention_of_dequantized(P));
}

std::vector<Fp8Case> vt_cases() {
  std::vector<Fp8Case> v;
  for (const Fp8Case& c : gpu_cases())
    if (!c.varlen()) v.push_back(c);
  Fp8Case c;
  c.batch = 3, c.sq = 7, c.sk = 1, c.hq = 4, c.hkv = 4, c.d = 128;
  v.push_back(c);  // one key: 15 of the group's 16 positions are padding
  c.sk = 137, c.sq = 129, c.d = 64, c.causal = true, c.softmax_scale = 0.5f;
  v.push_back(c);  // a partial last tile and group at hdim 64, sharp
  c = Fp8Case{};
  c.batch = 2, c.sq = 300, c.sk = 2049, c.hq = 4, c.hkv = 2, c.d = 128, c.q_block = 320, c.k_block = 4096;
  v.push_back(c);  // one scale per (batch, head), FA3's descales, unmasked: where a key block wider than 128 may serve
  c.batch = 1, c.sq = 129, c.sk = 2113, c.softmax_scale = 0.3f, c.softcap = 4.f, c.per_tensor = true;
  v.push_back(c);  // 2113 = 11 x 192 + 1 = 16 x 128 + 65 keys: a short last block either way; softcap; per tensor
  c.sk = 191, c.softcap = 0.f, c.per_tensor = false;
  v.push_back(c);  // fewer keys than one 192-key block
  c.sk = 4099, c.out_dtype = FLASHATTN_DTYPE_FP16, c.hq = 8, c.hkv = 1, c.d = 64;
  v.push_back(c);  // hdim 64 keeps 128-key blocks with per-head scales; GQA 8, fp16 out
  // The wide kernel's lean blocks (mainloop.h kLeanBody: one K/V scale per head, unmasked, >= 2048 keys).
  c = Fp8Case{};
  c.batch = 2, c.sq = 257, c.sk = 4097, c.hq = 4, c.hkv = 2, c.d = 128, c.q_block = 64, c.k_block = 8192;
  c.softmax_scale = 0.5f, c.zero_scale_every = 2;
  v.push_back(c);  // sharp; Q block scales; every other (batch, kv head) with zero K and V scales
  c = Fp8Case{};
  c.batch = 1, c.sq = 1000, c.sk = 2048, c.hq = 8, c.hkv = 1, c.d = 128, c.k_block = 2048, c.v_scale_exp = 40;
  v.push_back(c);  // the threshold (10 x 192 + 128 keys), MQA, per-head V scales up to 2^+-40 (outputs past fp16's range)
  c = Fp8Case{};
  c.batch = 3, c.sq = 64, c.sk = 6001, c.hq = 2, c.hkv = 2, c.d = 128, c.softmax_scale = 0.3f, c.per_tensor = true;
  c.out_dtype = FLASHATTN_DTYPE_FP16;
  v.push_back(c);  // per tensor, 31 x 192 + 49 keys, fp16 out
  c = Fp8Case{};
  c.batch = 1, c.sq = 130, c.sk = 4096, c.hq = 2, c.hkv = 1, c.d = 128, c.k_block = 4096;
  v.push_back(c);  // per head, 21 x 192 + 64 keys: the first block holds exactly 64 keys (the bench rows' shape)
  c.sk = 2305, c.softmax_scale = 0.4f;
  v.push_back(c);  // 12 x 192 + 1 keys: one key in the first block
  // The wide kernel with scale blocks (mainloop.h kGroupBody: each 64-key group of a 192-key block takes its scale
  // block's K/V scales).
  c = Fp8Case{};
  c.batch = 2, c.sq = 257, c.sk = 4097, c.hq = 4, c.hkv = 2, c.d = 128, c.q_block = 64, c.k_block = 128;
  c.softmax_scale = 0.5f, c.zero_scale_every = 3;
  v.push_back(c);  // sharp; zero K/V scale blocks; the first (masked) block's last two groups in a block past the end
  c = Fp8Case{};
  c.batch = 2, c.sq = 200, c.sk = 2049, c.hq = 2, c.hkv = 1, c.d = 128, c.v_scale_exp = 40;
  v.push_back(c);  // V scales 2^+-40 apart: group shifts past the 2^-64 clamp, new V maxima inside a block
  c = Fp8Case{};
  c.batch = 1, c.sq = 130, c.sk = 5000, c.hq = 2, c.hkv = 2, c.d = 128, c.k_block = 384, c.softmax_scale = 0.3f;
  c.out_dtype = FLASHATTN_DTYPE_FP16;
  v.push_back(c);  // 384-key scale blocks: a boundary after the first group of a block too; fp16 out
  // Both wide kernels with more tiles than SMs (160 and 144 on 132), so some CTAs run a second tile: the pipelines'
  // read states, Q's second buffer and the per-tile scales carried across tiles. Few query rows bound the CPU
  // oracle's time (23 s and 40 s on the device).
  c = Fp8Case{};
  c.batch = 2, c.sq = 65, c.sk = 2113, c.hq = 80, c.hkv = 8, c.d = 128, c.k_block = 4096, c.zero_scale_every = 5;
  v.push_back(c);  // per head (the lean kernel), 11 x 192 + 1 keys (the narrow first block), GQA 10
  c = Fp8Case{};
  c.batch = 3, c.sq = 100, c.sk = 2500, c.hq = 48, c.hkv = 16, c.d = 128, c.q_block = 64, c.softmax_scale = 0.4f;
  v.push_back(c);  // 128-token scale blocks (the group kernel), 13 x 192 + 4 keys, GQA 3
  return v;
}

INSTANTIATE_TEST_SUITE_P(Sm90, GpuFp8AttentionVt, ::testing::ValuesIn(vt_cases()),
                         [](const ::testing::TestParamInfo<Fp8Case>& info) { return "case" + std::to_string(info.index); });

// fp8_v_layout rows_auto: v in rows, which the sm90 path copies to V^T in its workspace (and then runs the V^T
// kernel) where the call has >= 1536 unmasked (query row, key) pairs per key and kv head. Each case: within the bound
// of the oracle; the workspace query larger than rows' by exactly the copy (batch x hkv x d x sk rounded up to 16,
// then to 256 bytes) or equal; the output bit for bit that of the V^T layout given (the copy ran) or of rows (it did
// not). The copy cases run with a caller's workspace poisoned with NaN codes, so a read of any byte the copy did not
// write shows.
struct VRowsAutoCase {
  Fp8Case c;
  bool copies;
};

class GpuFp8VRowsAuto : public ::testing::TestWithParam<VRowsAutoCase> {};

TEST_P(GpuFp8VRowsAuto, CopiesWhereItPaysWithinE4M3Bound) {
  std::string why;
  if (!have_sm90(&why)) GTEST_SKIP() << why;
  const VRowsAutoCase& tc = GetParam();
  const uint64_t seed = fresh_seed();
  Fp8Problem P(tc.c, seed), Rows(tc.c, seed), Vt(tc.c, seed);
  size_t ws[2] = {0, 0};
  const flashattn_status st =
      run_on_gpu(P, FLASHATTN_BACKEND_SM90, 0, FLASHATTN_FP8_V_ROWS_AUTO, tc.copies, tc.c.varlen() ? nullptr : ws);
  if (skip_uncompiled(st)) GTEST_SKIP() << flashattn_last_error();
  ASSERT_EQ(st, FLASHATTN_SUCCESS) << P.c.str() << ": " << flashattn_last_error();
  expect_within_fp8_bound(P, attention_of_dequantized(P));

  if (!tc.c.varlen()) {
    const size_t copy = tc.copies ? (size_t(P.c.batch) * P.c.hkv * P.c.d * ((P.c.sk + 15) / 16 * 16) + 255) / 256 * 256
                                  : 0;
    EXPECT_EQ(ws[1], ws[0] + copy) << P.c.str() << ": the workspace of rows_auto vs rows";
  }
  Fp8Problem& same = tc.copies ? Vt : Rows;
  ASSERT_EQ(run_on_gpu(same, FLASHATTN_BACKEND_SM90, tc.copies ? (P.c.sk + 15) / 16 * 16 : 0), FLASHATTN_SUCCESS)
      << flashattn_last_error();
  size_t differ = 0;
  for (size_t i = 0; i < P.out.size(); ++i) differ += P.out[i] != same.out[i];
  EXPECT_EQ(differ, 0u) << tc.c.str() << ": rows_auto's output vs " << (tc.copies ? "keys_permuted16's" : "rows'");
}

std::vector<VRowsAutoCase> v_rows_auto_cases() {
  std::vector<VRowsAutoCase> v;
  Fp8Case c;
  c.batch = 2, c.sq = 1600, c.sk = 300, c.hq = 2, c.hkv = 2, c.d = 64, c.softmax_scale = 0.5f;
  v.push_back({c, true});  // 1600 pairs per key and kv head; a partial last group of 16 keys
  c.sq = 1400;
  v.push_back({c, false});  // 1400
  c = Fp8Case{};
  c.batch = 1, c.sq = 201, c.sk = 2113, c.hq = 8, c.hkv = 1, c.d = 128, c.k_block = 4096;
  v.push_back({c, true});  // MQA: 201 rows x 8 heads; per-head scales, >= 2048 keys: the lean wide V^T kernel
  c.q_block = 64, c.k_block = 128, c.sq = 190;
  v.push_back({c, false});  // 1520 pairs per key: just below
  c = Fp8Case{};
  c.batch = 1, c.sq = 3200, c.sk = 3200, c.hq = 1, c.hkv = 1, c.d = 64, c.causal = true;
  v.push_back({c, true});  // causal: ~1600 pairs per key
  c.sq = c.sk = 2048, c.hq = 2, c.hkv = 2;
  v.push_back({c, false});  // causal: ~1024
  c = Fp8Case{};
  c.batch = 1, c.sq = 2600, c.sk = 2600, c.hq = 1, c.hkv = 1, c.d = 64, c.window_left = 1200, c.window_right = 1200;
  v.push_back({c, true});  // a window: ~1850 pairs per key
  c.window_left = c.window_right = 500;
  v.push_back({c, false});  // ~1000
  c = Fp8Case{};
  c.seqlens_q = {1700, 1800}, c.seqlens_k = {300, 250}, c.hq = 2, c.hkv = 2, c.d = 64;
  v.push_back({c, false});  // varlen: never copied (V^T is for fixed-length batches)
  return v;
}

INSTANTIATE_TEST_SUITE_P(Sm90, GpuFp8VRowsAuto, ::testing::ValuesIn(v_rows_auto_cases()),
                         [](const ::testing::TestParamInfo<VRowsAutoCase>& info) {
                           return "case" + std::to_string(info.index);
                         });

// What the sm90 FP8 kernel does not run is refused naming the field, never run wrongly.
TEST(GpuFp8AttentionApi, RefusesWhatTheKernelCannotRun) {
  std::string why;
  if (!have_sm90(&why)) GTEST_SKIP() << why;
  struct Bad {
    Fp8Case c;
    const char* field;
  };
  std::vector<Bad> bad;
  Fp8Case c;
  c.sq = 200, c.sk = 300, c.d = 128, c.q_block = 32;  // q scale blocks finer than 64 rows
  bad.push_back({c, "fp8.q_block_size"});
  c.q_block = 128, c.k_block = 64;  // k scale blocks finer than a key tile
  bad.push_back({c, "fp8.k_block_size"});
  c.k_block = 128, c.d = 272;  // no FP8 kernel that large
  bad.push_back({c, "headdim"});
  for (Bad& b : bad) {
    Fp8Problem P(b.c, 1);
    EXPECT_EQ(run_on_gpu(P), FLASHATTN_ERROR_NOT_SUPPORTED) << b.c.str();
    EXPECT_NE(std::string(flashattn_last_error()).find(b.field), std::string::npos)
        << b.c.str() << ": " << flashattn_last_error();
  }
  // AUTO on an sm90 device runs FP8 there.
  Fp8Case ok;
  ok.sq = 130, ok.sk = 257, ok.d = 128, ok.hq = 2, ok.hkv = 1;
  Fp8Problem P(ok, fresh_seed());
  ASSERT_EQ(run_on_gpu(P, FLASHATTN_BACKEND_AUTO), FLASHATTN_SUCCESS) << flashattn_last_error();
  expect_within_fp8_bound(P, attention_of_dequantized(P));
}

}  // namespace
}  // namespace flashattn::test::fp8
