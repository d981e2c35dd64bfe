// Before the KV-cache forward (flash_attn_with_kvcache): appends k_new/v_new into the cache at
// each sequence's end row, the keys rotated at their positions, and writes q rotated (if the call
// has a rotary embedding) to a contiguous [batch, seqlen_q, nheads_q, headdim] buffer that the
// attention kernel then reads as q. One warp per row; the lanes take the rotary pairs, then the
// columns past rotary_dim. fp32 math, each result rounded once to Element (flashattn.h).
// Without a rotary embedding the attention kernel appends itself (append_rows_cta below, fused:
// no prepass launch); with one, the rotation runs here, in its own launch before the attention.
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

// The appended rows of sequence b, kv head hk, copied (not rotated) into the cache by the
// `threads` threads of one CTA: the attention kernel's fused append (fwd_kernel.h). 16-byte
// vectors where every address allows them (the usual layout), elements otherwise.
template <typename Element>
__device__ __forceinline__ void append_rows_cta(const FwdParams& p, const SeqBounds& sb, int b, int hk, int tid,
                                                int threads) {
  const KvCache& kv = p.kv;
  const int d = p.shape.headdim;
  const int end = sb.k_row0 + sb.seqlen_k;  // the sequence's end row after appending (cache rows)
  constexpr int kVec = 16 / int(sizeof(Element));
  const Element* kn = static_cast<const Element*>(kv.k_new) + b * kv.k_new_batch + hk * kv.k_new_head;
  const Element* vn = static_cast<const Element*>(kv.v_new) + b * kv.v_new_batch + hk * kv.v_new_head;
  Element* kc = const_cast<Element*>(static_cast<const Element*>(p.k));
  Element* vc = const_cast<Element*>(static_cast<const Element*>(p.v));
  auto aligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; };
  const bool vec = d % kVec == 0 && aligned(kn) && aligned(vn) && aligned(kc) && aligned(vc) &&
                   kv.k_new_row % kVec == 0 && kv.v_new_row % kVec == 0 && p.k_stride.row % kVec == 0 &&
                   p.v_stride.row % kVec == 0 && p.k_stride.head % kVec == 0 && p.v_stride.head % kVec == 0 &&
                   p.k_stride.batch % kVec == 0 && p.v_stride.batch % kVec == 0;
  const int per_row = vec ? d / kVec : d;
  for (int item = tid; item < kv.seqlen_new * per_row; item += threads) {
    const int j = item / per_row, c = (item % per_row) * (vec ? kVec : 1);
    const int r = end - kv.seqlen_new + j;
    Element* kdst = kc + cache_offset(p.k_stride, kv, b, sb, r, hk) + c;
    Element* vdst = vc + cache_offset(p.v_stride, kv, b, sb, r, hk) + c;
    const Element* ksrc = kn + int64_t(j) * kv.k_new_row + c;
    const Element* vsrc = vn + int64_t(j) * kv.v_new_row + c;
    if (vec) {
      *reinterpret_cast<uint4*>(kdst) = *reinterpret_cast<const uint4*>(ksrc);
      *reinterpret_cast<uint4*>(vdst) = *reinterpret_cast<const uint4*>(vsrc);
    } else {
      *kdst = *ksrc;
      *vdst = *vsrc;
    }
  }
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
