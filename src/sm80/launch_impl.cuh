// Launchers of the sm80 kernels; included only by the generated per-(dtype, head dim) units.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "api/cuda_util.h"
#include "common/error.h"
#include "sm80/bwd_kernel.h"
#include "sm80/fwd_kernel.h"
#include "sm80/kernel_traits.h"
#include "sm80/kv_prepass.h"
#include "sm80/launch.h"

namespace flashattn::sm80 {

// Tile choice per head dim (FA2's sm80 choices). FwdSmallSmem / BwdSmallSmem: the configuration a
// head dim falls back to where its first choice needs more smem than the device has (sm86/sm89:
// 99 KB, A100: 163 KB; with_fitting_config); void where the first choice fits everywhere it is
// supported. A Config that has one hides this default. Every forward has a configuration
// within the 99 KB of sm86/sm89.
struct NoSmallSmem {
  using FwdSmallSmem = void;
  using BwdSmallSmem = void;
};
template <typename E, int D>
struct Config;
template <typename E>
struct Config<E, 32> : NoSmallSmem {
  using Fwd = FwdTraits<E, 32, 128, 128, 4>;
  using Bwd = BwdTraits<E, 32, 64, 128, 8, 2, 4, 4>;
};
template <typename E>
struct Config<E, 64> : NoSmallSmem {
  using Fwd = FwdTraits<E, 64, 128, 64, 4>;  // 128 x 128 spills (255 registers) with this code
  using Bwd = BwdTraits<E, 64, 128, 128, 8, 4, 4, 4>;  // FA2's tile: 163 KB, A100/H100
  using BwdSmallSmem = BwdTraits<E, 64, 64, 128, 8, 2, 4, 4>;  // 97 KB: sm86/sm89
};
template <typename E>
struct Config<E, 96> : NoSmallSmem {
  using Fwd = FwdTraits<E, 96, 128, 64, 4>;
  using Bwd = BwdTraits<E, 96, 64, 128, 8, 2, 4, 4>;
};
template <typename E>
struct Config<E, 128> : NoSmallSmem {
  using Fwd = FwdTraits<E, 128, 128, 64, 4>;
  using Bwd = BwdTraits<E, 128, 64, 128, 8, 2, 4, 2>;
};
template <typename E>
struct Config<E, 192> : NoSmallSmem {
  using Fwd = FwdTraits<E, 192, 128, 64, 8>;
  using Bwd = BwdTraits<E, 192, 64, 64, 8, 2, 4, 2>;
};
template <typename E>
struct Config<E, 256> : NoSmallSmem {
  // FA2's 128 x 64 tile with 8 warps measured no faster at 2k-16k and slower below (perf notes).
  // Two warps per query row (kernel_traits.h): 105 KB, two CTAs per SM on H100/H200.
  using Fwd = FwdTraits<E, 256, 64, 64, 4, /*kWarpsN=*/2>;
  using FwdSmallSmem = FwdTraits<E, 256, 64, 64, 4>;  // 96 KB: sm86/sm89
  using Bwd = BwdTraits<E, 256, 64, 64, 8, 4, 2, 2>;  // 209 KB: H100/H200
  using BwdSmallSmem = BwdTraits<E, 256, 64, 64, 8, 4, 2, 2, /*kStagesQdO=*/1>;  // 145 KB: A100
};

// Shared memory a block may opt into on the current device (capped by flashattn_sm80_set_smem_limit).
inline flashattn_status smem_optin(int* optin, const char* what) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (e != cudaSuccess) return cuda_failure(e, what);
  const int cap = smem_limit();
  if (cap > 0 && cap < *optin) *optin = cap;
  return FLASHATTN_SUCCESS;
}

// Kt where it fits in the device's smem, else Small (where there is one).
template <typename Kt, typename Small, typename Fn>
flashattn_status with_fitting_config(const char* what, Fn&& fn) {
  if constexpr (!std::is_void_v<Small>) {
    int optin = 0;
    flashattn_status s = smem_optin(&optin, what);
    if (s != FLASHATTN_SUCCESS) return s;
    if (Kt::kSmemSize > optin) return fn(Small{});
  }
  return fn(Kt{});
}

