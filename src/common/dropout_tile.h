// The dropout keep-mask over a thread's part of an S accumulator (CUDA, CuTe tensors), shared
// by the sm80 (mma.sync) and sm90 (WGMMA) kernels. Both lay a 16-row block of S out so that a
// thread holds entries in quads {i, i+8} x {j, j+1} (j even, i % 16 < 8): in the row/col view
// (rows (2, ...), cols (2, ...)) quad (m, g) is rows 2m, 2m+1 and cols 2g, 2g+1. A dropout
// unit (common/dropout.h) is two quads 8 columns apart, so:
//  - rows are queries (S): one Philox per unit when the thread's column groups 2g' and 2g'+1
//    are 8 columns apart (kPaired: WGMMA, or mma.sync with one warp across the keys), else one
//    per quad (half the unit's numbers unused);
//  - rows are keys (S^T, the sm90 backward): a quad spans two query rows (j, j+1 as queries),
//    each in a different unit, so two Philox per quad; paired (WGMMA), the lane holding the
//    neighbouring keys needs the same two units: each of the two lanes draws one and they swap
//    halves (a shuffle), one Philox per pair of quads.
// The unit comes from a quad's first entry; the lanes from the layout above. The GPU tests
// compare against the oracle, which draws every entry on its own (Dropout::keep).
#pragma once

#include <cute/tensor.hpp>

#include "common/dropout.h"
#include "common/score_mods.h"

namespace flashattn {

// The keep bits of a thread's entries, one bit each, drawn group by group in a loop that is
// not unrolled: one Philox in flight at a time, so the draws need a dozen registers wherever
// they run (unrolled over a whole tile they spilled). A group is a pair of quads (kPaired)
// or one quad; its bits are contiguous, so a group never straddles a word. keep(r, c) with
// compile-time r, c (the callers' unrolled loops) folds to one bit test.
template <class TensorC, bool kRowsAreQueries, bool kPaired>
struct DropoutMask {
  static constexpr int kR = decltype(cute::size<0>(TensorC{}))::value;
  static constexpr int kC = decltype(cute::size<1>(TensorC{}))::value;
  static_assert(kR % 2 == 0 && kC % 2 == 0, "quads of 2 x 2 entries");
  static constexpr int kGroupQuads = kPaired ? 2 : 1;
  static_assert((kC / 2) % kGroupQuads == 0, "paired quads");
  static constexpr int kGroupsPerRowPair = kC / 2 / kGroupQuads;
  static constexpr int kGroups = kR / 2 * kGroupsPerRowPair;
  static constexpr int kBitsPerGroup = 4 * kGroupQuads;  // 8 or 4: divides 32
  static constexpr int kWords = (kGroups * kBitsPerGroup + 31) / 32;
  uint32_t words[kWords];

  // Entry (r, c): quad (r / 2, c / 2), row rr and column pp within the quad. Rows-are-queries
  // bits follow the unit's lanes (rr * 4 + qo * 2 + pp); rows-are-keys bits pp * 4 + qo * 2 + rr.
  __host__ __device__ static constexpr int bit(int r, int c) {
    const int m = r / 2, rr = r % 2, quad = c / 2, pp = c % 2, qo = quad % kGroupQuads;
    const int g = m * kGroupsPerRowPair + quad / kGroupQuads;
    const int pos = kRowsAreQueries ? (rr * kGroupQuads + qo) * 2 + pp : (pp * kGroupQuads + qo) * 2 + rr;
    return g * kBitsPerGroup + pos;
  }
  __device__ __forceinline__ bool keep(int r, int c) const {
    const int b = bit(r, c);
    return (words[b / 32] >> (b % 32)) & 1u;
  }

  __device__ __forceinline__ static uint32_t r16(const Philox4& x, int lane) {
    const uint32_t w = (lane & 4) ? ((lane & 2) ? x.x[3] : x.x[2]) : ((lane & 2) ? x.x[1] : x.x[0]);
    return (lane & 1) ? (w >> 16) : (w & 0xffffu);
  }

  // coord(r, c) = (row, col) of entry (r, c) within the tile at (row0, col0).
  // Words outer (unrolled: each word a register) and groups inner (not unrolled): a runtime
  // word index made the words an array in local memory.
  __device__ __forceinline__ void generate(const TensorC& coord, int row0, int col0, const ScoreMods& mods) {
    using namespace cute;
    constexpr int kGroupsPerWord = 32 / kBitsPerGroup;
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      uint32_t acc = 0u;
      const int g_end = (w + 1) * kGroupsPerWord < kGroups ? (w + 1) * kGroupsPerWord : kGroups;
#pragma unroll 1
      for (int g = w * kGroupsPerWord; g < g_end; ++g) {
        acc |= group_bits(coord, row0, col0, mods, g) << ((g % kGroupsPerWord) * kBitsPerGroup);
      }
      words[w] = acc;
    }
  }

