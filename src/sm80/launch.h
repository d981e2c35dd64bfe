// Host side of the sm80 path: per-(dtype, head dim) launchers, instantiated one per
// translation unit by src/sm80/CMakeLists.txt, and the workspace layout of the backward.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/params.h"
#include "flashattn/flashattn.h"

namespace flashattn::sm80 {

template <typename Element, int kHeadDim>
flashattn_status run_fwd(const FwdParams& p, cudaStream_t stream);
template <typename Element, int kHeadDim>
flashattn_status run_bwd(const BwdParams& p, void* workspace, cudaStream_t stream);

// Caps the shared memory the sm80 kernels assume a block may use (0 = the device's own limit),
// so tests on a large-smem GPU exercise the tile choices of smaller ones (A100: 163 KB).
int smem_limit();

// Smallest query-block size of any backward configuration: the deterministic mode's dQ
// semaphores (one per query block) are sized with it, an upper bound for larger blocks.
constexpr int kBwdMinBlockM = 64;
// Largest query-block size of any backward configuration: the dQ accumulator's per-sequence
// padding (dq_tile in bwd_kernel.h) is sized with it.
constexpr int kBwdMaxBlockM = 128;

struct BwdWorkspaceLayout {
  size_t dq_accum = 0;    // offset of the fp32 dQ accumulator
  size_t dsum = 0;        // offset of D = rowsum(dO * O)
  size_t semaphores = 0;  // offset of the deterministic-mode counters
  size_t sem_bytes = 0;
  size_t total = 0;
  int num_m_blocks = 0;
};

inline size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

// kernel_headdim: the kernel's (the dQ accumulator's row width), >= the tensors' head dim.
inline BwdWorkspaceLayout bwd_workspace_layout(const BwdParams& p, int kernel_headdim) {
  BwdWorkspaceLayout l;
  const flashattn::Shape& s = p.shape;
  l.num_m_blocks = (s.seqlen_q + kBwdMinBlockM - 1) / kBwdMinBlockM;
  l.dq_accum = 0;
  const size_t dq_rows = size_t(dq_accum_rows(s.total_q, s.batch, kBwdMaxBlockM));  // tiles padded per sequence
  l.dsum = align256(dq_rows * s.nheads_q * kernel_headdim * sizeof(float));
  l.semaphores = l.dsum + align256(size_t(s.total_q) * s.nheads_q * sizeof(float));
  l.sem_bytes = p.deterministic ? size_t(s.batch) * s.nheads_q * l.num_m_blocks * sizeof(int) : 0;
  l.total = l.semaphores + align256(l.sem_bytes);
  return l;
}

}  // namespace flashattn::sm80
