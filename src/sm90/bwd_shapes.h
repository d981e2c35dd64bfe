// Tiles, WGMMA shapes and shared-memory layouts of the Hopper backward (FA3's designs).
// One CTA owns a key block of kBlockN keys and walks the query blocks (kBlockM rows) that see
// it. Two partitions of the work between the two consumer warpgroups, a policy of the tile:
//  keys per warpgroup (kBlockN = 128, hdim <= 128): each warpgroup owns 64 keys and computes
//   S^T  = K_w Q^T     (64 x kBlockM, SS)       dP^T = V_w dO^T   (64 x kBlockM, SS)
//   dV_w += P^T dO     (64 x d, RS: P^T is the S^T accumulator converted in registers)
//   dK_w += dS^T Q     (64 x d, RS)
//   so P never touches smem and dS is written once (transposed by stmatrix) for dQ.
//  head dim per warpgroup (kBlockN = 64, hdim 192/256: dK + dV of 64 keys x d would not fit
//  in registers): S^T/dP^T split along the queries (64 x kBlockM/2 each), P^T and dS go to
//  smem, and each warpgroup accumulates dK, dV for all 64 keys but half the head dim (SS).
// Both: dQ = dS K (kBlockM x d/2 per warpgroup, SS), added to the fp32 accumulator by a bulk
// reduce-add from smem where it fits (a writer warp), else by vector atomics from registers.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/numeric_types.h>

#include <type_traits>

namespace flashattn::sm90 {

template <int kHeadDim>
struct BwdTileConfig;
// 64 x 128 for hdim <= 128: S^T, dP^T (32 + 32 fp32), dK, dV (2 x d/2) and dQ (d/4) per thread
// fit in 240 registers; smem: K, V + 2 stages of Q, dO, dS + the dQ tile (192 KB at d 128).
template <> struct BwdTileConfig<64>  { static constexpr int kBlockM = 64, kBlockN = 128, kStages = 2; };
template <> struct BwdTileConfig<96>  { static constexpr int kBlockM = 64, kBlockN = 128, kStages = 2; };
template <> struct BwdTileConfig<128> { static constexpr int kBlockM = 64, kBlockN = 128, kStages = 2; };
// 64 x 64, head dim split: dK, dV (2 x d/4), dQ (d/4) per thread. smem at d 256: K, V (64 KB),
// 2 stages of Q, dO (128 KB), one of P^T and dS (16 KB): no room for the dQ tile (atomics).
template <> struct BwdTileConfig<192> { static constexpr int kBlockM = 64, kBlockN = 64, kStages = 2; };
template <> struct BwdTileConfig<256> { static constexpr int kBlockM = 64, kBlockN = 64, kStages = 2; };

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
  // The partition policy (see the top): keys per warpgroup, or head dim per warpgroup.
  static constexpr bool kKeysPerWG = kBlockN == 64 * kNumMmaWG;
  static_assert(kKeysPerWG || kBlockN == 64, "a warpgroup owns 64 keys, or all 64 keys of the block");
  static_assert(kBlockM % 32 == 0 && (kHeadDim / 2) % 16 == 0, "WGMMA tile constraints");

