// Tile configurations of the sm80 path (mma.sync m16n8k16, cp.async, ldmatrix), FA2 design.
// One forward and one backward configuration per head dim; they fit the 163 KB (A100) and
// 227 KB (H100) smem of a block, and the forward ones also the 99 KB of sm86/sm89.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

namespace flashattn::sm80 {

using namespace cute;
using cute::Shape;  // not flashattn::Shape (the problem shape)

template <typename Element>
struct MmaAtomFor;
template <>
struct MmaAtomFor<cutlass::half_t> {
  using type = MMA_Atom<SM80_16x8x16_F32F16F16F32_TN>;
};
template <>
struct MmaAtomFor<cutlass::bfloat16_t> {
  using type = MMA_Atom<SM80_16x8x16_F32BF16BF16F32_TN>;
};

// What the forward and the backward share: element type, smem layouts of [rows, headdim]
// tiles, gmem tiled copies.
template <typename Element_, int kHeadDim_, int kNWarps_>
struct BaseTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static_assert(kHeadDim % 32 == 0);

  using MmaAtom = typename MmaAtomFor<Element>::type;
  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x8_LDSM_T, Element>;

  // Rows of 64 (or 32) elements, XOR-swizzled so ldmatrix reads are bank-conflict free.
  static constexpr int kBlockKSmem = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzle = kBlockKSmem == 32 ? 2 : 3;
  using SmemLayoutAtom = decltype(composition(
      Swizzle<kSwizzle, 3, 3>{}, Layout<Shape<_8, Int<kBlockKSmem>>, Stride<Int<kBlockKSmem>, _1>>{}));

  // 16-byte cp.async per thread; a warp covers whole kBlockKSmem-wide row segments.
  static constexpr int kGmemElemsPerLoad = 8;
  static constexpr int kGmemThreadsPerRow = kBlockKSmem / kGmemElemsPerLoad;
  static_assert(kNThreads % kGmemThreadsPerRow == 0);
  using GmemLayoutAtom = Layout<Shape<Int<kNThreads / kGmemThreadsPerRow>, Int<kGmemThreadsPerRow>>,
                                Stride<Int<kGmemThreadsPerRow>, _1>>;
  static constexpr int kGmemRowsPerCopy = kNThreads / kGmemThreadsPerRow;
  using GmemTiledCopy = decltype(make_tiled_copy(
      Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{}, GmemLayoutAtom{}, Layout<Shape<_1, _8>>{}));
};

template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kWarpsN_ = 1>
struct FwdTraits : BaseTraits<Element_, kHeadDim_, kNWarps_> {
  using Base = BaseTraits<Element_, kHeadDim_, kNWarps_>;
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kWarpsN = kWarpsN_;
  static constexpr int kWarpsM = kNWarps / kWarpsN;
  static_assert(kNWarps % kWarpsN == 0);
  static_assert(kBlockM % (16 * kWarpsM) == 0, "each warp owns whole 16-row MMA tiles");
  static_assert(kBlockN % (16 * kWarpsN) == 0 && kHeadDim % (16 * kWarpsN) == 0);
  static_assert(kBlockM % Base::kGmemRowsPerCopy == 0 && kBlockN % Base::kGmemRowsPerCopy == 0);

  // kWarpsN = 1: warps stacked along M; each owns kBlockM / kNWarps query rows and all keys of
  // the tile, so row statistics of the online softmax never leave the warp (quad shuffles only)
  // and P stays in registers.
  // kWarpsN > 1: kWarpsN warps share each query row, splitting the S tile along the keys and the
  // O tile along the head dim, so a warp reads 1/kWarpsN of the K and V tiles from smem per row
  // it owns (smem bandwidth bounds the forward at hdim 256). The price: row maxima and P go
  // through smem, with a barrier among the warps of a row group. One TiledMma serves S and O,
  // so a thread owns the same rows in both.
  using TiledMma = TiledMMA<typename Base::MmaAtom, Layout<Shape<Int<kWarpsM>, Int<kWarpsN>, _1>>,
                            Tile<Int<16 * kWarpsM>, Int<16 * kWarpsN>, _16>>;

