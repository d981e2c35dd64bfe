// Normalized problem description shared by every path (reference, cpu, sm80, sm90).
// Built once by src/api/ from the C ABI structs after validation, so kernels can trust it.
// POD, passed to kernels by value.
#pragma once

#include <cstdint>

#include "common/alibi.h"
#include "common/dropout.h"
#include "common/fp8_scales.h"
#include "common/hd.h"
#include "common/kv_cache.h"
#include "flashattn/flashattn.h"

namespace flashattn {

// Strides (elements) of a [batch, seqlen, nheads, headdim] tensor; headdim is contiguous.
struct RowStrides {
  int64_t batch = 0;
  int64_t row = 0;
  int64_t head = 0;
};

struct Shape {
  int batch = 0;      // number of sequences (varlen: number of cu_seqlens entries - 1)
  int seqlen_q = 0;   // fixed length, or varlen max_seqlen_q
  int seqlen_k = 0;
  int nheads_q = 0;
  int nheads_kv = 0;
  int headdim = 0;
  int total_q = 0;    // varlen: rows of the packed q tensor; fixed: batch * seqlen_q
  int total_k = 0;

  FA_HD int group_size() const { return nheads_q / nheads_kv; }
  // GQA/MQA head mapping: query head -> the kv head it reads.
  FA_HD int kv_head(int q_head) const { return q_head / group_size(); }
};

struct MaskOptions {
  float softmax_scale = 1.f;
  float softcap = 0.f;   // 0 = off
  int window_left = -1;  // -1 = unbounded
  int window_right = -1; // -1 = unbounded; causal already folded in as 0
};

struct FwdParams {
  flashattn_dtype dtype;
  Shape shape;
  MaskOptions mask;
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;  // may be null
  RowStrides q_stride, k_stride, v_stride, o_stride;
  const int32_t* cu_seqlens_q;  // null = fixed length
  const int32_t* cu_seqlens_k;
  double* lse_fp64 = nullptr;  // fp64 LSE output (FP64 dtype, reference backend only); lse is then null
  Dropout dropout;             // off unless dropout_p > 0
  Alibi alibi;                 // off unless slopes are given
  KvCache kv;                  // off: plain k/v (see seq_bounds and key_offset below)
  int num_splits = 0;          // split-KV request (CUDA paths): 0 = heuristic, 1 = none
  Fp8Scales fp8;               // dtype FP8_E4M3: the inputs' scales and the output dtype