  template <int M, int N, int K>
  using Tile = cute::Shape<cute::Int<M>, cute::Int<N>, cute::Int<K>>;
  using SplitM = cute::Layout<cute::Shape<cute::Int<kNumMmaWG>, cute::_1, cute::_1>>;
  using SplitN = cute::Layout<cute::Shape<cute::_1, cute::Int<kNumMmaWG>, cute::_1>>;
  using K_ = std::integral_constant<cute::GMMA::Major, cute::GMMA::Major::K>;
  using MN_ = std::integral_constant<cute::GMMA::Major, cute::GMMA::Major::MN>;
  // S^T = K Q^T and dP^T = V dO^T: both operands K-major (head dim contiguous).
  using TiledMmaSdP = std::conditional_t<
      kKeysPerWG,
      decltype(cute::make_tiled_mma(
          cute::GMMA::ss_op_selector<Element, Element, float, Tile<kBlockN, kBlockM, kHeadDim>>(), SplitM{})),
      decltype(cute::make_tiled_mma(
          cute::GMMA::ss_op_selector<Element, Element, float, Tile<kBlockN, kBlockM / 2, kHeadDim>>(), SplitN{}))>;
  // dV += P^T dO, dK += dS^T Q; B = dO^T / Q^T (head dim contiguous: MN-major). Keys per
  // warpgroup: A from registers. Head dim per warpgroup: A from smem, P^T K-major (stored so),
  // dS^T MN-major (the transposed view of the dS that dQ reads).
  template <class MajorA>
  using SmemdKVMma = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, Tile<kBlockN, kHeadDim / kNumMmaWG, kBlockM>,
                                 MajorA::value, cute::GMMA::Major::MN>(),
      SplitN{}));
  using RegdKVMma = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, Tile<kBlockN, kHeadDim, kBlockM>, cute::GMMA::Major::K,
                                 cute::GMMA::Major::MN>(),
      SplitM{}));
  using TiledMmadV = std::conditional_t<kKeysPerWG, RegdKVMma, SmemdKVMma<K_>>;
  using TiledMmadK = std::conditional_t<kKeysPerWG, RegdKVMma, SmemdKVMma<MN_>>;
  using TiledMmadKV = TiledMmadV;  // the dK/dV accumulators' partition (both GEMMs share it)
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
  // Q and dO are read whole (S^T, dP^T) and, as Q^T / dO^T, in the dK/dV GEMMs' N slices.
  static constexpr int kDkvN = kKeysPerWG ? kHeadDim : kHeadDim / kNumMmaWG;
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      AtomK<kBlockM, kDkvN>{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>, cute::Int<kStages>>{}));
  using SmemLayoutdO = SmemLayoutQ;
  using SmemLayoutK = decltype(cute::tile_to_shape(AtomK<kBlockN, kHeadDim / kNumMmaWG>{},
                                                   cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{}));
  using SmemLayoutV = decltype(cute::tile_to_shape(AtomK<kBlockN, kHeadDim>{},
                                                   cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{}));
  // dS: double-buffered when the keys are split (no sync before the next write); one buffer
  // (and P^T) when the head dim is, where smem is short.
  static constexpr int kStagesdS = kKeysPerWG ? kStages : 1;
  using SmemLayoutdS = decltype(cute::tile_to_shape(
      AtomK<kBlockM, 64>{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>, cute::Int<kStagesdS>>{}));
  using SmemLayoutPt = decltype(cute::tile_to_shape(
      AtomK<kBlockN, kBlockM / 2>{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kBlockM>, cute::Int<kStagesdS>>{}));
  // Transposed views of the same bytes (the transpose of the view, not of memory).
  using SmemLayoutQt = decltype(cute::composition(
      SmemLayoutQ{}, cute::make_layout(cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockM>, cute::Int<kStages>>{},
                                       cute::Stride<cute::Int<kBlockM>, cute::_1, cute::Int<kBlockM * kHeadDim>>{})));
  using SmemLayoutdOt = SmemLayoutQt;
  using SmemLayoutKt = decltype(cute::composition(
      SmemLayoutK{}, cute::make_layout(cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>>{},
                                       cute::Stride<cute::Int<kBlockN>, cute::_1>{})));
  using SmemLayoutdSt = decltype(cute::composition(
      SmemLayoutdS{}, cute::make_layout(cute::Shape<cute::Int<kBlockN>, cute::Int<kBlockM>, cute::Int<kStagesdS>>{},
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
  // dS^T registers -> dS (keys contiguous) in smem: stmatrix with transpose; P^T as it is.
  static constexpr int kPdSPerThread = kBlockN * kBlockM / kNumMmaThreads;
  using SmemCopyAtomdS = cute::Copy_Atom<
      std::conditional_t<kPdSPerThread % 8 == 0, cute::SM90_U16x8_STSM_T, cute::SM90_U16x4_STSM_T>, Element>;
  using SmemCopyAtomP = cute::Copy_Atom<
      std::conditional_t<kPdSPerThread % 8 == 0, cute::SM90_U32x4_STSM_N, cute::SM90_U32x2_STSM_N>, Element>;

  static constexpr int kBytesQ = kBlockM * kHeadDim * int(sizeof(Element));
  // The dQ tile through smem and a bulk reduce-add where it fits beside everything else.
  static constexpr int kSmemOther = (2 * kBlockN * kHeadDim + 2 * kStages * kBlockM * kHeadDim +
                                     (kKeysPerWG ? 1 : 2) * kStagesdS * kBlockM * kBlockN) * int(sizeof(Element));
  static constexpr bool kDqBulkReduce = kSmemOther + kBlockM * kHeadDim * 4 <= 220 * 1024;
  static constexpr int kBytesKV = kBlockN * kHeadDim * int(sizeof(Element));
  static constexpr int kBytesRowStat = kBlockM * int(sizeof(float));
};

}  // namespace flashattn::sm90