// Opts the kernel into `smem` bytes of dynamic shared memory if the device allows it.
template <typename Kernel>
flashattn_status prepare_smem(Kernel kernel, int smem, const char* what, int headdim) {
  int dev = 0, optin = 0;
  flashattn_status st = smem_optin(&optin, what);
  if (st != FLASHATTN_SUCCESS) return st;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return cuda_failure(e, what);
  if (smem > optin)
    return set_error(FLASHATTN_ERROR_NOT_SUPPORTED,
                     "headdim: %d needs %d KB of shared memory per block for the sm80 %s, device %d allows %d KB",
                     headdim, smem / 1024, what, dev, optin / 1024);
  if (smem > 48 * 1024) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return cuda_failure(e, what);
  }
  return FLASHATTN_SUCCESS;
}

inline flashattn_status check_grid(int batch, int heads) {
  if (batch > 65535 || heads > 65535)
    return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "batch/nheads: %d/%d exceed the sm80 grid limit of 65535",
                     batch, heads);
  return FLASHATTN_SUCCESS;
}

template <typename Kt>
flashattn_status run_fwd_with(const FwdParams& p, cudaStream_t stream) {
  auto kernel = p.shape.headdim == Kt::kHeadDim ? fwd_kernel<Kt, true> : fwd_kernel<Kt, false>;
  flashattn_status s = prepare_smem(kernel, Kt::kSmemSize, "forward", Kt::kHeadDim);
  if (s != FLASHATTN_SUCCESS) return s;
  if ((s = check_grid(p.shape.batch, p.shape.nheads_q)) != FLASHATTN_SUCCESS) return s;
  const dim3 grid((p.shape.seqlen_q + Kt::kBlockM - 1) / Kt::kBlockM, p.shape.nheads_q, p.shape.batch);
  if (grid.x == 0) return FLASHATTN_SUCCESS;
  kernel<<<grid, Kt::kNThreads, Kt::kSmemSize, stream>>>(p, SplitKv{}, GqaPack{});
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? FLASHATTN_SUCCESS : cuda_failure(e, "sm80 fwd launch");
}

template <typename Element, int kHeadDim>
flashattn_status run_fwd(const FwdParams& p, cudaStream_t stream) {
  using C = Config<Element, kHeadDim>;
  return with_fitting_config<typename C::Fwd, typename C::FwdSmallSmem>(
      "forward", [&](auto kt) { return run_fwd_with<decltype(kt)>(p, stream); });
}

// The KV-cache forward's decode tile: 32 query rows (decode has a few, GQA-packed), 64 keys, two
// warps per row so each warp reads half of every K/V tile from smem. Prefill-sized calls use
// KvPrefillTraits (kv_prefill_tile). Columns predicated (any head dim up to the kernel's):
// one kernel per (tile, dtype, head dim).
// Paged caches take the kernel that looks their rows' offsets up a key block ahead (every tile).
template <typename Kt>
constexpr bool kv_page_lookahead() { return true; }

template <typename E, int D>
using KvFwdTraits = FwdTraits<E, D, kKvBlockM, kKvBlockN, 4, /*kWarpsN=*/2>;

// CTAs of `kernel` resident per SM, times the SMs: the slots split-KV fills.
template <typename Kernel>
flashattn_status resident_slots(Kernel kernel, int threads, int smem, int* slots) {
  int dev = 0, sms = 0, per_sm = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
  if (e != cudaSuccess) return cuda_failure(e, "sm80 kv occupancy");
  *slots = std::max(1, sms * std::max(1, per_sm));
  return FLASHATTN_SUCCESS;
}

// Whether a paged cache's kernel is built with kStages: with_kv_stages gives paged caches one
// stage (their staged kernels measured 6-40 points slower), so the staged ones are contiguous-only
// and no paged kernel is compiled beside them.
template <int kStages>
constexpr bool kv_paged_stages_ok() { return kStages == 1; }

