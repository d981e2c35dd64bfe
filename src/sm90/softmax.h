// Online softmax over the WGMMA accumulator layout. A warpgroup's 64 x N accumulator gives
// each thread 2 rows (lane/4 and lane/4 + 8 of its warp's 16) and N/4 columns in pairs, so a
// row is spread over the 4 threads of a quad: row max/sum = thread-local pass + 2 shuffles.
// Arithmetic and -inf guards are src/common/softmax.h's: scores in the log2 domain with the
// scale folded into one FMA before exp2; the running sum stays thread-local until finalize.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

#include "common/softmax.h"

namespace flashattn::sm90 {

// Accumulator ((2, 2, N/8), MMA_M, MMA_N) -> (rows = (2, MMA_M), cols = (2, N/8, MMA_N)).
template <class Layout>
__device__ __forceinline__ auto acc_rowcol(Layout acc) {
  using namespace cute;
  static_assert(decltype(rank<0>(acc))::value == 3 && decltype(rank(acc))::value == 3);
  return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                     make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
}

// The S accumulator reinterpreted as the A operand of the RS WGMMA (16-bit): each K=16 slice
// of P is two adjacent N=8 column groups of S, which is exactly the A-register layout.
template <class Layout>
__device__ __forceinline__ auto acc_as_a_operand(Layout acc) {
  using namespace cute;
  auto l = logical_divide(get<0, 2>(acc), Tile<_2>{});  // ((2, N/16))
  return make_layout(make_layout(get<0, 0>(acc), get<0, 1>(acc), get<0, 0>(l)), get<1>(acc),
                     coalesce(make_layout(get<0, 1>(l), get<2>(acc))));
}

// fp32 accumulator -> fp16/bf16 fragment of the same register order (packed conversions).
template <class TS, class TP>
__device__ __forceinline__ void convert_fragment(TS const& s, TP& p) {
  using To = typename TP::value_type;
  constexpr int N = decltype(cute::size(s))::value;
  static_assert(N == decltype(cute::size(p))::value);
  cutlass::NumericArrayConverter<To, float, N> cvt;
  *reinterpret_cast<cutlass::Array<To, N>*>(p.data()) = cvt(*reinterpret_cast<cutlass::Array<float, N> const*>(s.data()));
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// kMaxOffsetLog2 (FP8, FA3's Max_offset): P = 2^k exp2(S * scale - m), in [0, 2^k], so that P
// uses E4M3's range (max 448) instead of [0, 1]; O / l cancels the factor and finalize takes it
// out of the LSE. Not with kLazyMax, whose P already reaches 2^kLazyMaxSlackLog2.
template <int kRows, bool kLazyMax, int kMaxOffsetLog2 = 0>
struct WarpgroupSoftmax {
  static_assert(!(kLazyMax && kMaxOffsetLog2 != 0));
  OnlineSoftmaxRow row[kRows];
  ScoreTransform tf;

  __device__ void init(const ScoreTransform& t) {
    tf = t;
#pragma unroll
    for (int r = 0; r < kRows; ++r) row[r].init();
  }

  // Softcap before masking, so masked entries stay exactly -inf.
  template <class TensorS>
  __device__ void apply_softcap(TensorS& s) const {
    if (tf.softcap > 0.f) {
#pragma unroll
      for (int i = 0; i < cute::size(s); ++i) s(i) = tf.apply(s(i));
    }
  }

  // S (rowcol view) -> P = exp2(S * scale - m) in place; scale[r] is what O must be multiplied
  // by before adding this block's P V. kLazyMax: the max moves lazily (update_max_lazy),
  // P <= 2^8, and after the first block or two scale is 1 for every row, so the O rescale can
  // be skipped. Returns whether any row of this warp needs its O rescaled (warp-uniform;
  // always true without kLazyMax and kMaxOffsetLog2, so the caller's test folds away).
  // row_add[r]: a term of every score of row r that S leaves out (ALiBi's query term on a tile
  // where it is separable, mainloop.h); 0 elsewhere, which gives exactly the plain results.
  // p_shift_log2 <= 0 (FP8): P of this block is multiplied by 2^p_shift_log2 (the ratio of its
  // V scale to O's, mainloop.h) inside the exp2, and the row sum adds P / that ratio
  // (l_weight), so l stays the softmax's denominator.
  template <class TensorS>
  __device__ bool step(TensorS& s, float (&scale)[kRows], const float (&row_add)[kRows], float p_shift_log2 = 0.f,
                       float l_weight = 1.f) {
    static_assert(decltype(cute::size<0>(s))::value == kRows);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < cute::size<1>(s); ++c) mx = fmaxf(mx, s(r, c));
      // row_add differs between the quad's lanes (it holds each lane's own column offset), so
      // it joins before the quad max: the lanes then agree on the row's max.
      mx = quad_max(mx + row_add[r]);
      scale[r] = kLazyMax ? row[r].update_max_lazy(mx * tf.exp2_scale, kLazyMaxSlackLog2)
                          : row[r].update_max(mx * tf.exp2_scale);
      const float off = kMaxOffsetLog2 != 0 ? float(kMaxOffsetLog2) - row[r].exp_offset() : -row[r].exp_offset();
      // (The FP8 terms only where they exist: x + 0.f is not x for x = -0, so it would not fold.)
      const float neg_off = fmaf(row_add[r], tf.exp2_scale, kMaxOffsetLog2 != 0 ? off + p_shift_log2 : off);
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < cute::size<1>(s); ++c) {
        const float p = exp2f(fmaf(s(r, c), tf.exp2_scale, neg_off));
        s(r, c) = p;
        sum += p;
      }
      row[r].l = kMaxOffsetLog2 != 0 ? fmaf(sum, l_weight, row[r].l) : row[r].l + sum;
    }
    // Without kLazyMax the factor is still exactly 1 for rows whose max did not move; FP8
    // (kMaxOffsetLog2) asks, because its GEMMs are short and the O rescale shows.
    if constexpr (!kLazyMax && kMaxOffsetLog2 == 0) return true;
    bool rescale = false;
#pragma unroll
    for (int r = 0; r < kRows; ++r) rescale |= scale[r] != 1.f;
    return __any_sync(0xffffffffu, rescale);
  }

  // step() for a block with finite scores (no mask, no score mods, no V-scale shift) whose rows
  // all have a finite max already: no -inf guards, the exp2 multiplier passed in (FP8: the tile's
  // Q/K scales folded in). The max chain starts from the old max. (mainloop.h kLeanBody.)
  // Max and sum run in three chains of a third of the columns where they divide: with one chain of 48
  // (the 192-key block) ptxas hoisted the exp2 arguments and spilled 16 registers per two blocks (s32).
  template <class TensorS>
  __device__ bool step_finite(TensorS&& s, float exp2_scale, float (&scale)[kRows]) {
    static_assert(decltype(cute::size<0>(s))::value == kRows && !kLazyMax && kMaxOffsetLog2 != 0);
    constexpr int kN = decltype(cute::size<1>(s))::value, kG = kN % 3 == 0 ? 3 : 1;
    bool rescale = false;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float mx = fmaxf(row[r].m, quad_max(group_max<kG>(s, r, [](int) { return 1.f; })) * exp2_scale);
      scale[r] = exp2f(row[r].m - mx);
      rescale |= scale[r] != 1.f;
      row[r].m = mx;
      const float neg_off = float(kMaxOffsetLog2) - mx;
      float l = row[r].l * scale[r];
#pragma unroll
      for (int g = 0; g < kG; ++g) l += group_exp2_sum<kG>(s, r, g, exp2_scale, neg_off);
      row[r].l = l;
    }
    return __any_sync(0xffffffffu, rescale);
  }

  // step_finite() with per-group transforms: the columns fall into kG equal groups of keys (the rowcol view's
  // columns c..c+kC-1 of a thread are keys of one 64-key group when kC = 16: key = 8 (c / 2) + 2 lane + c % 2);
  // group g's scores take exp2 multiplier e[g] (> 0) and exponent shift t[g] <= 0 (FP8: its V scale's ratio to
  // O's), and its row sum adds back 2^-t[g] = wl[g]. The rows' old max may be -inf (a tile's first block);
  // every row must hold a finite score (some unmasked key).
  template <int kG, class TensorS>
  __device__ bool step_groups(TensorS&& s, const float (&e)[kG], const float (&t)[kG], const float (&wl)[kG],
                              float (&scale)[kRows]) {
    static_assert(decltype(cute::size<0>(s))::value == kRows && !kLazyMax && kMaxOffsetLog2 != 0);
    bool rescale = false;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float mx = fmaxf(row[r].m, quad_max(group_max<kG>(s, r, [&](int g) { return e[g]; })));
      scale[r] = exp2f(row[r].m - mx);
      rescale |= scale[r] != 1.f;
      row[r].m = mx;
      float l = row[r].l * scale[r];
#pragma unroll
      for (int g = 0; g < kG; ++g)
        l = fmaf(group_exp2_sum<kG>(s, r, g, e[g], float(kMaxOffsetLog2) - mx + t[g]), wl[g], l);
      row[r].l = l;
    }
    return __any_sync(0xffffffffu, rescale);
  }

  // Row r's max over kG equal column groups, each group's max times group_scale(g) (> 0).
  template <int kG, class TensorS, class GroupScale>
  __device__ static float group_max(const TensorS& s, int r, GroupScale&& group_scale) {
    constexpr int kC = decltype(cute::size<1>(s))::value / kG;
    static_assert(kC * kG == decltype(cute::size<1>(s))::value);
    float smax = -INFINITY;
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float gmax = s(r, kC * g);
#pragma unroll
      for (int c = 1; c < kC; ++c) gmax = fmaxf(gmax, s(r, kC * g + c));
      smax = fmaxf(smax, gmax * group_scale(g));
    }
    return smax;
  }

  // Row r's column group g of kG: S -> P = exp2(S mult + neg_off) in place; returns the group's sum of P.
  template <int kG, class TensorS>
  __device__ static float group_exp2_sum(TensorS& s, int r, int g, float mult, float neg_off) {
    constexpr int kC = decltype(cute::size<1>(s))::value / kG;
    float sum = 0.f;
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const float p = exp2f(fmaf(s(r, kC * g + c), mult, neg_off));
      s(r, kC * g + c) = p;
      sum += p;
    }
    return sum;
  }

  // Quad-reduce the sums; returns 1/l per row (0 for an empty row) and fills the natural LSE.
  __device__ void finalize(float (&inv)[kRows], float (&lse)[kRows]) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row[r].l = quad_sum(row[r].l);
      inv[r] = row[r].inv_sum();
      lse[r] = kMaxOffsetLog2 != 0 ? row[r].lse() - float(kMaxOffsetLog2) * kLn2 : row[r].lse();  // -inf stays -inf
    }
  }
};

// O (rowcol view) *= scale[row].
template <int kRows, class TensorO>
__device__ __forceinline__ void rescale_rows(TensorO& o, const float (&scale)[kRows]) {
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int c = 0; c < cute::size<1>(o); ++c) o(r, c) *= scale[r];
}

}  // namespace flashattn::sm90
