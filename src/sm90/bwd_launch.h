// Host side of one (head dim, dtype) instantiation of the Hopper backward: workspace carving,
// preprocess, main kernel, postprocess, all on the caller's stream. Included by the generated
// bwd_hdim<D>_<dtype>.cu files, one instantiation each.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/error.h"
#include "common/params.h"
#include "sm90/bwd_kernel.h"
#include "sm90/bwd_prepost.h"
#include "sm90/bwd_workspace.h"

namespace flashattn::sm90 {

template <int kHeadDim>
size_t bwd_workspace_bytes(const BwdParams& p) {
  return bwd_workspace_layout(p, BwdTileConfig<kHeadDim>::kBlockM, kHeadDim, nullptr, nullptr);
}

template <int kHeadDim, class Element>
flashattn_status launch_bwd(const BwdParams& p, void* workspace, cudaStream_t stream) {
  using Traits = BwdTraits<kHeadDim, Element>;
  using K = BwdKernel<Traits>;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  static_assert(K::kSmemBytes <= 227 * 1024, "backward tile exceeds the sm90 shared memory per block");
  const Shape& s = p.shape;
  if (workspace == nullptr)
    return set_error(FLASHATTN_ERROR_WORKSPACE, "workspace: the sm90 backward needs %zu bytes",
                     bwd_workspace_bytes<kHeadDim>(p));
  if (s.batch > 65535 || s.nheads_q > 65535)
    return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "shape: batch %d x heads %d exceed the sm90 backward grid",
                     s.batch, s.nheads_q);
  BwdWorkspace ws;
  bwd_workspace_layout(p, kBlockM, kHeadDim, workspace, &ws);

  const int num_m = (s.seqlen_q + kBlockM - 1) / kBlockM;  // varlen: max_seqlen_q
  const int num_n = (s.seqlen_k + kBlockN - 1) / kBlockN;
  const int64_t ctas = int64_t(num_n) * s.nheads_kv * s.batch;
  if (ctas > INT32_MAX)
    return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "shape: %lld key blocks exceed the sm90 grid", (long long)ctas);
  const dim3 row_tiles(unsigned(num_m), unsigned(s.nheads_q), unsigned(s.batch));
  cudaError_t err = cudaSuccess;
  if (num_m > 0) {
    bwd_preprocess_kernel<Element, kHeadDim, kBlockM><<<row_tiles, 128, 0, stream>>>(p, ws);
    if ((err = cudaGetLastError()) != cudaSuccess) return cuda_failure(int(err), "sm90 backward: preprocess launch");
  }
  if (ctas > 0) {
    typename K::Params kp{K::Mainloop::to_params(p, ws), K::Epilogue::to_params(p), num_n, p.deterministic ? 1 : 0};
    auto kernel = bwd_kernel<Traits>;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, K::kSmemBytes);
    if (err != cudaSuccess) return cuda_failure(int(err), "sm90 backward: cudaFuncSetAttribute(smem)");
    kernel<<<unsigned(ctas), Traits::kNumThreads, K::kSmemBytes, stream>>>(kp);
    if ((err = cudaGetLastError()) != cudaSuccess) return cuda_failure(int(err), "sm90 backward: kernel launch");
  }
  if (num_m > 0) {
    bwd_postprocess_kernel<Traits><<<row_tiles, Traits::kNumMmaThreads, 0, stream>>>(p, ws);
    if ((err = cudaGetLastError()) != cudaSuccess) return cuda_failure(int(err), "sm90 backward: postprocess launch");
  }
  return FLASHATTN_SUCCESS;
}

}  // namespace flashattn::sm90