// The plan of a KV-cache forward on tile Kt. The smem opt-in and the occupancy query run once per
// device: a decode loop calls this twice per step (workspace size, then the launch), and the
// occupancy query costs microseconds of host time.
template <typename Kt, int kStages>
flashattn_status kv_plan_with(const FwdParams& p, KvPlan* plan) {
  auto kernel = fwd_kernel<Kt, false, true, false, kStages>;
  constexpr int kSmem = kv_smem_size_staged<Kt, kStages>();
  constexpr int kMaxDevices = 64;
  static std::atomic<int> slots_of_device[kMaxDevices];
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return cuda_failure(e, "KV-cache forward");
  int slots = dev < kMaxDevices ? slots_of_device[dev].load(std::memory_order_relaxed) : 0;
  if (slots == 0) {
    flashattn_status s = prepare_smem(kernel, kSmem, "KV-cache forward", Kt::kHeadDim);
    if constexpr (kv_paged_stages_ok<kStages>()) {
      if (s == FLASHATTN_SUCCESS)
        s = prepare_smem(fwd_kernel<Kt, false, true, kv_page_lookahead<Kt>(), kStages>, kSmem, "KV-cache forward",
                         Kt::kHeadDim);
    }
    if (s == FLASHATTN_SUCCESS) s = resident_slots(kernel, Kt::kNThreads, kSmem, &slots);
    if (s != FLASHATTN_SUCCESS) return s;
    if (dev < kMaxDevices) slots_of_device[dev].store(slots, std::memory_order_relaxed);
  }
  *plan = kv_plan(p, sizeof(typename Kt::Element), slots, Kt::kBlockM, Kt::kBlockN);
  return FLASHATTN_SUCCESS;
}

// The prefill tile up to hdim 128: 64 query rows x 64 keys, 4 warps (126-246 registers, no
// spills, sm_90 SASS). Not the plain forward's 128-row tile: with the gathers' per-row addressing
// it needed a 2.9 KB stack frame at hdim 128. Above hdim 128 even 64 rows did (3.5 KB at 256 with
// two warps per row), so those head dims keep the 32-row decode tile for every call.
template <typename E, int D>
using KvPrefillTraits = FwdTraits<E, D, 64, kKvBlockN, 4>;

// A decode tile of 16 rows, all four warps splitting the keys: half the MMA and softmax work per key
// block of the 32-row tile when a kv head's rows (GQA-packed) fit in 16. Head dims that are
// multiples of 64 (each warp's share of the head dim a whole MMA tile). Only for few (sequence,
// kv head) pairs, where split-KV makes the grid: there it measured +1-4 points of copy bandwidth
// (batch 1: GQA 32/8 and 64/8, MHA 32/32), while at batch 8 with 8 kv heads it lost 3-6 (s19,
// before its ring and the interleaved splits). Up to 64 pairs over a contiguous cache at hdim 128:
// with 4 stages there (below) the batch-8 GQA rows gained 2-5 points over the 32-row tile (s27,
// H200); paged caches keep 32 (their sq4 batch-8 rows lost 4 points on it).
template <typename E, int D>
using KvDecode16Traits = FwdTraits<E, D, 16, kKvBlockN, 4, /*kWarpsN=*/4>;
constexpr int kKvDecode16MaxPairs = 32;
constexpr int kKvDecode16MaxPairsWide = 64;  // contiguous cache, hdim 128
constexpr int kKvDecodeStages = 3;           // with_kv_stages
constexpr int kKvDecode16WideStages = 4;     // the 16-row tile past kKvDecode16MaxPairs pairs
inline int64_t kv_pairs(const FwdParams& p) {  // (sequence, kv head) pairs: the tiles before splitting
  const flashattn::Shape& sh = p.shape;
  return int64_t(sh.batch) * (kv_may_pack(p) ? sh.nheads_kv : sh.nheads_q);
}
template <int kHeadDim>
bool kv_decode16(const FwdParams& p) {
  const flashattn::Shape& sh = p.shape;
  const int rows = sh.seqlen_q * (kv_may_pack(p) ? sh.group_size() : 1);
  const bool wide = kHeadDim == 128 && !p.kv.paged();
  return rows <= 16 && kv_pairs(p) <= (wide ? kKvDecode16MaxPairsWide : kKvDecode16MaxPairs);
}

