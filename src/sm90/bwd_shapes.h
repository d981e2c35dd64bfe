// Tiles, WGMMA shapes and shared-memory layouts of the Hopper backward (FA3's design for
// hdim <= 128: SdP_swapAB with dK/dV GEMMs sourced from registers).
// One CTA owns a key block of kBlockN keys; each of the two consumer warpgroups owns 64 of
// them, so per query block of kBlockM rows a warpgroup computes
//   S^T  = K_w Q^T     (64 x kBlockM, SS)       dP^T = V_w dO^T   (64 x kBlockM, SS)
//   dV_w += P^T dO     (64 x d, RS: P^T is the S^T accumulator converted in registers)
//   dK_w += dS^T Q     (64 x d, RS)
//   dQ   = dS K        (kBlockM x d/2 per warpgroup, SS: dS goes through smem)
// so neither P nor P^T ever touches smem, and dS is written once (transposed by stmatrix).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/numeric_types.h>

namespace flashattn::sm90 {

template <int kHeadDim>
struct BwdTileConfig;
// 64 x 128 for hdim <= 128: S^T, dP^T (32 + 32 fp32), dK, dV (2 x d/2) and dQ (d/4) per thread
// fit in 240 registers; smem: K, V + 2 stages of Q, dO, dS + the dQ tile (192 KB at d 128).
template <> struct BwdTileConfig<64>  { static constexpr int kBlockM = 64, kBlockN = 128, kStages = 2; };
template <> struct BwdTileConfig<96>  { static constexpr int kBlockM = 64, kBlockN = 128, kStages = 2; };
template <> struct BwdTileConfig<128> { static constexpr int kBlockM = 64, kBlockN = 128, kStages = 2; };

template <int kHeadDim_, class Element_>
struct BwdTraits {
  using Element = Element_;
  using Cfg = BwdTileConfig<kHeadDim_>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = Cfg::kBlockM;  // query rows per step
  static constexpr int kBlockN = Cfg::kBlockN;  // keys per CTA
  static constexpr int kStages = Cfg::kStages;  // Q/dO/LSE/dPsum and dS buffers
  static constexpr int kNumMmaWG = 2;
  static constexpr int kNumMmaThreads = 128 * kNumMmaWG;
  static constexpr int kNumThreads = 128 + kNumMmaThreads;  // warpgroup 0: loads (warp 0), dQ writer (warp 1)
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static_assert(kBlockN == 64 * kNumMmaWG, "each consumer warpgroup owns 64 keys");
  static_assert(kBlockM % 16 == 0 && (kHeadDim / 2) % 16 == 0, "WGMMA tile constraints");

