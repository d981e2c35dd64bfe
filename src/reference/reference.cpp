#include "reference/reference.h"

#include <cmath>
#include <string>
#include <vector>

#include "common/alibi.h"
#include "common/dropout.h"
#include "common/error.h"
#include "common/half_convert.h"
#include "common/kv_append.h"
#include "common/mask.h"
#include "common/parallel.h"

namespace flashattn::reference {
namespace {

// How intermediates are rounded: not at all (kExact), or to `prec` after every step.
struct Mode {
  bool exact;
  bool given_output;  // exact, but the backward's D from the caller's O
  flashattn_dtype prec;
  template <typename T>
  T r(T x) const {
    return exact ? x : T(round_to_dtype(prec, double(x)));
  }
};

// The score of one (query, key) pair in natural-log units, and tanh's output under softcap
// (needed by the backward: d tanh = 1 - t^2).
template <typename Acc>
struct Score {
  Acc s;
  Acc t;
};

template <typename Acc>
Score<Acc> score(const Mode& md, const MaskOptions& mo, const double* q, const double* k, int d) {
  Acc dot = 0;
  for (int c = 0; c < d; ++c) dot += Acc(q[c]) * Acc(k[c]);
  const Acc scale = Acc(mo.softmax_scale);
  const Acc cap = Acc(mo.softcap);
  if (md.exact) {
    Acc x = dot * scale;
    if (mo.softcap > 0.f) {
      Acc t = std::tanh(x / cap);
      return {cap * t, t};
    }
    return {x, Acc(0)};
  }
  // Unfused: (q @ k^T) -> * scale -> [/ cap -> tanh -> * cap], each result rounded.
  Acc x = md.r(md.r(dot) * scale);
  if (mo.softcap > 0.f) {
    Acc t = md.r(Acc(std::tanh(md.r(x / cap))));
    return {md.r(t * cap), t};
  }
  return {x, Acc(0)};
}

// ALiBi and dropout for one query row i of (sequence b, query head h), written out from the
// definitions in flashattn.h: the bias -slope * |i + seqlen_k - seqlen_q - j| in fp64, added to
// the (capped) natural-log score; the keep decision of Dropout::keep on stream (b, h).
struct RowMods {
  bool alibi = false;
  double slope = 0;
  int diag = 0;  // seqlen_k - seqlen_q of the sequence
  const Dropout* dropout = nullptr;  // null: no dropout
  uint64_t seed = 0, stream = 0;
  int i = 0;
  double scale = 1.0;  // dropout's 1 / keep probability, as the fp32 value every path uses