// Calls fn(std::integral_constant<int, stages>) with the KV-cache kernel's cp.async stages
// (fwd_kernel's kKvStages) for tile Kt and p: K and V of two key blocks in flight on the 16-row
// decode tile over a contiguous cache (+1-3 points of copy bandwidth on the batch-1 67 MB rows,
// 2 CTAs per SM), and on the 32-row tile at hdim 128 (+4-20 points on the batch 8-128 rows and
// the batch-1 32-row ones, e.g. sq4 64k GQA 64/8 77 -> 82%: 2 CTAs per SM instead of 4, but
// contiguous blocks copied from one pointer and two blocks in flight; s26, H200); one otherwise.
// Paged caches keep one stage (on the 32-row tile too: staged, its batch 8-128 rows ran at 55-67%
// instead of 72-98%, s26). With per-row page lookups the
// gathers' code made the staged paged rows 14-23 points slower (s20), and with the row offsets
// looked up ahead (fwd_kernel's kPageLookahead) staging still cost the batch-1 rows 6-13 points
// (its smem halves the CTAs per SM, so the split heuristic picks fewer splits; s22, H200).
// Past kKvDecode16MaxPairs pairs (batch >= 5 with 8 kv heads) the 16-row tile at hdim 128 takes 4
// stages, one CTA per SM by smem: +0-4 points over 3 stages on the batch-8 rows, while at batch 1
// a deeper ring (5) lost 7 points (s27, H200).
template <typename Kt, typename Fn>
flashattn_status with_kv_stages(const FwdParams& p, Fn&& fn) {
  if constexpr (Kt::kBlockM == 16 && Kt::kHeadDim == 128) {
    if (!p.kv.paged() && kv_pairs(p) > kKvDecode16MaxPairs)
      return fn(std::integral_constant<int, kKvDecode16WideStages>{});
  }
  if constexpr (Kt::kBlockM == 16 && Kt::kHeadDim <= 128) {
    if (!p.kv.paged()) return fn(std::integral_constant<int, kKvDecodeStages>{});
  }
  if constexpr (Kt::kBlockM == kKvBlockM && Kt::kHeadDim == 128) {
    if (!p.kv.paged()) return fn(std::integral_constant<int, kKvDecodeStages>{});
  }
  return fn(std::integral_constant<int, 1>{});
}

// Calls fn(Kt{}) with the KV-cache forward's tile for p: decode or prefill-sized.
template <typename Element, int kHeadDim, typename Fn>
flashattn_status with_kv_tile(const FwdParams& p, Fn&& fn) {
  if constexpr (kHeadDim <= 128) {
    if (kv_prefill_tile(p)) return fn(KvPrefillTraits<Element, kHeadDim>{});
  }
  if constexpr (kHeadDim % 64 == 0 && kHeadDim <= 128) {
    if (kv_decode16<kHeadDim>(p)) return fn(KvDecode16Traits<Element, kHeadDim>{});
  }
  return fn(KvFwdTraits<Element, kHeadDim>{});
}

template <typename Element, int kHeadDim>
flashattn_status kv_plan_for(const FwdParams& p, KvPlan* plan) {
  return with_kv_tile<Element, kHeadDim>(p, [&](auto kt) {
    using Kt = decltype(kt);
    return with_kv_stages<Kt>(p, [&](auto stages) { return kv_plan_with<Kt, decltype(stages)::value>(p, plan); });
  });
}

template <typename Element, int kHeadDim>
size_t kv_workspace(const FwdParams& p) {
  KvPlan plan;
  return kv_plan_for<Element, kHeadDim>(p, &plan) == FLASHATTN_SUCCESS ? plan.total : 0;
}

