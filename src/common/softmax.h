// Online-softmax arithmetic shared by every path. Scores are kept in the log2 domain: the
// softmax scale and log2(e) are folded into one multiplier so each element costs one FMA and
// one exp2 (FA2/FA3). Fully masked rows (max = -inf) are guarded so they never produce NaN.
#pragma once

#include <cmath>

#include "common/hd.h"

namespace flashattn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// How far (log2 units) a row's max may run ahead of the stale one the GPU forwards keep
// (OnlineSoftmaxRow::update_max_lazy): terms stay <= 2^8, well inside fp16/bf16 and fp32.
constexpr float kLazyMaxSlackLog2 = 8.f;
// The GPU forwards skip the O rescale (lazy max) from this head dim on. Same-run A/B on an
// H100 (docs/perf-notes.md): +3-6% at hdim 128/256, but -5 to -9% at hdim 64, where the O
// rescale is cheap and the skip's branch splits the softmax from the next GEMM's loads.
constexpr int kLazyMaxMinHeadDim = 128;

// Scores transform before the softmax. With softcap: s = cap * tanh(scale * qk / cap), so the
// exponent multiplier is log2(e) alone; without it the scale folds into the multiplier.
struct ScoreTransform {
  float pre_scale;   // multiplies qk before tanh (softcap only)
  float softcap;     // 0 = off
  float exp2_scale;  // multiplies the (capped) score in the exp2 argument

  FA_HD static ScoreTransform make(float softmax_scale, float softcap) {
    ScoreTransform t;
    if (softcap > 0.f) {
      t.pre_scale = softmax_scale / softcap;
      t.softcap = softcap;
      t.exp2_scale = kLog2e;
    } else {
      t.pre_scale = 1.f;
      t.softcap = 0.f;
      t.exp2_scale = softmax_scale * kLog2e;
    }
    return t;
  }
  // Raw qk -> score in "exp2_scale units" (i.e. before multiplying by exp2_scale).
  FA_HD float apply(float qk) const { return softcap > 0.f ? softcap * tanhf(qk * pre_scale) : qk; }
  // d(apply)/d(qk) * (softcap only); without softcap the scale is applied by the caller.
  // Given the capped value c = apply(qk): dc/dqk = pre_scale * softcap * (1 - (c/softcap)^2)
  //                                              = softmax_scale * (1 - (c/softcap)^2).
  FA_HD float dtanh_factor(float capped) const {
    if (softcap <= 0.f) return 1.f;
    float t = capped / softcap;
    return 1.f - t * t;
  }
  // Natural-log scale of the scores: softmax is over natural_scale * apply(qk).
  FA_HD float natural_scale() const { return exp2_scale * kLn2; }
};

// Running max (in exp2 units already multiplied by exp2_scale) and running sum of one row.
struct OnlineSoftmaxRow {
  float m;  // running max of scaled scores (log2 domain); -inf before any key
  float l;  // running sum of exp2(score - m)

  FA_HD void init() {
    m = -INFINITY;
    l = 0.f;
  }
  // Fold in a tile's max; returns the factor the old accumulator (and l) must be scaled by.
  FA_HD float update_max(float tile_max) {
    float m_new = tile_max > m ? tile_max : m;
    float factor = (m == -INFINITY) ? (m_new == -INFINITY ? 1.f : 0.f) : exp2f(m - m_new);
    m = m_new;
    l *= factor;
    return factor;
  }
  // Lazy variant (FlashAttention-4): keep the old max while the tile's max exceeds it by at most
  // `slack` (log2 units), so the accumulator needs no rescale (factor 1) in almost every tile.
  // Still exact: O and l share the same stale max, and exp2(score - m) <= 2^slack keeps P
  // (and its 16-bit copy) in range.
  FA_HD float update_max_lazy(float tile_max, float slack) {
    if (m != -INFINITY && tile_max <= m + slack) return 1.f;
    return update_max(tile_max);
  }
  // The subtrahend for exp2 of this tile's scores: 0 when the row is still fully masked,
  // so exp2(-inf - 0) = 0 instead of exp2(-inf + inf) = NaN.
  FA_HD float exp_offset() const { return m == -INFINITY ? 0.f : m; }
  // 1/l for the final rescale; 0 for an empty row (output 0, never NaN).
  FA_HD float inv_sum() const { return (l == 0.f || l != l) ? 0.f : 1.f / l; }
  // Natural-log LSE; -inf for an empty row.
  FA_HD float lse() const { return (l == 0.f || l != l) ? -INFINITY : (m + log2f(l)) * kLn2; }
};

}  // namespace flashattn
