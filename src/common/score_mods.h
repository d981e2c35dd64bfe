// ALiBi and dropout as the GPU kernels see them for one (sequence b, query head h): the slope
// already in the ScoreTransform's units and the Philox stream already resolved, so the hot
// loops add one FMA per score (ALiBi) and one Philox per unit of 8 entries (dropout).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/dropout.h"
#include "common/hd.h"
#include "common/params.h"
#include "common/softmax.h"

namespace flashattn {

struct ScoreMods {
  float alibi_coef = 0.f;           // slope / natural scale (the bias in apply()'s units); 0 = off
  int alibi_diag = 0;               // seqlen_k - seqlen_q of the sequence
  uint32_t dropout_threshold = 0;   // 0 = off
  uint64_t seed = 0, stream = 0;    // Philox key and counter words 2-3 of (b, h)

  FA_HD bool alibi() const { return alibi_coef != 0.f; }
  FA_HD bool dropout() const { return dropout_threshold != 0; }
  FA_HD bool any() const { return alibi() || dropout(); }
  // The ALiBi bias of entry (i, j) in the units of ScoreTransform::apply (times exp2_scale: log2).
  FA_HD float alibi_units(int i, int j) const { return -alibi_coef * fabsf(float(i + alibi_diag - j)); }

  template <class Params>
  FA_HD static ScoreMods make(const Params& p, const ScoreTransform& tf, const SeqBounds& sb, int b, int h) {
    ScoreMods m;
    if (p.alibi.enabled()) {
      m.alibi_coef = p.alibi.slope(b, h) / tf.natural_scale();
      m.alibi_diag = sb.seqlen_k - sb.seqlen_q;
    }
    if (p.dropout.enabled()) {
      uint64_t offset;
      p.dropout.resolve(&m.seed, &offset);
      m.dropout_threshold = p.dropout.threshold;
      m.stream = Dropout::stream(offset, b, p.shape.nheads_q, h);
    }
    return m;
  }
};

}  // namespace flashattn
