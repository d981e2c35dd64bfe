// Host side of the sm80 path: per-(dtype, head dim) launchers, instantiated one per
// translation unit by src/sm80/CMakeLists.txt, and the workspace layout of the backward.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/gqa_pack.h"
#include "common/params.h"
#include "common/split_kv.h"
#include "flashattn/flashattn.h"

namespace flashattn::sm80 {

template <typename Element, int kHeadDim>
flashattn_status run_fwd(const FwdParams& p, cudaStream_t stream);
// The forward over a KV cache (p.kv.enabled()): append/rotary prepass, GQA packing for one-query
// decode, split-KV and its combine. `workspace` holds kv_plan(...).workspace bytes.
template <typename Element, int kHeadDim>
flashattn_status run_fwd_kv(const FwdParams& p, void* workspace, cudaStream_t stream);
template <typename Element, int kHeadDim>
size_t kv_workspace(const FwdParams& p);
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

// The KV-cache forward's decode tile (launch_impl.cuh: KvFwdTraits): few query rows, two warps
// per row. Calls with more than kKvPrefillMinRows query rows (prefill or chunked prefill over a
// cache) run a 64-row tile instead (KvPrefillTraits).
constexpr int kKvBlockM = 32;
constexpr int kKvBlockN = 64;
constexpr int kKvPrefillMinRows = 64;
inline bool kv_prefill_tile(const FwdParams& p) { return p.shape.seqlen_q > kKvPrefillMinRows; }

// How a KV-cache forward runs: the params its attention kernel sees, the split count and the
// workspace carve-up. The same for the size query and the call (a function of shapes only).
struct KvPlan {
  FwdParams attn;              // q rotated by the prepass (else the call's)
  bool rotate_q = false;       // the prepass writes q rotated to the workspace
  GqaPack pack;                // the query heads of a kv head as the rows of its tiles
  SplitKv split;               // num_splits, partial buffers (pointers filled by bind())
  size_t q_rot = 0, o_partial = 0, lse_partial = 0, total = 0;  // workspace offsets / size

  void bind(void* workspace) {
    char* base = static_cast<char*>(workspace);
    if (rotate_q) attn.q = base + q_rot;
    if (split.num_splits > 1) {
      split.o_partial = reinterpret_cast<float*>(base + o_partial);
      split.lse_partial = reinterpret_cast<float*>(base + lse_partial);
    }
  }
};

// Whether a KV-cache call may pack a kv head's query heads into one tile (common/gqa_pack.h): not
// varlen, and not with ALiBi or dropout, which are per head (and fixed length only).
inline bool kv_may_pack(const FwdParams& p) {
  return p.cu_seqlens_q == nullptr && !p.alibi.enabled() && !p.dropout.enabled();
}

// `slots`: CTAs the device runs at once (SMs x resident CTAs of the kernel); block_m x block_n
// its tile.
inline KvPlan kv_plan(const FwdParams& p, size_t element_size, int slots, int block_m, int block_n) {
  KvPlan k;
  k.attn = p;
  FwdParams& a = k.attn;
  flashattn::Shape& sh = a.shape;
  const bool varlen = p.cu_seqlens_q != nullptr;
  if (p.kv.rotary()) {  // rotated q: contiguous [batch, seqlen_q, nheads_q, headdim]
    k.rotate_q = true;
    a.q_stride = RowStrides{int64_t(sh.seqlen_q) * sh.nheads_q * sh.headdim, int64_t(sh.nheads_q) * sh.headdim,
                            sh.headdim};
    k.q_rot = 0;
    k.total = align256(size_t(sh.batch) * sh.seqlen_q * sh.nheads_q * sh.headdim * element_size);
  }
  // GQA packing (common/gqa_pack.h) where it takes fewer tiles, so K/V are read once per group:
  // a few queries per sequence (decode, speculative decoding). Prefill-sized q fills its tiles
  // either way.
  const int group = sh.group_size();
  if (group > 1 && kv_may_pack(p)) {
    const int64_t unpacked = int64_t((sh.seqlen_q + block_m - 1) / block_m) * group;
    const int64_t packed = (int64_t(sh.seqlen_q) * group + block_m - 1) / block_m;
    if (packed < unpacked) k.pack.group = group;
  }
  // Split-KV for fixed-length calls (varlen rows outside every sequence would be combined from
  // unwritten partials).
  int splits = 1;
  if (!varlen && p.num_splits != 1) {
    const int64_t ctas = int64_t((k.pack.rows(sh.seqlen_q) + block_m - 1) / block_m) * k.pack.heads(sh.nheads_q) * sh.batch;
    const int n_blocks = (sh.seqlen_k + block_n - 1) / block_n;
    splits = p.num_splits > 1 ? std::max(1, std::min(p.num_splits, n_blocks)) : choose_num_splits(ctas, slots, n_blocks, 128);
  }
  k.split.num_splits = splits;
  k.split.batch = sh.batch;
  k.split.seqlen_q = sh.seqlen_q;
  k.split.nheads = sh.nheads_q;
  k.split.headdim = sh.headdim;
  if (splits > 1) {
    k.o_partial = k.total;
    k.total += align256(size_t(SplitKv::o_floats(splits, sh.batch, sh.seqlen_q, sh.nheads_q, sh.headdim)) * 4);
    k.lse_partial = k.total;
    k.total += align256(size_t(SplitKv::lse_floats(splits, sh.batch, sh.seqlen_q, sh.nheads_q)) * 4);
  }
  return k;
}

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
