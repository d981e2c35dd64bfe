// FP8 attention problems for the tests (tests/test_fp8_attention.cpp on the host reference,
// tests/gpu/test_gpu_fp8_attention.cpp on the sm90 kernel): random E4M3 codes over the whole range
// and block scales, the C params that run them, and fp64 attention of the dequantized inputs
// written out independently of the library.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/fp8.h"
#include "common/fp8_scales.h"
#include "common/half_convert.h"
#include "flashattn/flashattn.h"
#include "test_util.h"

namespace flashattn::test::fp8 {

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
  float softmax_scale = 0.f;              // 0: 1 / sqrt(d)
  bool alibi = false;                     // slopes 2^(-8 (h + 1) / hq), one per query head
  int v_scale_exp = 2;                    // V's block scales are u 2^e / 60, |e| <= this
  int zero_scale_every = 0;               // > 0: K and V scale blocks n, 2n, ... (from block 1) are 0

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
    if (softmax_scale > 0) s += " scale" + std::to_string(softmax_scale);
    if (alibi) s += " alibi";
    if (v_scale_exp != 2) s += " vscale2^+-" + std::to_string(v_scale_exp);
    if (zero_scale_every > 0) s += " zero-scale-every" + std::to_string(zero_scale_every);
    return s;
  }
};

inline void PrintTo(const Fp8Case& c, std::ostream* os) { *os << c.str(); }

inline int blocks(int seqlen, int block) { return int((int64_t(seqlen) + block - 1) / block); }

// One FP8 problem: contiguous [b, s, h, d] code tensors (varlen: packed [1, total, h, d]), scales
// [batch, heads, ceil(max_seqlen / block)], poisoned outputs, and the C params that run it.
struct Fp8Problem {
  Fp8Case c;
  uint64_t seed;
  std::vector<int32_t> cu_q, cu_k;
  int rows_q = 0, rows_k = 0;  // rows of the (packed) tensors per batch entry
  std::vector<uint8_t> q, k, v;
  std::vector<float> q_scale, k_scale, v_scale;
  std::vector<float> slopes;  // ALiBi, [hq] (empty: off)
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
    auto scales = [&](std::vector<float>& t, size_t n, std::uniform_int_distribution<int>& e) {
      t.resize(n);
      const float common = std::ldexp(ud(rng), e(rng)) / 60.f;
      for (auto& x : t) x = c.per_tensor ? common : std::ldexp(ud(rng), e(rng)) / 60.f;
    };
    // A wider V spread puts consecutive key blocks' V scales far apart (the kernel keeps O in the
    // largest one so far and shifts P by the ratio, clamped at 2^-64: mainloop.h).
    std::uniform_int_distribution<int> ev(-c.v_scale_exp, c.v_scale_exp);
    scales(q_scale, size_t(c.batch) * c.hq * blocks(c.sq, c.q_block), ed);
    scales(k_scale, size_t(c.batch) * c.hkv * blocks(c.sk, c.k_block), ed);
    scales(v_scale, size_t(c.batch) * c.hkv * blocks(c.sk, c.k_block), c.v_scale_exp == 2 ? ed : ev);
    // Zero scales (a caller's own; the quantizer never writes 0): those keys score exactly 0 and
    // add nothing to O, also where they are masked (a zero scale must not turn -inf into NaN).
    if (c.zero_scale_every > 0)
      for (size_t i = 1; i < k_scale.size(); i += size_t(c.zero_scale_every)) k_scale[i] = v_scale[i] = 0.f;
    if (c.alibi)
      for (int h = 0; h < c.hq; ++h) slopes.push_back(std::exp2(-8.f * float(h + 1) / float(c.hq)));
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
    p.options.softmax_scale = c.softmax_scale;
    if (c.alibi) p.alibi_slopes = slopes.data();
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

  // fp8_v_layout keys_permuted16 (flashattn.h): v written again as V^T [b, hkv, d, row_len], keys
  // permuted within each 16 (common/fp8_scales.h), the padding past sk zero; p's v then points at it.
  // Fixed-length problems only.
  std::vector<uint8_t> vt;
  void use_keys_permuted16(flashattn_fwd_params& p, int row_len) {
    vt.assign(size_t(c.batch) * c.hkv * c.d * row_len, 0);
    for (int b = 0; b < c.batch; ++b)
      for (int j = 0; j < c.sk; ++j)
        for (int h = 0; h < c.hkv; ++h)
          for (int x = 0; x < c.d; ++x)
            vt[((size_t(b) * c.hkv + h) * c.d + x) * row_len + size_t(flashattn::fp8_v_key_position(j))] =
                v[((size_t(b) * c.sk + j) * c.hkv + h) * c.d + x];
    p.v.data = vt.data();
    p.v.stride[0] = int64_t(c.hkv) * c.d * row_len, p.v.stride[1] = 1;
    p.v.stride[2] = int64_t(c.d) * row_len, p.v.stride[3] = row_len;
    p.fp8_v_layout = FLASHATTN_FP8_V_KEYS_PERMUTED16;
  }

  double out_at(size_t i) const {
    return c.out_dtype == FLASHATTN_DTYPE_FP16 ? flashattn::half_to_float(out[i]) : flashattn::bf16_to_float(out[i]);
  }
};