  // The output's dtype: the inputs' one, except FP8 attention writes fp16/bf16.
  FA_HD flashattn_dtype out_dtype() const { return dtype == FLASHATTN_DTYPE_FP8_E4M3 ? fp8.out_dtype : dtype; }
};

struct BwdParams {
  flashattn_dtype dtype;
  Shape shape;
  MaskOptions mask;
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* dout;
  const float* lse;
  void* dq;
  void* dk;
  void* dv;
  RowStrides q_stride, k_stride, v_stride, o_stride, dout_stride, dq_stride, dk_stride, dv_stride;
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  bool deterministic;
  const double* lse_fp64 = nullptr;  // fp64 LSE input (FP64 dtype, reference backend only); lse is then null
  Dropout dropout;                   // the forward's: the backward regenerates its mask
  Alibi alibi;
};

// Where sequence `b` lives: its row offset in the packed tensors and its lengths.
// Fixed length: offset 0 with the batch stride doing the work; varlen: offset from cu_seqlens.
struct SeqBounds {
  int64_t q_offset;  // first row of the sequence in q/o (varlen), 0 otherwise
  int64_t k_offset;
  int seqlen_q;
  int seqlen_k;
  int64_t lse_offset;  // element offset of LSE[b, h=0, i=0]
  int64_t lse_head_stride;
  int k_row0 = 0;      // KV cache: the sequence's first key row in its cache (leftpad)
  int kv_batch = 0;    // KV cache: the cache batch holding it (contiguous k/v)
};

FA_HD int clamp_index(int v, int hi) { return v < 0 ? 0 : (v > hi ? hi : v); }
FA_HD int clamp_length(int len, int max_len, int room) {
  int m = max_len < room ? max_len : room;
  return len < 0 ? 0 : (len > m ? m : len);
}

FA_HD SeqBounds seq_bounds(const Shape& s, const int32_t* cu_q, const int32_t* cu_k,
                                  int b) {
  SeqBounds r;
  if (cu_q != nullptr) {
    // Clamped so that unchecked device cu_seqlens (see check_varlen) can never address rows
    // outside the packed tensors: a bad entry yields a shorter or empty sequence instead.
    r.q_offset = clamp_index(cu_q[b], s.total_q);
    r.k_offset = clamp_index(cu_k[b], s.total_k);
    r.seqlen_q = clamp_length(cu_q[b + 1] - cu_q[b], s.seqlen_q, s.total_q - int(r.q_offset));
    r.seqlen_k = clamp_length(cu_k[b + 1] - cu_k[b], s.seqlen_k, s.total_k - int(r.k_offset));
    r.lse_offset = r.q_offset;
    r.lse_head_stride = s.total_q;
  } else {
    r.q_offset = 0;
    r.k_offset = 0;
    r.seqlen_q = s.seqlen_q;
    r.seqlen_k = s.seqlen_k;
    r.lse_offset = int64_t(b) * s.nheads_q * s.seqlen_q;
    r.lse_head_stride = s.seqlen_q;
  }
  r.kv_batch = b;
  return r;
}

// The same with the forward's KV cache policy: the keys are rows [k_row0, k_row0 + seqlen_k) of
// the sequence's cache (after appending), in cache batch kv_batch (contiguous) or in pages.
FA_HD SeqBounds seq_bounds(const Shape& s, const int32_t* cu_q, const int32_t* cu_k, const KvCache& kv, int b) {
  SeqBounds r = seq_bounds(s, cu_q, cu_k, b);
  if (!kv.enabled()) return r;
  int len = r.seqlen_k;  // fixed: the cache's seqlen (paged: its capacity); varlen: cu_seqlens_k's length
  if (kv.paged()) {
    r.k_offset = 0;  // paged varlen: cu_seqlens_k gives lengths only, the block table the rows
    if (cu_k != nullptr) len = clamp_length(cu_k[b + 1] - cu_k[b], s.seqlen_k, kv.room(0));
  }
  const int end = kv.end_row(b, len);
  r.k_row0 = kv.first_row(b, end);
  r.seqlen_k = end - r.k_row0;
  r.kv_batch = kv.cache_batch(b);
  return r;
}

// Element offset of row r of sequence b's cache (counted from the cache's first row, leftpad
// included), head kvh.
FA_HD int64_t cache_offset(const RowStrides& st, const KvCache& kv, int b, const SeqBounds& sb, int r, int kvh) {
  if (kv.paged())
    return int64_t(kv.page(b, r)) * st.batch + int64_t(kv.row_in_page(r)) * st.row + int64_t(kvh) * st.head;
  return int64_t(sb.kv_batch) * st.batch + (sb.k_offset + r) * st.row + int64_t(kvh) * st.head;
}
// ... of key/value row j of sequence b's keys (from seq_bounds above).
FA_HD int64_t key_offset(const RowStrides& st, const KvCache& kv, int b, const SeqBounds& sb, int j, int kvh) {
  return cache_offset(st, kv, b, sb, sb.k_row0 + j, kvh);
}

// Element offset of row `row` (within sequence b), head h of a tensor.
FA_HD int64_t row_offset(const RowStrides& st, int b, int64_t seq_row_offset, int64_t row,
                                int h) {
  return int64_t(b) * st.batch + (seq_row_offset + row) * st.row + int64_t(h) * st.head;
}

// The backward's fp32 dQ accumulator holds one block_m-row tile per (query block, query head).
// Sequence b's tiles start at (qrow0 + b * block_m) / block_m, qrow0 being the sequence's first
// row in the packed [total_q] rows: sequences of any lengths never share a tile (FA2's varlen
// padding), and with clamped bounds (seq_bounds) every tile lies in the first
// dq_accum_rows(total_q, batch, max block_m) rows (tests/test_cpu.cpp: DqAccumTiles).
FA_HD int64_t dq_tile_index(int64_t qrow0, int b, int m_block, int block_m) {
  return (qrow0 + int64_t(b) * block_m) / block_m + m_block;
}
FA_HD int64_t dq_accum_rows(int64_t total_q, int batch, int max_block_m) {
  return total_q + int64_t(batch) * max_block_m;
}

}  // namespace flashattn