  double bias(int j) const { return -slope * std::fabs(double(i) + double(diag) - double(j)); }
  bool keep(int j) const { return dropout->keep(seed, stream, i, j); }
};

// Seed and offset as the call sees them, read once per call (rng_state: a host pointer here).
using Rng = Dropout::SeedOffset;

template <class P>
RowMods row_mods(const P& p, const Rng& rng, const SeqBounds& sb, int b, int h) {
  RowMods m;
  if (p.alibi.enabled()) {
    m.alibi = true;
    m.slope = double(p.alibi.slope(b, h));
    m.diag = sb.seqlen_k - sb.seqlen_q;
  }
  if (p.dropout.enabled()) {
    m.dropout = &p.dropout;
    m.seed = rng.seed;
    m.stream = Dropout::stream(rng.offset, b, p.shape.nheads_q, h);
    m.scale = double(p.dropout.scale);
  }
  return m;
}

// The score plus the ALiBi bias of key j (exact, or rounded as an unfused add would be).
template <typename Acc>
Acc with_bias(const Mode& md, const RowMods& mods, Acc s, int j) {
  if (!mods.alibi) return s;
  return md.exact ? s + Acc(mods.bias(j)) : md.r(s + Acc(mods.bias(j)));
}

// One row of d input elements at element offset `off`, in fp64. FP8 inputs are E4M3 codes: each is
// dequantized exactly with its row's block scale `fp8_scale` (the definition in flashattn.h).
// col_stride: elements between a row's columns (FP8's transposed v: the V^T row length).
void load_row(const void* base, flashattn_dtype dtype, int64_t off, int d, double* out, float fp8_scale = 1.f,
              int64_t col_stride = 1) {
  if (dtype == FLASHATTN_DTYPE_FP8_E4M3) {
    const uint8_t* codes = static_cast<const uint8_t*>(base) + off;
    for (int c = 0; c < d; ++c) out[c] = fp8_dequantize_exact(codes[c * col_stride], fp8_scale);
    return;
  }
  for (int c = 0; c < d; ++c) out[c] = load_double(base, dtype, off + c);
}

// One sequence's K and V (one kv head) gathered into contiguous fp64 [seqlen_k, d] arrays, through
// the KV cache's addressing (plain k/v when it is off). `fp8` and `nheads_kv` are read for FP8 inputs
// only (which have no KV cache: key row j is row j of sequence b).
void gather_kv(const void* k, const void* v, flashattn_dtype dtype, const RowStrides& ks, const RowStrides& vs,
               const KvCache& kv, int b, const SeqBounds& sb, int kvh, int d, std::vector<double>* K,
               std::vector<double>* V, const Fp8Scales& fp8 = Fp8Scales{}, int nheads_kv = 0,
               int64_t v_col_stride = 1) {
  const bool fp8_input = dtype == FLASHATTN_DTYPE_FP8_E4M3;
  K->resize(size_t(sb.seqlen_k) * d);
  V->resize(size_t(sb.seqlen_k) * d);
  for (int j = 0; j < sb.seqlen_k; ++j) {
    const float k_scale = fp8_input ? fp8.k_scale(b, kvh, nheads_kv, j) : 1.f;
    const float v_scale = fp8_input ? fp8.v_scale(b, kvh, nheads_kv, j) : 1.f;
    load_row(k, dtype, key_offset(ks, kv, b, sb, j, kvh), d, K->data() + size_t(j) * d, k_scale);
    if (fp8_input && fp8.v_keys_permuted16) {  // V^T, keys permuted in groups of 16 (flashattn.h)
      load_row(v, dtype, key_offset(vs, kv, b, sb, fp8_v_key_position(j), kvh), d, V->data() + size_t(j) * d, v_scale,
               v_col_stride);
    } else {
      load_row(v, dtype, key_offset(vs, kv, b, sb, j, kvh), d, V->data() + size_t(j) * d, v_scale);
    }
  }
}

void gather_kv(const FwdParams& p, int b, const SeqBounds& sb, int kvh, std::vector<double>* K, std::vector<double>* V) {
  gather_kv(p.k, p.v, p.dtype, p.k_stride, p.v_stride, p.kv, b, sb, kvh, p.shape.headdim, K, V, p.fp8,
            p.shape.nheads_kv, p.fp8.v_col_stride);
}

// Query row i of (sequence b, head h), rotated when the call has a rotary embedding.
void load_q_row(const Mode& md, const FwdParams& p, const SeqBounds& sb, int b, int h, int i, double* q) {
  const float q_scale = p.dtype == FLASHATTN_DTYPE_FP8_E4M3 ? p.fp8.q_scale(b, h, p.shape.nheads_q, i) : 1.f;
  load_row(p.q, p.dtype, row_offset(p.q_stride, b, sb.q_offset, i, h), p.shape.headdim, q, q_scale);
  // Rotated q is an input held in the problem's dtype (flashattn.h): rounded in every mode.
  if (p.kv.rotary()) rotate_row_fp64(p.kv, p.dtype, md.prec, p.kv.q_position(b, i), q);
}

// Forward of one query row over keys [kb, ke) of K/V: writes o[0, d), returns the LSE.
// `s` is scratch of at least seqlen_k entries.
template <typename Acc>
double fwd_row_core(const Mode& md, const MaskOptions& mo, const RowMods& mods, int kb, int ke, int d,
                    const double* q, const double* K, const double* V, double* o, std::vector<Acc>& s) {
  if (ke <= kb) {
    for (int c = 0; c < d; ++c) o[c] = 0.0;
    return -INFINITY;
  }
  Acc m = -INFINITY;
  for (int j = kb; j < ke; ++j) {
    s[j] = with_bias<Acc>(md, mods, score<Acc>(md, mo, q, K + size_t(j) * d, d).s, j);
    if (s[j] > m) m = s[j];
  }
  Acc l = 0;
  for (int j = kb; j < ke; ++j) {
    s[j] = std::exp(s[j] - m);
    l += s[j];
  }
  // The LSE is of the undropped P; dropout zeroes entries of P and scales the kept ones (each
  // result rounded, as an unfused masked_fill and division would) before P V.
  std::vector<Acc> acc(size_t(d), Acc(0));
  const Acc dscale = Acc(mods.scale);
  for (int j = kb; j < ke; ++j) {
    Acc pj = md.r(s[j] / l);
    if (mods.dropout) pj = mods.keep(j) ? md.r(pj * dscale) : Acc(0);
    const double* vj = V + size_t(j) * d;
    for (int c = 0; c < d; ++c) acc[c] += pj * Acc(vj[c]);
  }
  for (int c = 0; c < d; ++c) o[c] = double(md.r(acc[c]));
  return double(m) + std::log(double(l));
}

template <typename Acc>
flashattn_status fwd_impl(const FwdParams& p, const Mode& md) {
  const Shape& sh = p.shape;
  const int d = sh.headdim;
  struct Scratch {
    std::vector<double> K, V, q, o;
    std::vector<Acc> s;
  };
  const Rng rng = p.dropout.resolved();
  if (p.kv.appends()) append_kv_rows(p, md.prec);
  std::string err = parallel_for(
      int64_t(sh.batch) * sh.nheads_q, [] { return Scratch(); },
      [&](int64_t item, Scratch& w) {
        const int b = int(item / sh.nheads_q), h = int(item % sh.nheads_q);
        const SeqBounds sb = seq_bounds(sh, p.cu_seqlens_q, p.cu_seqlens_k, p.kv, b);
        const Mask mask = make_mask(p.mask, sb);
        gather_kv(p, b, sb, sh.kv_head(h), &w.K, &w.V);
        w.q.resize(size_t(d));
        w.o.resize(size_t(d));
        w.s.resize(size_t(sb.seqlen_k) + 1);
        RowMods mods = row_mods(p, rng, sb, b, h);
        for (int i = 0; i < sb.seqlen_q; ++i) {
          load_q_row(md, p, sb, b, h, i, w.q.data());
          mods.i = i;
          double lse = fwd_row_core<Acc>(md, p.mask, mods, mask.key_begin(i), mask.key_end(i), d, w.q.data(),
                                         w.K.data(), w.V.data(), w.o.data(), w.s);
          const int64_t oo = row_offset(p.o_stride, b, sb.q_offset, i, h);
          for (int c = 0; c < d; ++c) store_double(p.o, p.out_dtype(), oo + c, w.o[c]);
          const int64_t li = sb.lse_offset + int64_t(h) * sb.lse_head_stride + i;
          if (p.lse) p.lse[li] = float(lse);
          if (p.lse_fp64) p.lse_fp64[li] = lse;  // not rounded through float
        }
      });
  if (!err.empty()) return set_error(FLASHATTN_ERROR_INTERNAL, "reference forward: %s", err.c_str());
  return FLASHATTN_SUCCESS;
}

template <typename Acc>
flashattn_status bwd_impl(const BwdParams& p, const Mode& md) {
  const Shape& sh = p.shape;
  const int d = sh.headdim;
  const MaskOptions& mo = p.mask;
  const int group = sh.group_size();
  struct Scratch {
    std::vector<double> K, V, q, dout;
    std::vector<Score<Acc>> sc;
    std::vector<Acc> pr, pd, dp, g, dq, dk_h, dv_h, dk, dv;
    std::vector<char> z;  // the row's dropout keep mask
  };
  const Rng rng = p.dropout.resolved();
  std::string err = parallel_for(
      int64_t(sh.batch) * sh.nheads_kv, [] { return Scratch(); },
      [&](int64_t item, Scratch& w) {
        const int b = int(item / sh.nheads_kv), kvh = int(item % sh.nheads_kv);
        const SeqBounds sb = seq_bounds(sh, p.cu_seqlens_q, p.cu_seqlens_k, b);
        const Mask mask = make_mask(mo, sb);
        const int sk = sb.seqlen_k;
        gather_kv(p.k, p.v, p.dtype, p.k_stride, p.v_stride, KvCache{}, b, sb, kvh, d, &w.K, &w.V);
        w.q.resize(size_t(d));
        w.dout.resize(size_t(d));
        w.sc.resize(size_t(sk) + 1);
        for (auto* vec : {&w.pr, &w.pd, &w.dp, &w.g}) vec->assign(size_t(sk) + 1, Acc(0));
        w.z.assign(size_t(sk) + 1, 1);
        w.dq.assign(size_t(d), Acc(0));
        for (auto* vec : {&w.dk_h, &w.dv_h, &w.dk, &w.dv}) vec->assign(size_t(sk) * d, Acc(0));
        const Acc scale = Acc(mo.softmax_scale);
        const Acc cap = Acc(mo.softcap);
        const bool softcap = mo.softcap > 0.f;
        // Given an fp64 LSE (fp64 problems through the C ABI), P and D come from the caller's LSE
        // and O, as on every other backend: exact for a whole row as before, and also right when
        // K/V is only part of the row's keys (ring attention hands one block at a time).
        const bool given_stats = p.lse_fp64 != nullptr;
        for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
          RowMods mods = row_mods(p, rng, sb, b, h);
          const Acc dscale = Acc(mods.scale);
          for (int i = 0; i < sb.seqlen_q; ++i) {
            mods.i = i;
            const int kb = mask.key_begin(i), ke = mask.key_end(i);
            const int64_t dqo = row_offset(p.dq_stride, b, sb.q_offset, i, h);
            if (ke <= kb) {  // sees no key: zero gradient
              for (int c = 0; c < d; ++c) store_double(p.dq, p.dtype, dqo + c, 0.0);
              continue;
            }
            load_row(p.q, p.dtype, row_offset(p.q_stride, b, sb.q_offset, i, h), d, w.q.data());
            load_row(p.dout, p.dtype, row_offset(p.dout_stride, b, sb.q_offset, i, h), d, w.dout.data());
            // Recompute P.
            Acc m = -INFINITY;
            for (int j = kb; j < ke; ++j) {
              // The bias enters P only: .t (softcap's derivative) stays that of the capped score.
              w.sc[j] = score<Acc>(md, mo, w.q.data(), w.K.data() + size_t(j) * d, d);
              w.sc[j].s = with_bias<Acc>(md, mods, w.sc[j].s, j);
              if (w.sc[j].s > m) m = w.sc[j].s;
            }
            if (given_stats) {
              const Acc lse = Acc(p.lse_fp64[sb.lse_offset + int64_t(h) * sb.lse_head_stride + i]);
              for (int j = kb; j < ke; ++j) w.pr[j] = md.r(Acc(std::exp(w.sc[j].s - lse)));
            } else {
              Acc l = 0;
              for (int j = kb; j < ke; ++j) {
                w.pr[j] = std::exp(w.sc[j].s - m);
                l += w.pr[j];
              }
              for (int j = kb; j < ke; ++j) w.pr[j] = md.r(w.pr[j] / l);
            }
            // Dropout: the forward's O = (P o Z * scale) V with keep mask Z, so pd = P o Z * scale
            // (what dV sees) and dP = Z * scale * (dO V^T) (the gradient through the mask).
            if (mods.dropout)
              for (int j = kb; j < ke; ++j) w.z[j] = mods.keep(j);
            for (int j = kb; j < ke; ++j)
              w.pd[j] = !mods.dropout ? w.pr[j] : (w.z[j] ? md.r(w.pr[j] * dscale) : Acc(0));
            // dP = dO V^T, dS = P * (dP - D) with D = rowsum(dP * P) = rowsum(dO * O). Exact:
            // the former. Unfused: the latter on the output rounded to the input precision,
            // as a fused backward must do (it is handed O in the input dtype); this rounding
            // dominates the error of short rows with large dO . O.
            Acc D = 0;
            for (int j = kb; j < ke; ++j) {
              Acc acc = 0;
              const double* vj = w.V.data() + size_t(j) * d;
              for (int c = 0; c < d; ++c) acc += Acc(w.dout[c]) * Acc(vj[c]);
              w.dp[j] = md.r(acc);
              if (mods.dropout) w.dp[j] = w.z[j] ? md.r(w.dp[j] * dscale) : Acc(0);
              if (md.exact && !md.given_output && !given_stats) D += w.pr[j] * w.dp[j];
            }
            if (md.given_output || given_stats) {
              const int64_t oo = row_offset(p.o_stride, b, sb.q_offset, i, h);
              for (int c = 0; c < d; ++c) D += Acc(w.dout[c]) * Acc(load_double(p.o, p.dtype, oo + c));
            } else if (!md.exact) {
              for (int c = 0; c < d; ++c) w.dq[c] = 0;  // the output row, as the forward computes it
              for (int j = kb; j < ke; ++j) {
                const double* vj = w.V.data() + size_t(j) * d;
                for (int c = 0; c < d; ++c) w.dq[c] += w.pd[j] * Acc(vj[c]);
              }
              for (int c = 0; c < d; ++c) D += Acc(w.dout[c]) * md.r(w.dq[c]);
            }
            for (int j = kb; j < ke; ++j) {
              Acc ds = md.r(w.pr[j] * (w.dp[j] - D));
              Acc g;
              if (md.exact) {
                g = ds * scale * (softcap ? Acc(1) - w.sc[j].t * w.sc[j].t : Acc(1));
              } else if (softcap) {
                // Back through * cap, tanh (1 - y^2), / cap, * scale, each rounded.
                g = md.r(ds * cap);
                g = md.r(g * (Acc(1) - w.sc[j].t * w.sc[j].t));
                g = md.r(g / cap);
                g = md.r(g * scale);
              } else {
                g = md.r(ds * scale);
              }
              w.g[j] = g;
            }
            // dQ_i = g K; dK_j += g_j q_i; dV_j += P_j dO_i.
            for (int c = 0; c < d; ++c) w.dq[c] = 0;
            for (int j = kb; j < ke; ++j) {
              const double* kj = w.K.data() + size_t(j) * d;
              Acc* dkj = w.dk_h.data() + size_t(j) * d;
              Acc* dvj = w.dv_h.data() + size_t(j) * d;
              const Acc gj = w.g[j], pj = w.pd[j];
              for (int c = 0; c < d; ++c) {
                w.dq[c] += gj * Acc(kj[c]);
                dkj[c] += gj * Acc(w.q[c]);
                dvj[c] += pj * Acc(w.dout[c]);
              }
            }
            for (int c = 0; c < d; ++c) store_double(p.dq, p.dtype, dqo + c, double(md.r(w.dq[c])));
          }
          // GQA: the unfused version repeats K/V per query head and sums the (rounded)
          // per-head gradients.
          for (size_t x = 0; x < w.dk.size(); ++x) {
            w.dk[x] += md.r(w.dk_h[x]);
            w.dv[x] += md.r(w.dv_h[x]);
            w.dk_h[x] = w.dv_h[x] = Acc(0);
          }
        }
        for (int j = 0; j < sk; ++j) {
          const int64_t dko = row_offset(p.dk_stride, b, sb.k_offset, j, kvh);
          const int64_t dvo = row_offset(p.dv_stride, b, sb.k_offset, j, kvh);
          for (int c = 0; c < d; ++c) {
            store_double(p.dk, p.dtype, dko + c, double(md.r(w.dk[size_t(j) * d + c])));
            store_double(p.dv, p.dtype, dvo + c, double(md.r(w.dv[size_t(j) * d + c])));
          }
        }
      });
  if (!err.empty()) return set_error(FLASHATTN_ERROR_INTERNAL, "reference backward: %s", err.c_str());
  return FLASHATTN_SUCCESS;
}

Mode make_mode(Rounding r, flashattn_dtype precision) {
  return Mode{r != Rounding::kInputPrecision, r == Rounding::kExactGivenOutput, precision};
}

// fp32 accumulation for the unfused emulation of fp16/bf16/fp32, fp64 otherwise.
bool accumulate_in_float(const Mode& md) { return !md.exact && md.prec != FLASHATTN_DTYPE_FP64; }

const char* unsupported_dtype(flashattn_dtype dtype, bool forward) {
  switch (dtype) {
    case FLASHATTN_DTYPE_FP16:
    case FLASHATTN_DTYPE_BF16:
    case FLASHATTN_DTYPE_FP32:
    case FLASHATTN_DTYPE_FP64: return nullptr;
    case FLASHATTN_DTYPE_FP8_E4M3:
      return forward ? nullptr : "dtype: fp8_e4m3 has no backward (FP8 attention is forward-only)";
  }
  return "dtype: unknown value for the reference backend";
}

// FP8 is computed exactly (the dequantized inputs in fp64); there is no "standard attention at
// input precision" for it: a fused FP8 kernel is held to the exact result with a bound from E4M3's
// precision instead (docs/fp8.md).
const char* unsupported_rounding(const FwdParams& p, Rounding r) {
  if (p.dtype == FLASHATTN_DTYPE_FP8_E4M3 && r == Rounding::kInputPrecision)
    return "dtype: fp8_e4m3 has no input-precision emulation (Rounding::kInputPrecision); use Rounding::kExact";
  return nullptr;
}

const char* fwd_unsupported(const FwdParams& p) { return unsupported_dtype(p.dtype, true); }
const char* bwd_unsupported(const BwdParams& p) { return unsupported_dtype(p.dtype, false); }
size_t fwd_ws(const FwdParams&) { return 0; }
size_t bwd_ws(const BwdParams&) { return 0; }
flashattn_status fwd_entry(const FwdParams& p, void*, void*) { return fwd(p, Rounding::kExact); }
flashattn_status bwd_entry(const BwdParams& p, void*, void*) { return bwd(p, Rounding::kExact); }

}  // namespace