template <typename Kt, int kStages>
flashattn_status run_fwd_kv_with(const FwdParams& p, void* workspace, cudaStream_t stream) {
  using Element = typename Kt::Element;
  KvPlan plan;
  flashattn_status s = kv_plan_with<Kt, kStages>(p, &plan);
  if (s != FLASHATTN_SUCCESS) return s;
  if (plan.total > 0 && workspace == nullptr)
    return set_error(FLASHATTN_ERROR_WORKSPACE, "workspace: the sm80 KV-cache forward needs %zu bytes", plan.total);
  plan.bind(workspace);
  const FwdParams& a = plan.attn;
  const GqaPack& pack = plan.pack;
  if ((s = check_grid(a.shape.batch * plan.split.num_splits, pack.heads(a.shape.nheads_q))) != FLASHATTN_SUCCESS)
    return s;
  cudaError_t e = cudaSuccess;
  const dim3 grid((pack.rows(a.shape.seqlen_q) + Kt::kBlockM - 1) / Kt::kBlockM, pack.heads(a.shape.nheads_q),
                  a.shape.batch * plan.split.num_splits);
  // 1. Rotated appends (and q rotated into the workspace), before any attention reads the cache.
  // Appends without rotary are fused into the attention kernel, which has a CTA per (sequence,
  // kv head) whenever it launches at all.
  const bool prepass_appends = p.kv.appends() && (p.kv.rotary() || grid.x == 0);
  Element* q_rot = plan.rotate_q ? static_cast<Element*>(const_cast<void*>(a.q)) : nullptr;
  const int64_t rows = (prepass_appends ? int64_t(p.shape.batch) * p.kv.seqlen_new * p.shape.nheads_kv : 0) +
                       (q_rot ? int64_t(p.shape.batch) * p.shape.seqlen_q * p.shape.nheads_q : 0);
  if (rows > 0) {
    // (rows > 0 without prepass_appends means q rotated and no appends: the prepass's own test.)
    const int pre_grid = int(std::min<int64_t>((rows + kPrepassWarps - 1) / kPrepassWarps, 1 << 16));
    kv_prepass_kernel<Element><<<pre_grid, 32 * kPrepassWarps, 0, stream>>>(p, q_rot);
    if ((e = cudaGetLastError()) != cudaSuccess) return cuda_failure(e, "sm80 kv prepass launch");
  }
  // 2. Attention (appending itself where the prepass did not), each split writing its partial
  // results (or out itself without splits).
  if (grid.x == 0) return FLASHATTN_SUCCESS;
  auto kernel = fwd_kernel<Kt, false, true, false, kStages>;
  if constexpr (kv_paged_stages_ok<kStages>()) {
    if (a.kv.paged()) kernel = fwd_kernel<Kt, false, true, kv_page_lookahead<Kt>(), kStages>;
  } else if (a.kv.paged()) {
    return set_error(FLASHATTN_ERROR_INTERNAL, "block_table: no paged KV-cache kernel with %d stages", kStages);
  }
  kernel<<<grid, Kt::kNThreads, kv_smem_size_staged<Kt, kStages>(), stream>>>(a, plan.split, pack);
  if ((e = cudaGetLastError()) != cudaSuccess) return cuda_failure(e, "sm80 kv fwd launch");
  // 3. The splits merged into out and the LSE (in the layout the attention kernel saw).
  if (plan.split.num_splits > 1) {
    const int64_t out_stride[3] = {a.o_stride.batch, a.o_stride.row, a.o_stride.head};
    const int64_t lse_stride[3] = {int64_t(a.shape.nheads_q) * a.shape.seqlen_q, a.shape.seqlen_q, 1};
    return cuda::combine(plan.split.combine_into(a.o, a.dtype, out_stride, a.lse, lse_stride), stream,
                         /*after_primary=*/true);
  }
  return FLASHATTN_SUCCESS;
}

template <typename Element, int kHeadDim>
flashattn_status run_fwd_kv(const FwdParams& p, void* workspace, cudaStream_t stream) {
  return with_kv_tile<Element, kHeadDim>(p, [&](auto kt) {
    using Kt = decltype(kt);
    return with_kv_stages<Kt>(
        p, [&](auto stages) { return run_fwd_kv_with<Kt, decltype(stages)::value>(p, workspace, stream); });
  });
}

