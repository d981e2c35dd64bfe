// Before the KV-cache forward (flash_attn_with_kvcache): appends k_new/v_new into the cache at
// each sequence's end row, the keys rotated at their positions, and writes q rotated (if the call
// has a rotary embedding) to a contiguous [batch, seqlen_q, nheads_q, headdim] buffer that the
// attention kernel then reads as q. One warp per row; the lanes take the rotary pairs, then the
// columns past rotary_dim. fp32 math, each result rounded once to Element (flashattn.h).
// v1: its own launch before the attention kernel (same stream), not yet fused into the producer.
#pragma once

#include <cuda_runtime.h>

#include "common/params.h"
#include "sm80/kernel_traits.h"

namespace flashattn::sm80 {

constexpr int kPrepassWarps = 4;

// Rotates (or copies) one row of d elements from src to dst at rotary position pos.
template <typename Element>
__device__ __forceinline__ void rotate_row_to(const KvCache& kv, const Element* src, Element* dst, int d, int pos,
                                              int lane) {
  const int rd = kv.rotary() ? kv.rotary_dim : 0, half = rd / 2;
  const Element* cos_row = static_cast<const Element*>(kv.rotary_cos) + int64_t(pos) * half;
  const Element* sin_row = static_cast<const Element*>(kv.rotary_sin) + int64_t(pos) * half;
  for (int c = lane; c < half; c += 32) {
    const int c0 = kv.rotary_interleaved ? 2 * c : c, c1 = kv.rotary_interleaved ? 2 * c + 1 : c + half;
    const float cs = float(cos_row[c]), sn = float(sin_row[c]);
    const float x0 = float(src[c0]), x1 = float(src[c1]);
    dst[c0] = Element(x0 * cs - x1 * sn);
    dst[c1] = Element(x0 * sn + x1 * cs);
  }
  for (int c = rd + lane; c < d; c += 32) dst[c] = src[c];
}

template <typename Element>
__global__ void __launch_bounds__(32 * kPrepassWarps) kv_prepass_kernel(const FwdParams p, Element* q_rot) {
  const KvCache& kv = p.kv;
  const flashattn::Shape& sh = p.shape;
  const int d = sh.headdim, lane = threadIdx.x % 32;
  const int64_t new_rows = kv.appends() ? int64_t(sh.batch) * kv.seqlen_new * sh.nheads_kv : 0;
  const int64_t q_rows = q_rot != nullptr ? int64_t(sh.batch) * sh.seqlen_q * sh.nheads_q : 0;
  const int64_t warps = int64_t(gridDim.x) * kPrepassWarps;
  for (int64_t item = int64_t(blockIdx.x) * kPrepassWarps + threadIdx.x / 32; item < new_rows + q_rows;
       item += warps) {
    if (item < new_rows) {  // new row j of sequence b, kv head h
      const int h = int(item % sh.nheads_kv), j = int(item / sh.nheads_kv % kv.seqlen_new);
      const int b = int(item / (int64_t(sh.nheads_kv) * kv.seqlen_new));
      const SeqBounds sb = seq_bounds(sh, p.cu_seqlens_q, p.cu_seqlens_k, kv, b);
      const int r = kv.end_row(b, sh.seqlen_k) - kv.seqlen_new + j;
      const Element* kn = static_cast<const Element*>(kv.k_new) + b * kv.k_new_batch + j * kv.k_new_row +
                          h * kv.k_new_head;
      const Element* vn = static_cast<const Element*>(kv.v_new) + b * kv.v_new_batch + j * kv.v_new_row +
                          h * kv.v_new_head;
      Element* kc = const_cast<Element*>(static_cast<const Element*>(p.k)) + cache_offset(p.k_stride, kv, b, sb, r, h);
      Element* vc = const_cast<Element*>(static_cast<const Element*>(p.v)) + cache_offset(p.v_stride, kv, b, sb, r, h);
      rotate_row_to(kv, kn, kc, d, KvCache::clamp(r, 0, kv.rotary_seqlen - 1), lane);
      for (int c = lane; c < d; c += 32) vc[c] = vn[c];
    } else {  // query row i of sequence b, head h
      const int64_t qi = item - new_rows;
      const int h = int(qi % sh.nheads_q), i = int(qi / sh.nheads_q % sh.seqlen_q);
      const int b = int(qi / (int64_t(sh.nheads_q) * sh.seqlen_q));
      const Element* src = static_cast<const Element*>(p.q) + row_offset(p.q_stride, b, 0, i, h);
      Element* dst = q_rot + ((int64_t(b) * sh.seqlen_q + i) * sh.nheads_q + h) * d;
      rotate_row_to(kv, src, dst, d, kv.q_position(b, i), lane);
    }
  }
}

}  // namespace flashattn::sm80