// The definition, written out: dequantize (code value times the scale of block row / block_size,
// rows counted from the sequence's start, k/v scales by kv head), then fp64 attention with the
// header's bottom-right aligned mask, softcap and GQA. Returns O [rows_q, hq, d] per batch entry
// (varlen: packed) and LSE in the layout of Fp8Problem::lse.
// For a kernel's error bound (tests/gpu/test_gpu_fp8_attention.cpp), per output element:
// pv_abs = sum_j P_ij |v_jc| and ds_pv = sum_j P_ij ds_ij (|v_jc| + |O_ic|), ds_ij = 2^-9 times
// the softmax scale times sum_c |q_ic k_jc|: Hopper's FP8 WGMMA is reported to keep ~14 bits when
// it adds a K = 32 chunk's products (aligned to the largest one), which can lose up to ~32 x 2^-14
// of that chunk's largest product (2^-12 measured too tight once in ~20 sharp cases: an LSE off
// by 0.04 at LSE 53); per row ds_max = max_j ds_ij.
// p_flush = sum_j min(P_ij, 2^-18 (vmax / vs_j) / l_i) |v_jc|: P is rounded to E4M3 as
// p 2^8 vs_j / v_o with p = exp(s - running max) <= 1 (vs_j the key's V scale, v_o <= vmax the
// V scale O is kept in: the largest of the tile's blocks so far, bounded here by the largest of
// the sequence's), and below E4M3's smallest normal (2^-6) the spacing is fixed at 2^-9, so a
// small p is off by up to min(p, 2^-18 v_o / vs_j) absolute, not 2^-4 relative; a later larger
// max only shrinks that (found on a sharp window case: O was 0 where -7e-6 was expected, 1.27x
// the bound without this term).
struct Expected {
  std::vector<double> o, lse;
  std::vector<double> pv_abs, ds_pv, ds_max, p_flush;
};

inline Expected attention_of_dequantized(const Fp8Problem& P) {
  const Fp8Case& c = P.c;
  const int tb = c.varlen() ? 1 : c.batch;
  Expected e;
  e.o.assign(size_t(tb) * P.rows_q * c.hq * c.d, 0.0);
  e.lse.assign(P.lse.size(), 0.0);
  e.pv_abs.assign(e.o.size(), 0.0);
  e.ds_pv.assign(e.o.size(), 0.0);
  e.ds_max.assign(P.lse.size(), 0.0);
  e.p_flush.assign(e.o.size(), 0.0);
  const double scale = c.softmax_scale > 0 ? double(c.softmax_scale) : 1.0 / std::sqrt(double(c.d));
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
        std::vector<double> s(size_t(sk), -INFINITY), ds(size_t(sk), 0.0);
        double m = -INFINITY;
        for (int j = 0; j < sk; ++j) {
          const int shift = sk - sq;  // bottom-right alignment
          const int wr = c.causal ? 0 : c.window_right;
          if (c.window_left >= 0 && j < i + shift - c.window_left) continue;
          if (wr >= 0 && j > i + shift + wr) continue;
          const double ks = P.k_scale[(size_t(b) * c.hkv + kvh) * nbk + j / c.k_block];
          double dot = 0, dot_abs = 0;
          for (int x = 0; x < c.d; ++x) {
            const double qv = double(e4m3_to_float(P.q[((size_t(tbi) * P.rows_q + q0 + i) * c.hq + h) * c.d + x])) * qs;
            const double kv = double(e4m3_to_float(P.k[((size_t(tbi) * P.rows_k + k0 + j) * c.hkv + kvh) * c.d + x])) * ks;
            dot += qv * kv;
            dot_abs += std::fabs(qv * kv);
          }
          ds[j] = std::ldexp(dot_abs * scale, -9);
          double sc = dot * double(float(scale));  // the library takes softmax_scale as a float
          if (c.softcap > 0) sc = double(c.softcap) * std::tanh(sc / double(c.softcap));
          if (c.alibi) sc -= double(P.slopes[h]) * std::fabs(double(i + shift - j));  // after the softcap
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
        double vmax = 0;  // the largest V scale of the sequence's key blocks
        for (int j = 0; j < sk; j += std::min(c.k_block, sk))
          vmax = std::max(vmax, double(P.v_scale[(size_t(b) * c.hkv + kvh) * nbk + j / c.k_block]));
        const size_t oi = ((size_t(tbi) * P.rows_q + q0 + i) * c.hq + h) * c.d;
        for (int j = 0; j < sk; ++j) {
          const double pj = std::exp(s[j] - m) / l;
          if (pj == 0) continue;
          const double vs = P.v_scale[(size_t(b) * c.hkv + kvh) * nbk + j / c.k_block];
          const double pj_flush = vs > 0 ? std::min(pj, std::ldexp(vmax / vs / l, -18)) : 0.0;
          for (int x = 0; x < c.d; ++x) {
            const double vv = double(e4m3_to_float(P.v[((size_t(tbi) * P.rows_k + k0 + j) * c.hkv + kvh) * c.d + x])) * vs;
            e.p_flush[oi + x] += pj_flush * std::fabs(vv);
            o[x] += pj * vv;
            e.pv_abs[oi + x] += pj * std::fabs(vv);
            e.ds_pv[oi + x] += pj * ds[j] * std::fabs(vv);
          }
          e.ds_max[li] = std::max(e.ds_max[li], ds[j]);
        }
        double pds = 0;  // sum_j P_ij ds_ij, for the |O_ic| part of ds_pv
        for (int j = 0; j < sk; ++j) pds += std::exp(s[j] - m) / l * ds[j];
        for (int x = 0; x < c.d; ++x) e.ds_pv[oi + x] += pds * std::fabs(o[x]);
        e.lse[li] = m + std::log(l);
      }
    }
  }
  return e;
}

// out equals the expected O rounded to out_dtype (one rounding: |out - O| <= u |O|, u the unit
// roundoff, plus fp16's subnormal spacing and fp64 noise between two summation orders); LSE equals
// the expected one rounded to fp32. Rows outside every sequence (varlen) are not checked.
inline void expect_matches(const Fp8Problem& P, const Expected& e) {
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

}  // namespace flashattn::test::fp8
