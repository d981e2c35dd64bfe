// Per-head-dim tile configuration and the CuTe types derived from it (FA3 tile sizes).
// One consumer warpgroup owns 64 query rows, so kBlockM / 64 consumer warpgroups share a
// Q tile and one K/V pipeline. kBlockN is bounded by shared memory (2 stages of K and V)
// and by registers (S, P and O of one warpgroup live in registers at once).
#pragma once

#include <type_traits>

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

// Widest swizzle whose atom (128, 64 or 32 bytes of a row) divides the contiguous extent: 128B for
// 16-bit head dims 64/128/192/256 and FP8 head dims 128/256, 64B for 16-bit 96 and FP8 64.
template <class T, int kK>
constexpr auto smem_atom_k_major() {
  using namespace cute;
  constexpr int kBytes = kK * int(sizeof(T));
  if constexpr (kBytes % 128 == 0) return GMMA::Layout_K_SW128_Atom<T>{};
  else if constexpr (kBytes % 64 == 0) return GMMA::Layout_K_SW64_Atom<T>{};
  else return GMMA::Layout_K_SW32_Atom<T>{};
}

// FP8 (E4M3) inputs: the same kernel with three policies switched on (docs/fp8-sm90-design.md):
//   - P V reads V K-major (FP8 WGMMA has no MN-major operands), so warps 1-3 of the producer
//     warpgroup transpose each V tile after its TMA load (producer.h, VTransposer);
//   - P goes to E4M3 in registers with the key order the transpose gives V (mainloop.h);
//   - per-tile scales: Q's and K's fold into the softmax scale, V's into O's rescale.
// kBlockN = 128 for every head dim: one K/V scale block of 128 keys is one key tile.
// kBlockNUnmasked: hdim 128 with V^T given, one K/V scale per (batch, head) and no mask takes
// 192-key blocks (launch.h): the per-block work (pipeline, barriers, rescale) spread over 1.5x
// the keys, +6-7% at 4k-16k, and +5-6.5% more with its lean softmax (mainloop.h kLeanBody;
// perf-notes s29). FA3's FP8 tile is 128 x 224: with the lean loop 224 measured no faster than 192
// (s29). With scale blocks (a multiple of 128 keys) a 192-key block straddles two of them: the wide
// kernel then takes each 64-key group's scales (Fp8WideScales::kPer64Keys).
template <int kHeadDim>
struct TileConfigFp8 {
  static constexpr int kBlockM = 128, kBlockN = 128, kStages = 2;
  static constexpr int kBlockNUnmasked = kHeadDim == 128 ? 192 : 128;
};

template <class Element>
constexpr bool is_fp8_v = std::is_same_v<Element, cutlass::float_e4m3_t>;

// Where the PV GEMM's V operand comes from. kRows: V's rows as the tensor holds them (16-bit: read
// MN-major in place; FP8: transposed in smem by the producer warpgroup's warps 1-3). kKeysPermutedT
// (FP8 only; fp8_v_layout keys_permuted16, flashattn.h): V^T from global memory, keys contiguous in
// the order P's registers hold them, so TMA loads each tile straight into the K-major operand buffer:
// no transposing warps, no second V buffer, no fourth pipeline.
enum class VSource { kRows, kKeysPermutedT };

// FP8's wide key block (kBlockNUnmasked), K/V scales: one per (batch, head), every block of a tile has the
// same (the lean softmax, mainloop.h kLeanBody); or per 64-key group, since scale blocks (a multiple of 128
// keys) straddle the 192-key block (mainloop.h kGroupBody).
enum class Fp8WideScales { kPerHead, kPer64Keys };

// Element: the inputs' type (cutlass::half_t, bfloat16_t, or float_e4m3_t); ElementOut: O's
// (the inputs' own, except FP8 writes 16-bit).
template <int kHeadDim_, class Element_, int kBlockN_ = TileConfig<kHeadDim_>::kBlockN, class ElementOut_ = Element_,
          VSource kVSource_ = VSource::kRows, Fp8WideScales kWideScales_ = Fp8WideScales::kPerHead>
