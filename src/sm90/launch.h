// Host side of one (head dim, dtype) instantiation: TMA descriptors, grid, launch.
// Included by the generated fwd_hdim<D>_<dtype>.cu files, one instantiation each.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include "common/error.h"
#include "common/params.h"
#include "sm90/kernel.h"

namespace flashattn::sm90 {

struct LaunchOptions {
  int pingpong;
  int intra_warpgroup_overlap;
  void* workspace;  // fwd_workspace_bytes(): the dynamic scheduler's tile counter, or null
};

// Masked problems (causal / local) have tiles of unequal length. Up to kDynamicMaxSeqlenK keys
// a tile is short enough that a per-tile CTA launch and cold start cost 2-20% (measured,
// docs/perf-notes.md): a persistent grid with the dynamic schedule wins. Beyond it, one CTA
// per tile on the hardware block scheduler measured ~1% faster (the dynamic producer loop
// spills). Each needs one counter of workspace.
constexpr int kDynamicMaxSeqlenK = 4096;
inline bool masked_problem(const FwdParams& f) { return f.mask.window_left >= 0 || f.mask.window_right >= 0; }
inline bool dynamic_schedule(const FwdParams& f) {
  return masked_problem(f) && f.shape.seqlen_k <= kDynamicMaxSeqlenK;
}
inline size_t fwd_workspace_bytes(const FwdParams& f) { return dynamic_schedule(f) ? 16 : 0; }

template <class Traits>
flashattn_status launch_fwd_with(const FwdParams& f, cudaStream_t stream, const LaunchOptions& opt) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
  using Params = KernelParams<Traits>;
  const flashattn::Shape& s = f.shape;
  const bool varlen = f.cu_seqlens_q != nullptr;
  const int rows_q = varlen ? s.total_q : s.seqlen_q;
  const int rows_k = varlen ? s.total_k : s.seqlen_k;
  const int batch = varlen ? 1 : s.batch;

  auto gmem = [&](const void* ptr, int rows, int heads, const RowStrides& st) {
    ShapeQKV shape(rows, kHeadDim, heads, batch);
    StrideQKV stride(tma_stride(rows, st.row), _1{}, tma_stride(heads, st.head), tma_stride(batch, st.batch));
    return make_tensor(make_gmem_ptr(static_cast<Element const*>(ptr)), make_layout(shape, stride));
  };
  Params p{};
  p.tma_q = make_tma_copy(SM90_TMA_LOAD{}, gmem(f.q, rows_q, s.nheads_q, f.q_stride), take<0, 2>(typename Traits::SmemLayoutQ{}),
                          cute::Shape<cute::Int<Traits::kBlockM>, Int<kHeadDim>>{}, _1{});
  p.tma_k = make_tma_copy(SM90_TMA_LOAD{}, gmem(f.k, rows_k, s.nheads_kv, f.k_stride),
                          take<0, 2>(typename Traits::SmemLayoutK{}), cute::Shape<cute::Int<Traits::kBlockN>, Int<kHeadDim>>{}, _1{});
  p.tma_v = make_tma_copy(SM90_TMA_LOAD{}, gmem(f.v, rows_k, s.nheads_kv, f.v_stride),
                          take<0, 2>(typename Traits::SmemLayoutV{}), cute::Shape<cute::Int<Traits::kBlockN>, Int<kHeadDim>>{}, _1{});
  if constexpr (Traits::kTmaStoreO) {  // hdim 192/256 store O from registers: no descriptor to encode
    ShapeQKV shape_o(rows_q, kHeadDim, s.nheads_q, batch);
    StrideQKV stride_o(tma_stride(rows_q, f.o_stride.row), _1{}, tma_stride(s.nheads_q, f.o_stride.head),
                       tma_stride(batch, f.o_stride.batch));
    p.tma_o = make_tma_copy(SM90_TMA_STORE{}, make_tensor(make_gmem_ptr(static_cast<Element*>(f.o)), shape_o, stride_o),
                            take<0, 2>(typename Traits::SmemLayoutO{}), cute::Shape<_64, Int<kHeadDim>>{}, _1{});
  }
  p.shape_q = ShapeQKV(rows_q, kHeadDim, s.nheads_q, batch);
  p.shape_k = ShapeQKV(rows_k, kHeadDim, s.nheads_kv, batch);
  p.fwd = f;
  p.pingpong = opt.pingpong;
  p.intra_warpgroup_overlap = opt.intra_warpgroup_overlap;

  const int num_m = (s.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;  // varlen: max_seqlen_q
  const int64_t tiles = int64_t(num_m) * s.nheads_q * s.batch;
  if (tiles == 0) return FLASHATTN_SUCCESS;
  if (tiles > INT32_MAX) return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "shape: %lld tiles exceed the sm90 grid", (long long)tiles);
  const bool masked = masked_problem(f), dynamic = dynamic_schedule(f);
  if (dynamic && opt.workspace == nullptr)
    return set_error(FLASHATTN_ERROR_WORKSPACE, "workspace: the sm90 causal/local forward needs %zu bytes",
                     fwd_workspace_bytes(f));
  int* counter = dynamic ? static_cast<int*>(opt.workspace) : nullptr;
  p.scheduler = TileScheduler{num_m, s.nheads_q, int(tiles), masked ? 1 : 0, counter};

  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return cuda_failure(int(err), "sm90 forward: device query");
  if (counter != nullptr && (err = cudaMemsetAsync(counter, 0, sizeof(int), stream)) != cudaSuccess)
    return cuda_failure(int(err), "sm90 forward: tile counter reset");
  // Persistent (one CTA per SM, tile_scheduler.h), except long masked problems: one CTA per tile.
  const int grid = masked && !dynamic ? int(tiles) : int(std::min<int64_t>(tiles, sms));

  auto kernel = fwd_kernel<Traits>;
  static_assert(sizeof(SharedStorage<Traits>) <= 227 * 1024, "tile exceeds the sm90 shared memory per block");
  const int smem = int(sizeof(SharedStorage<Traits>));
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return cuda_failure(int(err), "sm90 forward: cudaFuncSetAttribute(smem)");
  kernel<<<grid, Traits::kNumThreads, smem, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess) return cuda_failure(int(err), "sm90 forward: kernel launch");
  return FLASHATTN_SUCCESS;
}

// The wider unmasked key block (tile_shapes.h) from this many keys on. Measured at hdim 128
// (sustained load, H100): +3% at 8k-16k, equal at 4k, 5-12% slower at 512-2k, where the
// partial last block (2048 = 11.6 x 176) and the per-tile work weigh more.
constexpr int kWideBlockMinSeqlenK = 8192;

// One (head dim, dtype) instantiation: the default key block, and the unmasked long-sequence
// one where the head dim has a different one.
template <int kHeadDim, class Element>
flashattn_status launch_fwd(const FwdParams& f, cudaStream_t stream, const LaunchOptions& opt) {
  using Cfg = TileConfig<kHeadDim>;
  if constexpr (Cfg::kBlockNUnmasked != Cfg::kBlockN) {
    if (!masked_problem(f) && f.shape.seqlen_k >= kWideBlockMinSeqlenK)  // varlen: max_seqlen_k
      return launch_fwd_with<Traits<kHeadDim, Element, Cfg::kBlockNUnmasked>>(f, stream, opt);
  }
  return launch_fwd_with<Traits<kHeadDim, Element>>(f, stream, opt);
}

}  // namespace flashattn::sm90
