// Where the keys and values of sequence b live (flashattn_kv_cache in flashattn.h): the producer's
// addressing policy, shared by every path. Contiguous K/V (optionally through a cache batch index
// and from a left-padding row) or paged K/V through a block table; plus the rows to append and
// the rotary embedding of flash_attn_with_kvcache. Off (default-constructed) is plain k/v.
#pragma once

#include <cstdint>

#include "common/hd.h"

namespace flashattn {

struct KvCache {
  // Paged: k/v are [num_pages, page_size, nheads_kv, d]; the row stride's batch entry is the page stride.
  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0;
  int max_pages = 0;
  int page_size = 0;
  int page_shift = -1;  // log2(page_size) where it is a power of two (set_page_size): shifts, not divisions
  int num_pages = 0;
  int num_cache_batches = 0;  // contiguous: k.shape[0] (what batch_idx may index)
  const int32_t* seqlens = nullptr;  // end row per sequence (before appending)
  const int32_t* leftpad = nullptr;  // first row per sequence
  const int32_t* batch_idx = nullptr;

  // Rows appended before attending (fixed length only).
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  int64_t k_new_batch = 0, k_new_row = 0, k_new_head = 0;  // element strides
  int64_t v_new_batch = 0, v_new_row = 0, v_new_head = 0;
  int seqlen_new = 0;

  // Rotary embedding of q and k_new: cos/sin [rotary_seqlen, rotary_dim / 2], q's dtype.
  const void* rotary_cos = nullptr;
  const void* rotary_sin = nullptr;
  int rotary_seqlen = 0;
  int rotary_dim = 0;
  bool rotary_interleaved = false;
  bool rotary_per_row = false;  // causal or windowed: query row i at position seqlens[b] + i

  FA_HD bool paged() const { return block_table != nullptr; }
  FA_HD bool appends() const { return k_new != nullptr; }
  FA_HD bool rotary() const { return rotary_cos != nullptr; }
  // Anything beyond plain k/v (a path without this policy must refuse the call).
  FA_HD bool enabled() const {
    return paged() || seqlens != nullptr || leftpad != nullptr || batch_idx != nullptr || appends();
  }

  // The first field in use, for a path's "not supported" message.
  const char* field_in_use() const {
    return paged() ? "kv_cache.block_table" : appends() ? "kv_cache.k_new" : seqlens ? "kv_cache.seqlens"
         : leftpad ? "kv_cache.leftpad" : batch_idx ? "kv_cache.batch_idx" : nullptr;
  }

  // Rows a sequence's cache holds: the pages' rows, or `len` (contiguous: the cache's seqlen, or
  // the sequence's cu_seqlens_k length for varlen).
  FA_HD int room(int len) const { return paged() ? max_pages * page_size : len; }
  // Sequence b's end row after appending, for `len` as in room(). Clamped: unchecked device
  // arrays (see flashattn.h) never address rows outside the cache.
  FA_HD int end_row(int b, int len) const {
    const int cap = room(len);
    if (seqlens == nullptr) return cap < len ? cap : len;
    return clamp(seqlens[b], 0, cap - seqlen_new) + seqlen_new;
  }
  FA_HD int first_row(int b, int end) const { return leftpad ? clamp(leftpad[b], 0, end) : 0; }
  FA_HD int cache_batch(int b) const { return batch_idx ? clamp(batch_idx[b], 0, num_cache_batches - 1) : b; }
  // Page holding logical row r of sequence b, and r's row within it. A runtime divisor costs a
  // GPU thread ~20 instructions per division, on every gathered row of every tile.
  FA_HD int page_of_row(int r) const { return page_shift >= 0 ? r >> page_shift : r / page_size; }
  FA_HD int row_in_page(int r) const { return page_shift >= 0 ? r & (page_size - 1) : r % page_size; }
  FA_HD int page(int b, int r) const {
    return clamp(block_table[b * block_table_stride + page_of_row(r)], 0, num_pages - 1);
  }
  void set_page_size(int rows) {
    page_size = rows;
    page_shift = -1;
    for (int s = 0; s < 31; ++s)
      if (rows == (1 << s)) page_shift = s;
  }
  // Rotary position of query row i of sequence b.
  FA_HD int q_position(int b, int i) const {
    const int base = seqlens ? seqlens[b] : 0;
    return clamp(base + (rotary_per_row ? i : 0), 0, rotary_seqlen - 1);
  }

  FA_HD static int clamp(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }
};

}  // namespace flashattn
