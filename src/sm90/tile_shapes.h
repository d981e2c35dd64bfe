// Per-head-dim tile configuration and the CuTe types derived from it (FA3 tile sizes).
// One consumer warpgroup owns 64 query rows, so kBlockM / 64 consumer warpgroups share a
// Q tile and one K/V pipeline. kBlockN is bounded by shared memory (2 stages of K and V)
// and by registers (S, P and O of one warpgroup live in registers at once).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

namespace flashattn::sm90 {

template <int kHeadDim>
struct TileConfig;
// kBlockNUnmasked: the key block of long problems without a causal/local mask, where no tile
// has a diagonal to cut (launch.h picks it from 8k keys). A wider block amortizes the
// per-block pipeline and rescale work: +3% at hdim 128, 8k-16k, under sustained load.
// hdim 64: 3 consumer warpgroups (192 rows) amortize the K/V loads; 160 regs each suffice.
template <> struct TileConfig<64>  { static constexpr int kBlockM = 192, kBlockN = 128, kBlockNUnmasked = 128, kStages = 2; };
template <> struct TileConfig<96>  { static constexpr int kBlockM = 128, kBlockN = 128, kBlockNUnmasked = 128, kStages = 2; };
// hdim 128 unmasked: FA3's 128 x 176; O then no longer fits in smem beside Q, K and V and is
// stored from registers (which measured 1-2% faster than the TMA store at 8k-16k anyway).
template <> struct TileConfig<128> { static constexpr int kBlockM = 128, kBlockN = 128, kBlockNUnmasked = 176, kStages = 2; };
// 128 x 112 and 128 x 80 are where Q + 2 stages of K and V hit the 227 KiB smem limit.
template <> struct TileConfig<192> { static constexpr int kBlockM = 128, kBlockN = 112, kBlockNUnmasked = 112, kStages = 2; };
template <> struct TileConfig<256> { static constexpr int kBlockM = 128, kBlockN = 80,  kBlockNUnmasked = 80, kStages = 2; };

// Widest swizzle whose atom divides the (contiguous) head dim: 128B for 64/128/192/256, 64B for 96.
template <class T, int kK>
constexpr auto smem_atom_k_major() {
  using namespace cute;
  if constexpr (kK % 64 == 0) return GMMA::Layout_K_SW128_Atom<T>{};
  else if constexpr (kK % 32 == 0) return GMMA::Layout_K_SW64_Atom<T>{};
  else return GMMA::Layout_K_SW32_Atom<T>{};
}

template <int kHeadDim_, class Element_, int kBlockN_ = TileConfig<kHeadDim_>::kBlockN>
struct Traits {
  using Element = Element_;  // cutlass::half_t or cutlass::bfloat16_t
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = TileConfig<kHeadDim>::kBlockM;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = TileConfig<kHeadDim>::kStages;
  static constexpr int kNumMmaWG = kBlockM / 64;
  static constexpr int kNumMmaThreads = 128 * kNumMmaWG;
  static constexpr int kNumThreads = 128 + kNumMmaThreads;  // warpgroup 0 is the producer
  // setmaxnreg budget: 128 * (producer + kNumMmaWG * consumer) <= 64K registers.
  static constexpr int kProducerRegs = kNumMmaWG == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = kNumMmaWG == 2 ? 240 : 160;
  static_assert(kBlockM % 64 == 0 && kBlockN % 16 == 0, "WGMMA tile constraints");
  static_assert(kNumMmaWG == 2 || kNumMmaWG == 3, "pingpong barriers exist for 2 or 3 warpgroups");

  using TileShapeQK = cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>, cute::Int<kHeadDim>>;
  using TileShapePV = cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>, cute::Int<kBlockN>>;
  using AtomLayoutMma = cute::Layout<cute::Shape<cute::Int<kNumMmaWG>, cute::_1, cute::_1>>;
  // S = Q K^T: both operands from smem, K-major (head dim contiguous).
  using TiledMmaQK = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, TileShapeQK>(), AtomLayoutMma{}));
  // O += P V: P from registers, V from smem read MN-major (head dim contiguous).
  using TiledMmaPV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, TileShapePV, cute::GMMA::Major::K,
                                 cute::GMMA::Major::MN>(),
      AtomLayoutMma{}));

  static constexpr int kBytesQ = kBlockM * kHeadDim * int(sizeof(Element));
  static constexpr int kBytesKV = kBlockN * kHeadDim * int(sizeof(Element));
  static constexpr int kSmemLimit = 227 * 1024 - 1024;  // minus barriers and alignment slack
  // A second Q buffer lets the producer load the next tile's Q a tile ahead (producer.h)
  // instead of after this tile's last Q K^T. Only where it fits beside 2 stages of K and V:
  // hdim 64/96 and 128 with 128-key blocks (not 128 x 176, 192, 256).
  static constexpr int kStagesQ = 2 * kBytesQ + 2 * kStages * kBytesKV <= kSmemLimit ? 2 : 1;

  using SmemAtom = decltype(smem_atom_k_major<Element, kHeadDim>());
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>, cute::Int<kStagesQ>>{}));
  using SmemLayoutK = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>, cute::Int<kStages>>{}));
  using SmemLayoutV = SmemLayoutK;
  // V^T as the PV GEMM's B operand: the same bytes viewed as (head dim, kBlockN, stage).
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutV{},
      cute::make_ordered_layout(cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>, cute::Int<kStages>>{},
                                cute::Step<cute::_2, cute::_1, cute::_3>{})));
  // O has no layout here: the epilogue owns its staging (epilogue.h, OStaging).
};

}  // namespace flashattn::sm90