  template <int M, int N, int K>
  using Tile = cute::Shape<cute::Int<M>, cute::Int<N>, cute::Int<K>>;
  using SplitM = cute::Layout<cute::Shape<cute::Int<kNumMmaWG>, cute::_1, cute::_1>>;
  using SplitN = cute::Layout<cute::Shape<cute::_1, cute::Int<kNumMmaWG>, cute::_1>>;
  // S^T = K Q^T and dP^T = V dO^T: both operands K-major (head dim contiguous).
  using TiledMmaSdP = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, Tile<kBlockN, kBlockM, kHeadDim>>(), SplitM{}));
  // dV += P^T dO, dK += dS^T Q: A from registers, B = dO^T / Q^T (head dim contiguous: MN-major).
  using TiledMmadKV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, Tile<kBlockN, kHeadDim, kBlockM>, cute::GMMA::Major::K,
                                 cute::GMMA::Major::MN>(),
      SplitM{}));
  // dQ = dS K: A = dS (keys contiguous), B = K^T (head dim contiguous); split along the head dim.
  using TiledMmadQ = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, Tile<kBlockM, kHeadDim / kNumMmaWG, kBlockN>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>(),
      SplitN{}));

  // Swizzle atoms: the widest whose K extent divides what each GEMM reads of the buffer
  // (K^T is read in d/2 slices by the dQ GEMM, dS in 64-key slices by the S^T store).
  template <int kMN, int kK>
  using AtomK = decltype(cutlass::gemm::collective::detail::ss_smem_selector<cute::GMMA::Major::K, Element,
                                                                              cute::Int<kMN>, cute::Int<kK>>());
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      AtomK<kBlockM, kHeadDim>{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>, cute::Int<kStages>>{}));
  using SmemLayoutdO = SmemLayoutQ;
  using SmemLayoutK = decltype(cute::tile_to_shape(AtomK<kBlockN, kHeadDim / kNumMmaWG>{},
                                                   cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{}));
  using SmemLayoutV = decltype(cute::tile_to_shape(AtomK<kBlockN, kHeadDim>{},
                                                   cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{}));
  using SmemLayoutdS = decltype(cute::tile_to_shape(
      AtomK<kBlockM, 64>{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>, cute::Int<kStages>>{}));
  // Transposed views of the same bytes (the transpose of the view, not of memory).
  using SmemLayoutQt = decltype(cute::composition(
      SmemLayoutQ{}, cute::make_layout(cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockM>, cute::Int<kStages>>{},
                                       cute::Stride<cute::Int<kBlockM>, cute::_1, cute::Int<kBlockM * kHeadDim>>{})));
  using SmemLayoutdOt = SmemLayoutQt;
  using SmemLayoutKt = decltype(cute::composition(
      SmemLayoutK{}, cute::make_layout(cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>>{},
                                       cute::Stride<cute::Int<kBlockN>, cute::_1>{})));
  using SmemLayoutdSt = decltype(cute::composition(
      SmemLayoutdS{}, cute::make_layout(cute::Shape<cute::Int<kBlockN>, cute::Int<kBlockM>, cute::Int<kStages>>{},
                                        cute::Stride<cute::Int<kBlockM>, cute::_1, cute::Int<kBlockM * kBlockN>>{})));
  // LSE (log2 units) and dPsum of kBlockM rows per stage; the Mma view broadcasts them along
  // the keys (rows of S^T).
  using SmemLayoutRowStat = cute::Layout<cute::Shape<cute::Int<kBlockM>, cute::Int<kStages>>,
                                         cute::Stride<cute::_1, cute::Int<kBlockM>>>;
  using SmemLayoutRowStatMma = cute::Layout<cute::Shape<cute::Int<kBlockN>, cute::Int<kBlockM>, cute::Int<kStages>>,
                                            cute::Stride<cute::_0, cute::_1, cute::Int<kBlockM>>>;
  // dQ tile in the dQ accumulator's register order: one contiguous slice per warpgroup, each
  // thread's values in 16-byte runs, so the stores are conflict-free and one bulk reduce-add
  // per warpgroup moves it to the global accumulator (whose tiles use the same order).
  static constexpr int kDqSliceFloats = kBlockM * kHeadDim / kNumMmaWG;
  using SmemLayoutdQacc = cute::Layout<cute::Shape<cute::Int<kDqSliceFloats>, cute::Int<kNumMmaWG>>>;
  using R2SCopydQacc = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<128>, float>{},
      cute::Layout<cute::Shape<cute::_128, cute::Int<kNumMmaWG>>>{}, cute::Layout<cute::Shape<cute::_4>>{}));
  // dS^T registers -> dS (keys contiguous) in smem: stmatrix with transpose.
  using SmemCopyAtomdS = cute::Copy_Atom<cute::SM90_U16x8_STSM_T, Element>;

  static constexpr int kBytesQ = kBlockM * kHeadDim * int(sizeof(Element));
  static constexpr int kBytesKV = kBlockN * kHeadDim * int(sizeof(Element));
  static constexpr int kBytesRowStat = kBlockM * int(sizeof(float));
};

}  // namespace flashattn::sm90