struct Traits {
  using Element = Element_;
  using ElementOut = ElementOut_;
  static constexpr bool kFp8 = is_fp8_v<Element>;
  using Cfg = std::conditional_t<kFp8, TileConfigFp8<kHeadDim_>, TileConfig<kHeadDim_>>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = Cfg::kBlockM;
  // FP8: its own key block, or the wide one where launch.h asks for it.
  static constexpr int kBlockN = kFp8 && kBlockN_ != Cfg::kBlockNUnmasked ? Cfg::kBlockN : kBlockN_;
  static constexpr int kStages = Cfg::kStages;
  static constexpr int kNumMmaWG = kBlockM / 64;
  static constexpr int kNumMmaThreads = 128 * kNumMmaWG;
  static constexpr int kNumThreads = 128 + kNumMmaThreads;  // warpgroup 0 is the producer
  static constexpr VSource kVSource = kVSource_;
  static constexpr Fp8WideScales kWideScales = kWideScales_;
  static_assert(kVSource == VSource::kRows || kFp8, "V^T from global memory is an FP8 layout");
  // FP8 with V's rows: warps 1-3 of the producer warpgroup transpose V (producer.h).
  static constexpr bool kTransposeV = kFp8 && kVSource == VSource::kRows;
  static constexpr int kNumTransposeThreads = kTransposeV ? 96 : 0;
  // setmaxnreg budget: 128 * (producer + kNumMmaWG * consumer) must not exceed what the CTA was
  // launched with (384 threads x 168 registers): an increase beyond it waits forever. The V
  // transpose (FP8) fits the TMA thread's 24 too.
  static constexpr int kProducerRegs = kNumMmaWG == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = kNumMmaWG == 2 ? 240 : 160;
  static_assert(kBlockM % 64 == 0 && kBlockN % 16 == 0, "WGMMA tile constraints");
  static_assert(kNumMmaWG == 2 || kNumMmaWG == 3, "pingpong barriers exist for 2 or 3 warpgroups");
  static_assert(!kFp8 || (kBlockN % 32 == 0 && kHeadDim % 32 == 0), "FP8 WGMMA K = 32; the transpose moves 16 x 32 blocks");

  using TileShapeQK = cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>, cute::Int<kHeadDim>>;
  using TileShapePV = cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>, cute::Int<kBlockN>>;
  using AtomLayoutMma = cute::Layout<cute::Shape<cute::Int<kNumMmaWG>, cute::_1, cute::_1>>;
  // S = Q K^T: both operands from smem, K-major (head dim contiguous).
  using TiledMmaQK = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, TileShapeQK>(), AtomLayoutMma{}));
  // O += P V: P from registers; V from smem read MN-major (head dim contiguous), or for FP8
  // K-major (keys contiguous: the transposed copy, or V^T as loaded).
  static constexpr cute::GMMA::Major kMajorV = kFp8 ? cute::GMMA::Major::K : cute::GMMA::Major::MN;
  using TiledMmaPV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, TileShapePV, cute::GMMA::Major::K, kMajorV>(),
      AtomLayoutMma{}));

  static constexpr int kBytesQ = kBlockM * kHeadDim * int(sizeof(Element));
  static constexpr int kBytesKV = kBlockN * kHeadDim * int(sizeof(Element));
  static constexpr int kSmemLimit = 227 * 1024 - 1024;  // minus barriers and alignment slack
  // K and V stages, plus V's transposed copy for FP8.
  static constexpr int kBytesKVStages = (kTransposeV ? 3 : 2) * kStages * kBytesKV;
  // A second Q buffer lets the producer load the next tile's Q a tile ahead (producer.h)
  // instead of after this tile's last Q K^T. Only where it fits beside 2 stages of K and V:
  // hdim 64/96 and 128 with 128-key blocks (not 128 x 176, 192, 256).
  static constexpr int kStagesQ = 2 * kBytesQ + kBytesKVStages <= kSmemLimit ? 2 : 1;

  using SmemAtom = decltype(smem_atom_k_major<Element, kHeadDim>());
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>, cute::Int<kStagesQ>>{}));
  using SmemLayoutK = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>, cute::Int<kStages>>{}));
  // V^T as the PV GEMM's B operand (head dim, kBlockN, stage). 16-bit: the same bytes as V,
  // read MN-major. FP8: keys contiguous (K-major), written by the transpose into a buffer of its
  // own, or by TMA from V^T in global memory into V's own buffer.
  using SmemLayoutVtK = decltype(cute::tile_to_shape(
      smem_atom_k_major<Element, kBlockN>(), cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>, cute::Int<kStages>>{}));
  // V as TMA writes it: (keys, head dim, stage), or V^T's (head dim, keys, stage).
  using SmemLayoutV = std::conditional_t<kVSource == VSource::kKeysPermutedT, SmemLayoutVtK, SmemLayoutK>;
  using SmemLayoutVtMN = decltype(cute::composition(
      SmemLayoutK{},
      cute::make_ordered_layout(cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>, cute::Int<kStages>>{},
                                cute::Step<cute::_2, cute::_1, cute::_3>{})));
  using SmemLayoutVt = std::conditional_t<kFp8, SmemLayoutVtK, SmemLayoutVtMN>;
  // O's staging atom, in O's own (16-bit) type.
  using SmemAtomO = decltype(smem_atom_k_major<ElementOut, kHeadDim>());
  // O has no layout here: the epilogue owns its staging (epilogue.h, OStaging).
};

}  // namespace flashattn::sm90
