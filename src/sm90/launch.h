// Host side of one (head dim, dtype) instantiation: the stages' parameters, grid, launch.
// Included by the generated fwd_hdim<D>_<dtype>.cu files, one instantiation each.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "common/error.h"
#include "common/params.h"
#include "sm90/kernel.h"

namespace flashattn::sm90 {

struct LaunchOptions {
  void* workspace;  // fwd_workspace_bytes(): the dynamic scheduler's tile counter, or null
};

// The dynamic tile scheduler's counter, or 0 (tile_scheduler.h).
inline size_t fwd_workspace_bytes(const FwdParams& f) { return TileScheduler::workspace_bytes(f); }

// Each stage builds its own parameters (to_params); this only puts them together and launches.
template <class Traits, class Sched>
flashattn_status launch_fwd_with(const FwdParams& f, cudaStream_t stream, const LaunchOptions& opt) {
  TileScheduler::Params sched{};
  flashattn_status st = TileScheduler::to_params(f, Traits::kBlockM, opt.workspace, &sched);
  if (st != FLASHATTN_SUCCESS || sched.num_tiles == 0) return st;
  const KernelParams<Traits> p{Producer<Traits>::to_params(f), Epilogue<Traits>::to_params(f), f, sched};

  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return cuda_failure(int(err), "sm90 forward: device query");
  if ((err = TileScheduler::initialize_workspace(sched, stream)) != cudaSuccess)
    return cuda_failure(int(err), "sm90 forward: tile counter reset");

  auto kernel = fwd_kernel<Traits, Sched>;
  static_assert(sizeof(SharedStorage<Traits>) <= 227 * 1024, "tile exceeds the sm90 shared memory per block");
  const int smem = int(sizeof(SharedStorage<Traits>));
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return cuda_failure(int(err), "sm90 forward: cudaFuncSetAttribute(smem)");
  kernel<<<TileScheduler::grid_shape(sched, sms), Traits::kNumThreads, smem, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess) return cuda_failure(int(err), "sm90 forward: kernel launch");
  return FLASHATTN_SUCCESS;
}

// The wider unmasked key block (tile_shapes.h) from this many keys on. Measured at hdim 128
// (sustained load, H100): +3% at 8k-16k, equal at 4k, 5-12% slower at 512-2k, where the
// partial last block (2048 = 11.6 x 176) and the per-tile work weigh more.
constexpr int kWideBlockMinSeqlenK = 8192;
// FP8's wide block from 2k keys: below that its padded last block (up to 191 keys) costs more
// than the per-block savings.
constexpr int kWideFp8BlockMinSeqlenK = 2048;

// One (head dim, dtype, schedule) instantiation: the default key block, and the unmasked
// long-sequence one where the head dim has a different one. Sched: the production schedule
// (pingpong and intra-warpgroup overlap), or an ablation one (FLASHATTN_SM90_ABLATION builds).
template <int kHeadDim, class Element, class Sched = Schedule<>>
flashattn_status launch_fwd(const FwdParams& f, cudaStream_t stream, const LaunchOptions& opt) {
  using Cfg = TileConfig<kHeadDim>;
  if constexpr (Cfg::kBlockNUnmasked != Cfg::kBlockN) {
    if (!masked_problem(f) && f.shape.seqlen_k >= kWideBlockMinSeqlenK)  // varlen: max_seqlen_k
      return launch_fwd_with<Traits<kHeadDim, Element, Cfg::kBlockNUnmasked>, Sched>(f, stream, opt);
  }
  return launch_fwd_with<Traits<kHeadDim, Element>, Sched>(f, stream, opt);
}

// The FP8 kernels' schedule. Without pingpong turns (SchedulePingpongOff) where that measured faster
// (perf-notes s39, H200, one binary, alternated rows): the wide per-head kernel (+1-2% at 2k-8k keys,
// -0.4% at 16k; likely reason: a warpgroup in its tile boundary no longer holds the other at its next
// turn) and the hdim-128 kernel that transposes V's rows (+9% at 4k non-causal; not profiled, causal
// not measured); with turns elsewhere (the 128-key V^T kernel lost 7% without them at 4k causal, the
// scale-block one was even; the hdim 64/256 V-rows kernels were not measured).
template <int kHeadDim, class Tr>
using SchedFp8 = std::conditional_t<(Tr::kBlockN != TileConfigFp8<kHeadDim>::kBlockN &&
                                     Tr::kWideScales == Fp8WideScales::kPerHead) ||
                                        (Tr::kTransposeV && kHeadDim == 128),
                                    SchedulePingpongOff, Schedule<>>;
template <int kHeadDim, class Tr>
flashattn_status launch_fwd_fp8_with(const FwdParams& f, cudaStream_t stream, const LaunchOptions& opt) {
  return launch_fwd_with<Tr, SchedFp8<kHeadDim, Tr>>(f, stream, opt);
}

// FP8 (E4M3) inputs, O in ElementOut (bf16 or fp16): 128-key blocks, or the wide unmasked block
// (tile_shapes.h TileConfigFp8);
// V's rows transposed in the kernel, or V^T given (fp8_v_layout keys_permuted16).
template <int kHeadDim, class ElementOut>
flashattn_status launch_fwd_fp8(const FwdParams& f, cudaStream_t stream, const LaunchOptions& opt) {
  using Cfg = TileConfigFp8<kHeadDim>;
  constexpr int kBlockN = Cfg::kBlockN;
  using E = cutlass::float_e4m3_t;
  if constexpr (Cfg::kBlockNUnmasked != kBlockN) {
    // The wide kernels' softmax (mainloop.h kLeanBody, kGroupBody) has no mask past the first block, no
    // softcap and no ALiBi: those take 128. One K/V scale per head (k_blocks == 1): every block of a tile
    // has the same scales (the lean softmax); scale blocks: each 64-key group takes its own.
    if (f.fp8.v_keys_permuted16 && !masked_problem(f) && f.mask.softcap == 0.f && !f.alibi.enabled() &&
        f.shape.seqlen_k >= kWideFp8BlockMinSeqlenK) {
      if (f.fp8.k_blocks == 1)
        return launch_fwd_fp8_with<kHeadDim, Traits<kHeadDim, E, Cfg::kBlockNUnmasked, ElementOut, VSource::kKeysPermutedT>>(
            f, stream, opt);
      return launch_fwd_fp8_with<kHeadDim, Traits<kHeadDim, E, Cfg::kBlockNUnmasked, ElementOut, VSource::kKeysPermutedT,
                                                  Fp8WideScales::kPer64Keys>>(f, stream, opt);
    }
  }
  if (f.fp8.v_keys_permuted16)
    return launch_fwd_fp8_with<kHeadDim, Traits<kHeadDim, E, kBlockN, ElementOut, VSource::kKeysPermutedT>>(f, stream, opt);
  return launch_fwd_fp8_with<kHeadDim, Traits<kHeadDim, E, kBlockN, ElementOut>>(f, stream, opt);
}

}  // namespace flashattn::sm90
