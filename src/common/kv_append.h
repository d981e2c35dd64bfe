// Appending new rows to a KV cache on the host (flash_attn_with_kvcache's in-place update, before
// attending): sequence b's row j of k_new / v_new goes to cache row seqlens[b] + j, the key
// rotated at that position (flashattn.h). Shared by the host paths; the GPU paths fuse it into
// their kernels. Every sequence is appended before any attention, since caches may be shared.
#pragma once

#include <vector>

#include "common/half_convert.h"
#include "common/params.h"

namespace flashattn {

// Rotates row x (fp64, headdim entries) at position pos; each result rounded to `round_dtype`.
inline void rotate_row_fp64(const KvCache& kv, flashattn_dtype table_dtype, flashattn_dtype round_dtype, int pos,
                            double* x) {
  const int half = kv.rotary_dim / 2;
  for (int c = 0; c < half; ++c) {
    const double cs = load_double(kv.rotary_cos, table_dtype, int64_t(pos) * half + c);
    const double sn = load_double(kv.rotary_sin, table_dtype, int64_t(pos) * half + c);
    const int c0 = kv.rotary_interleaved ? 2 * c : c;
    const int c1 = kv.rotary_interleaved ? 2 * c + 1 : c + half;
    const double x0 = x[c0], x1 = x[c1];
    x[c0] = round_to_dtype(round_dtype, x0 * cs - x1 * sn);
    x[c1] = round_to_dtype(round_dtype, x0 * sn + x1 * cs);
  }
}

// The append, in fp64 (values are copied exactly; rotated keys rounded to `round_dtype`, the
// problem's precision: p.dtype, or the dtype an oracle emulates on fp64 copies).
inline void append_kv_rows(const FwdParams& p, flashattn_dtype round_dtype) {
  const KvCache& kv = p.kv;
  const Shape& sh = p.shape;
  const int d = sh.headdim;
  std::vector<double> row(static_cast<size_t>(d));
  for (int b = 0; b < sh.batch; ++b) {
    const SeqBounds sb = seq_bounds(sh, p.cu_seqlens_q, p.cu_seqlens_k, kv, b);
    const int r0 = kv.end_row(b, sh.seqlen_k) - kv.seqlen_new;
    for (int h = 0; h < sh.nheads_kv; ++h)
      for (int j = 0; j < kv.seqlen_new; ++j) {
        const int r = r0 + j;
        const int64_t kn = int64_t(b) * kv.k_new_batch + int64_t(j) * kv.k_new_row + int64_t(h) * kv.k_new_head;
        const int64_t vn = int64_t(b) * kv.v_new_batch + int64_t(j) * kv.v_new_row + int64_t(h) * kv.v_new_head;
        const int64_t ko = cache_offset(p.k_stride, kv, b, sb, r, h);
        const int64_t vo = cache_offset(p.v_stride, kv, b, sb, r, h);
        for (int c = 0; c < d; ++c) row[c] = load_double(kv.k_new, p.dtype, kn + c);
        if (kv.rotary()) rotate_row_fp64(kv, p.dtype, round_dtype, KvCache::clamp(r, 0, kv.rotary_seqlen - 1), row.data());
        for (int c = 0; c < d; ++c) store_double(const_cast<void*>(p.k), p.dtype, ko + c, row[c]);
        for (int c = 0; c < d; ++c)
          store_double(const_cast<void*>(p.v), p.dtype, vo + c, load_double(kv.v_new, p.dtype, vn + c));
      }
  }
}

}  // namespace flashattn