 private:
  // The kBitsPerGroup keep bits of group g (positions as bit() gives them, from bit 0).
  __device__ __forceinline__ static uint32_t group_bits(const TensorC& coord, int row0, int col0, const ScoreMods& mods,
                                                        int g) {
    using namespace cute;
    {
      const int m = g / kGroupsPerRowPair, quad0 = (g % kGroupsPerRowPair) * kGroupQuads;
      uint32_t bits = 0u;
      if constexpr (kRowsAreQueries) {
        const int i = row0 + get<0>(coord(2 * m, 2 * quad0)), j = col0 + get<1>(coord(2 * m, 2 * quad0));
        const Philox4 x = Dropout::unit_bits(mods.seed, mods.stream, Dropout::unit_row(i), Dropout::unit_col(j));
#pragma unroll
        for (int rr = 0; rr < 2; ++rr)
#pragma unroll
          for (int qo = 0; qo < kGroupQuads; ++qo)
#pragma unroll
            for (int pp = 0; pp < 2; ++pp) {
              // Paired: the quads are columns j and j + 8 of one unit; alone, its own half.
              const int lane = rr * 4 + (kPaired ? qo : ((j >> 3) & 1)) * 2 + pp;
              bits |= uint32_t(r16(x, lane) >= mods.dropout_threshold) << ((rr * kGroupQuads + qo) * 2 + pp);
            }
      } else if constexpr (kPaired) {
        // WGMMA's S^T: lane L ^ 4 holds the same queries at the other key of each even/odd key
        // pair, so the two lanes need the same two units (queries q and q + 1). Each draws one of
        // them (the one at its own key parity) and hands the other lane that lane's half: one
        // Philox per 8 entries, as the forward, instead of two.
        const int par = (row0 + get<0>(coord(2 * m, 2 * quad0))) & 1;  // this lane's key parity
        const int key = row0 + get<0>(coord(2 * m, 2 * quad0 + par));
        const int query = col0 + get<1>(coord(2 * m, 2 * quad0 + par));
        const Philox4 x = Dropout::unit_bits(mods.seed, mods.stream, Dropout::unit_row(query), Dropout::unit_col(key));
        // Unit lane qo * 4 + rr * 2 + key parity is the low (parity 0) or high half of word
        // qo * 2 + rr (the quads are queries q and q + 8 of the unit; keys k, k + 8 its rows).
        uint32_t lo = 0u, hi = 0u;
#pragma unroll
        for (int wi = 0; wi < 2 * kGroupQuads; ++wi) {
          lo |= uint32_t((x.x[wi] & 0xffffu) >= mods.dropout_threshold) << wi;
          hi |= uint32_t((x.x[wi] >> 16) >= mods.dropout_threshold) << wi;
        }
        // This lane's bits sit at column par of the quads (positions (par * kGroupQuads + qo) * 2
        // + rr); the partner's (parity par ^ 1) half goes to it, at the same positions.
        const int shift = par * kGroupQuads * 2;
        bits = (par ? hi : lo) << shift;
        bits |= __shfl_xor_sync(0xffffffffu, (par ? lo : hi) << shift, 4);  // the partner's draw: column par ^ 1
      } else {
#pragma unroll
        for (int pp = 0; pp < 2; ++pp) {
          const int key = row0 + get<0>(coord(2 * m, 2 * quad0 + pp));
          const int query = col0 + get<1>(coord(2 * m, 2 * quad0 + pp));
          const Philox4 x =
              Dropout::unit_bits(mods.seed, mods.stream, Dropout::unit_row(query), Dropout::unit_col(key));
#pragma unroll
          for (int qo = 0; qo < kGroupQuads; ++qo)
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) {
              const int lane = ((query >> 3) & 1) * 4 + rr * 2 + (key & 1);
              bits |= uint32_t(r16(x, lane) >= mods.dropout_threshold) << ((pp * kGroupQuads + qo) * 2 + rr);
            }
        }
      }
      return bits;
    }
  }
};

// ALiBi over the row/col view (a row's coordinate depends on r only, a column's on c only):
// s(r, c) += bias in apply()'s units, -coef |query + diag - key| (rows are queries or keys).
// One int-to-float conversion per row, not per score (I2F issues at a quarter of the FMA rate,
// beside the softmax's exp2 on the same pipe): a column's offset from the thread's first column
// is a compile-time constant once unrolled, so a score costs an FADD and an FFMA with |x|. Every
// value is an integer below 2^24, so the result is the per-score conversion's, bit for bit.
template <bool kRowsAreQueries, class TensorS, class TensorC>
__device__ __forceinline__ void alibi_apply(TensorS& s, const TensorC& coord, int row0, int col0, const ScoreMods& mods) {
  using namespace cute;
  const int first_col = col0 + get<1>(coord(0, 0));
#pragma unroll
  for (int r = 0; r < size<0>(s); ++r) {
    const int row = row0 + get<0>(coord(r, 0));
    // |query + diag - key| = |base - dc| (rows are queries) or |base + dc| (rows are keys), dc
    // the column's offset from the first one.
    const float base = kRowsAreQueries ? float(row + mods.alibi_diag - first_col) : float(first_col + mods.alibi_diag - row);
#pragma unroll
    for (int c = 0; c < size<1>(s); ++c) {
      const float dc = float(get<1>(coord(0, c)) - get<1>(coord(0, 0)));
      s(r, c) = fmaf(-mods.alibi_coef, fabsf(kRowsAreQueries ? base - dc : base + dc), s(r, c));
    }
  }
}

}  // namespace flashattn