flashattn_status fwd(const FwdParams& p, Rounding rounding, flashattn_dtype precision) {
  if (const char* why = unsupported_dtype(p.dtype, true)) return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "%s", why);
  if (const char* why = unsupported_rounding(p, rounding)) return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "%s", why);
  const Mode md = make_mode(rounding, precision);
  return accumulate_in_float(md) ? fwd_impl<float>(p, md) : fwd_impl<double>(p, md);
}

flashattn_status bwd(const BwdParams& p, Rounding rounding, flashattn_dtype precision) {
  if (const char* why = unsupported_dtype(p.dtype, false)) return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "%s", why);
  const Mode md = make_mode(rounding, precision);
  return accumulate_in_float(md) ? bwd_impl<float>(p, md) : bwd_impl<double>(p, md);
}

flashattn_status fwd(const FwdParams& p, Rounding rounding) { return fwd(p, rounding, p.dtype); }
flashattn_status bwd(const BwdParams& p, Rounding rounding) { return bwd(p, rounding, p.dtype); }

double fwd_row(const FwdParams& p, Rounding rounding, flashattn_dtype precision, int b, int h, int i,
               double* o) {
  const Shape& sh = p.shape;
  const int d = sh.headdim;
  const Mode md = make_mode(rounding, precision);
  const SeqBounds sb = seq_bounds(sh, p.cu_seqlens_q, p.cu_seqlens_k, p.kv, b);
  const Mask mask = make_mask(p.mask, sb);
  std::vector<double> K, V, q(static_cast<size_t>(d));
  gather_kv(p, b, sb, sh.kv_head(h), &K, &V);
  load_q_row(md, p, sb, b, h, i, q.data());
  RowMods mods = row_mods(p, p.dropout.resolved(), sb, b, h);
  mods.i = i;
  if (accumulate_in_float(md)) {
    std::vector<float> s(size_t(sb.seqlen_k) + 1);
    return fwd_row_core<float>(md, p.mask, mods, mask.key_begin(i), mask.key_end(i), d, q.data(), K.data(),
                               V.data(), o, s);
  }
  std::vector<double> s(size_t(sb.seqlen_k) + 1);
  return fwd_row_core<double>(md, p.mask, mods, mask.key_begin(i), mask.key_end(i), d, q.data(), K.data(),
                              V.data(), o, s);
}

}  // namespace flashattn::reference

namespace flashattn {

const Backend kReferenceBackend = {
    FLASHATTN_BACKEND_REFERENCE,
    /*on_device=*/false,
    /*min_cc=*/0,
    /*max_cc=*/0,
    reference::fwd_unsupported,
    reference::fwd_ws,
    reference::fwd_entry,
    reference::bwd_unsupported,
    reference::bwd_ws,
    reference::bwd_entry,
};

}  // namespace flashattn