  using SmemLayoutQ = decltype(tile_to_shape(typename Base::SmemLayoutAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(tile_to_shape(typename Base::SmemLayoutAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // V^T view (headdim, keys) of the V tile: the B operand of O += P V, read with ldmatrix.trans.
  using SmemLayoutVt =
      decltype(composition(SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutVtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutVt{}));
  // kWarpsN > 1: P [M x N] (the A operand of O += P V, read with ldmatrix) and the partial row
  // statistics [kWarpsN][M] (fp32).
  static_assert(kWarpsN == 1 || kBlockN % Base::kBlockKSmem == 0);
  using SmemLayoutP = decltype(tile_to_shape(typename Base::SmemLayoutAtom{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));
  using SmemCopyAtomP = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<32>, Element>;
  static constexpr int kSmemPAndStats =
      kWarpsN == 1 ? 0 : kBlockM * kBlockN * int(sizeof(Element)) + kWarpsN * kBlockM * int(sizeof(float));

  static constexpr int kSmemSize = (kBlockM + 2 * kBlockN) * kHeadDim * int(sizeof(Element)) + kSmemPAndStats;
};

// Backward: one CTA per key block; loops over the query blocks (and the query heads of its
// GQA group). Three tiled MMAs: S/dP = Q K^T / dO V^T [M x N], dK/dV = dS^T Q / P^T dO [N x d],
// dQ = dS K [M x d]. kStagesQdO = 2 double-buffers Q, dO and their LSE/D rows, so the next
// query block loads under the current one's GEMMs; 1 loads it after the last read of Q/dO.
template <typename Element_, int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kAtomMSdP,
          int kAtomNdKV, int kAtomMdQ, int kStagesQdO_ = 2>
struct BwdTraits : BaseTraits<Element_, kHeadDim_, kNWarps_> {
  using Base = BaseTraits<Element_, kHeadDim_, kNWarps_>;
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kStagesQdO = kStagesQdO_;
  static_assert(kStagesQdO == 1 || kStagesQdO == 2);
  static_assert(kBlockM % Base::kGmemRowsPerCopy == 0 && kBlockN % Base::kGmemRowsPerCopy == 0);
  static_assert(2 * kBlockM <= kNThreads, "one thread per LSE / D row");
  static constexpr int kWarpsNSdP = kNWarps / kAtomMSdP;  // warps across the keys of S / dP

  using TiledMmaSdP = TiledMMA<typename Base::MmaAtom, Layout<Shape<Int<kAtomMSdP>, Int<kNWarps / kAtomMSdP>, _1>>,
                               Tile<Int<16 * kAtomMSdP>, Int<16 * kNWarps / kAtomMSdP>, _16>>;
  using TiledMmadKV = TiledMMA<typename Base::MmaAtom, Layout<Shape<Int<kAtomNdKV>, Int<kNWarps / kAtomNdKV>, _1>>,
                               Tile<Int<16 * kAtomNdKV>, Int<16 * kNWarps / kAtomNdKV>, _16>>;
  using TiledMmadQ = TiledMMA<typename Base::MmaAtom, Layout<Shape<Int<kAtomMdQ>, Int<kNWarps / kAtomMdQ>, _1>>,
                              Tile<Int<16 * kAtomMdQ>, Int<16 * kNWarps / kAtomMdQ>, _16>>;
  static_assert(kBlockM % (16 * kAtomMSdP) == 0 && kBlockN % (16 * kNWarps / kAtomMSdP) == 0);
  static_assert(kBlockN % (16 * kAtomNdKV) == 0 && kHeadDim % (16 * kNWarps / kAtomNdKV) == 0);
  static_assert(kBlockM % (16 * kAtomMdQ) == 0 && kHeadDim % (16 * kNWarps / kAtomMdQ) == 0);

  using SmemLayoutQdO = decltype(tile_to_shape(typename Base::SmemLayoutAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutQdOt =
      decltype(composition(SmemLayoutQdO{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockM>>{}, GenRowMajor{})));
  using SmemLayoutQdOtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutQdOt{}));

  using SmemLayoutKV = decltype(tile_to_shape(typename Base::SmemLayoutAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutKt =
      decltype(composition(SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutKtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutKt{}));

  // P and dS [M x N] tiles, written from the S/dP accumulators and read back transposed.
  static constexpr int kPBlockN = kBlockN >= 64 ? 64 : 32;
  using SmemLayoutAtomPdS = decltype(composition(
      Swizzle<3, 3, 3>{}, Layout<Shape<Int<kBlockM>, Int<kPBlockN>>, Stride<Int<kPBlockN>, _1>>{}));
  using SmemLayoutPdS = decltype(tile_to_shape(SmemLayoutAtomPdS{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));
  using SmemLayoutPdSt =
      decltype(composition(SmemLayoutPdS{}, make_layout(Shape<Int<kBlockN>, Int<kBlockM>>{}, GenRowMajor{})));
  using SmemLayoutPdStNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutPdSt{}));
  using SmemCopyAtomPdS = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>;

  // Per stage: Q, dO [M x d] and the block's LSE (log2 domain) and D rows (fp32).
  static constexpr int kSmemQdOStage = 2 * kBlockM * kHeadDim * int(sizeof(Element));
  static constexpr int kSmemStatsStage = 2 * kBlockM * int(sizeof(float));
  static constexpr int kSmemSize = kStagesQdO * (kSmemQdOStage + kSmemStatsStage) +
                                   (2 * kBlockN * kHeadDim + 2 * kBlockM * kBlockN) * int(sizeof(Element));
};

}  // namespace flashattn::sm80