template <typename Kt>
flashattn_status run_bwd_with(const BwdParams& p, void* workspace, cudaStream_t stream) {
  constexpr int kHeadDim = Kt::kHeadDim;
  using Element = typename Kt::Element;
  static_assert(Kt::kBlockM % kBwdMinBlockM == 0);
  const bool rare_options = p.mask.softcap > 0.f || p.deterministic || p.alibi.enabled() || p.dropout.enabled();
  auto kernel = rare_options ? bwd_kernel<Kt, true> : bwd_kernel<Kt, false>;
  flashattn_status s = prepare_smem(kernel, Kt::kSmemSize, "backward", kHeadDim);
  if (s != FLASHATTN_SUCCESS) return s;
  if ((s = check_grid(p.shape.batch, p.shape.nheads_q)) != FLASHATTN_SUCCESS) return s;

  const BwdWorkspaceLayout l = bwd_workspace_layout(p, kHeadDim);
  char* base = static_cast<char*>(workspace);
  static_assert(Kt::kBlockM <= kBwdMaxBlockM);
  BwdWorkspace ws;
  ws.dq_accum = reinterpret_cast<float*>(base + l.dq_accum);
  ws.dq_accum_floats = int64_t((l.dsum - l.dq_accum) / sizeof(float));
  ws.dsum = reinterpret_cast<float*>(base + l.dsum);
  ws.semaphores = p.deterministic ? reinterpret_cast<int*>(base + l.semaphores) : nullptr;
  ws.num_m_blocks = l.num_m_blocks;

  // The workspace arrives uninitialised: the preprocess zeroes the dQ accumulator, a memset the
  // deterministic mode's counters.
  cudaError_t e = cudaSuccess;
  if (l.sem_bytes > 0 && (e = cudaMemsetAsync(ws.semaphores, 0, l.sem_bytes, stream)) != cudaSuccess)
    return cuda_failure(e, "sm80 bwd workspace memset");

  const int64_t rows = int64_t(p.shape.total_q) * p.shape.nheads_q;
  // One pass of kPreprocessRowsPerThread rows per lane group (the accumulator zeroing follows
  // the same grid with a grid-stride loop); capped, the kernel loops.
  const int64_t rows_per_cta = kPreprocessThreads / preprocess_lanes_per_row<kHeadDim>() * kPreprocessRowsPerThread;
  const int64_t pre_ctas = std::max<int64_t>((rows + rows_per_cta - 1) / rows_per_cta,
                                             (ws.dq_accum_floats / 4 + 8 * kPreprocessThreads - 1) / (8 * kPreprocessThreads));
  const int pre_grid = int(std::min<int64_t>(pre_ctas, 1 << 16));
  if (pre_grid > 0) {
    bwd_preprocess_kernel<Element, kHeadDim>
        <<<pre_grid, kPreprocessThreads, 0, stream>>>(p, ws.dsum, reinterpret_cast<float4*>(ws.dq_accum), ws.dq_accum_floats / 4);
    if ((e = cudaGetLastError()) != cudaSuccess) return cuda_failure(e, "sm80 bwd preprocess launch");
  }

  const dim3 grid((p.shape.seqlen_k + Kt::kBlockN - 1) / Kt::kBlockN, p.shape.nheads_kv, p.shape.batch);
  if (grid.x > 0) {
    kernel<<<grid, Kt::kNThreads, Kt::kSmemSize, stream>>>(p, ws);
    if ((e = cudaGetLastError()) != cudaSuccess) return cuda_failure(e, "sm80 bwd launch");
  }

  const dim3 post_grid((p.shape.seqlen_q + Kt::kBlockM - 1) / Kt::kBlockM, p.shape.nheads_q, p.shape.batch);
  if (post_grid.x > 0) {
    bwd_postprocess_kernel<Kt><<<post_grid, Kt::kNThreads, 0, stream>>>(p, ws);
    if ((e = cudaGetLastError()) != cudaSuccess) return cuda_failure(e, "sm80 bwd postprocess launch");
  }
  return FLASHATTN_SUCCESS;
}

template <typename Element, int kHeadDim>
flashattn_status run_bwd(const BwdParams& p, void* workspace, cudaStream_t stream) {
  using C = Config<Element, kHeadDim>;
  return with_fitting_config<typename C::Bwd, typename C::BwdSmallSmem>(
      "backward", [&](auto kt) { return run_bwd_with<decltype(kt)>(p, workspace, stream); });
}

}  // namespace flashattn::sm80
