// sm80 forward kernel (FlashAttention-2): one CTA per (query block, head, batch entry).
// Q stays in smem; K/V tiles stream through smem with cp.async, the load of V overlapping
// S = Q K^T and the load of the next K overlapping softmax + O += P V. P never leaves
// registers: the S accumulator is re-read as the A operand of the PV MMA.
#pragma once

#include <climits>
#include <cmath>
#include <type_traits>

#include "common/dropout_tile.h"
#include "common/gqa_pack.h"
#include "common/mask.h"
#include "common/score_mods.h"
#include "common/params.h"
#include "common/softmax.h"
#include "common/split_kv.h"
#include "sm80/kernel_traits.h"
#include "sm80/kv_prepass.h"
#include "sm80/utils.h"

namespace flashattn::sm80 {

// kAllCols: the tensors' head dim is the kernel's (plain copies). Without it (a head dim rounded
// up to this kernel) the K/V copies predicate their columns; in the same kernel that predicate
// code pushed hdim 256 into ~1900 spill instructions (11 TFLOP/s on an H100), so it is a kernel
// of its own.
// kKvCache: the forward over a KV cache (common/kv_cache.h): keys gathered row by row through the
// cache's addressing (paged or contiguous), sequences' key ranges from the cache lengths, and
// split-KV: blockIdx.z = batch * num_splits + split, each split writing fp32 partial results that
// the combine kernel merges; and GQA packing (common/gqa_pack.h): blockIdx.y is then a kv head
// and the tile's rows are its query heads' rows, each with its own query index and addresses.
// A kernel of its own, so the plain forward keeps its registers.
// Memory-bound decode wants several CTAs per SM (bytes in flight): the KV-cache kernel's decode
// tile (32 rows) is held to 4 per SM's registers up to hdim 128 (<= 128 each, 188 unbounded, no
// spills), 2 above (its smem allows 2 there anyway; at 4, hdim 256 spilled 120 bytes). Its
// prefill tile (64 rows) is left to the compiler.
// Paged caches: key blocks whose K and V row offsets wait in smem (fwd_kernel's s_row_off): two for
// a single-stage kernel, one per stage for the staged decode tile.
constexpr int kKvPageSlots = 3;
// The KV-cache kernel's smem without extra stages: its tile's, plus the paged lookahead's row
// offsets (int64 elements, K's and V's, kKvPageSlots key blocks).
template <typename Kt>
constexpr int kv_smem_size() { return Kt::kSmemSize + kKvPageSlots * 2 * Kt::kBlockN * int(sizeof(int64_t)); }
// With kKvStages: stage s >= 1 (K then V tile) at element offset kv_stage_offset<Kt>(s) from the
// smem start, past the rest, on a 1 KB boundary (the swizzle's period).
template <typename Kt>
constexpr int kv_stage_bytes() { return 2 * Kt::kBlockN * Kt::kHeadDim * int(sizeof(typename Kt::Element)); }
template <typename Kt>
constexpr int kv_stage_base() { return (kv_smem_size<Kt>() + 1023) / 1024 * 1024; }
template <typename Kt>
__host__ __device__ constexpr int kv_stage_offset(int s) {
  return (kv_stage_base<Kt>() + (s - 1) * kv_stage_bytes<Kt>()) / int(sizeof(typename Kt::Element));
}
template <typename Kt, int kKvStages>
constexpr int kv_smem_size_staged() {
  return kKvStages > 1 ? kv_stage_base<Kt>() + (kKvStages - 1) * kv_stage_bytes<Kt>() : kv_smem_size<Kt>();
}

// kKvStages > 1 (KV-cache decode tile): K and V of kKvStages - 1 key blocks in flight while a block
// is computed (a cp.async ring, kv_stage_offset), instead of one tile: a decode CTA's few blocks
// are then one DRAM round trip, not two per block. The stages past the first sit after the
// kernel's other smem (kv_smem_size).
// The 16-row decode tile (kv_decode16) is held to 5 per SM up to hdim 128 (its smem allows 5); with
// stages (3 at hdim 128: 104 KB, 2 per SM by smem; 4 past 32 pairs: 1 per SM) its registers are
// capped for 3 (no spills).
template <typename Kt, bool kAllCols, bool kKvCache = false, bool kPageLookahead = false, int kKvStages = 1>
__global__ void __launch_bounds__(Kt::kNThreads, kKvCache && Kt::kBlockM <= 16 && Kt::kHeadDim <= 128 ? (kKvStages > 1 ? 3 : 5)
                                                 : kKvCache && Kt::kBlockM <= 32 ? (Kt::kHeadDim <= 128 && kKvStages == 1 ? 4 : 2) : 1)
    fwd_kernel(const FwdParams p, const SplitKv split, const GqaPack pack) {
  using Element = typename Kt::Element;
  constexpr int kBlockM = Kt::kBlockM;
  constexpr int kBlockN = Kt::kBlockN;
  constexpr int kHeadDim = Kt::kHeadDim;
  constexpr int kWarpsN = Kt::kWarpsN;  // warps sharing a query row (kernel_traits.h)
  extern __shared__ __align__(128) char smem_[];

  if constexpr (kKvCache) {
    // The split-KV combine after this kernel may launch now (its CTAs wait for this grid's
    // results, api/combine_cuda.cu): its launch latency overlaps this kernel. No-op otherwise.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
  }
  const int tidx = threadIdx.x;
  int m_block = blockIdx.x;
  if constexpr (kHeadDim == 64 || kHeadDim >= 256) {
    // Causal: the last query blocks see the most keys; launch them first (longest job first),
    // which shortens the tail of the last wave (measured +0.3-2.9% causal at hdim 64 and 256).
    // Not at hdim 128: there the extra code cost 8-10% at 255 registers with spills (measured,
    // non-causal included), more than the tail gains.
    if (p.mask.window_right >= 0 && p.mask.window_left < 0) m_block = int(gridDim.x) - 1 - m_block;
  }
  const int group = kKvCache ? pack.group : 1;  // GQA packing: the tile's rows span `group` heads from h
  const int h = int(blockIdx.y) * group;
  const int b = kKvCache ? int(blockIdx.z) / split.num_splits : int(blockIdx.z);
  const int split_idx = kKvCache ? int(blockIdx.z) % split.num_splits : 0;
  SeqBounds sb;
  if constexpr (kKvCache) {
    sb = seq_bounds(p.shape, p.cu_seqlens_q, p.cu_seqlens_k, p.kv, b);
  } else {
    sb = seq_bounds(p.shape, p.cu_seqlens_q, p.cu_seqlens_k, b);
  }
  const int m0 = m_block * kBlockM;
  const int hk = p.shape.kv_head(h);
  // Fused append (KV cache without rotary; the prepass rotates): attention reads the new rows from
  // k_new/v_new themselves, and one CTA per (sequence, kv head) copies them into the cache, so no
  // CTA of this launch reads a cache row that another one writes. Before any early exit.
  const bool fused_append = kKvCache && p.kv.appends() && !p.kv.rotary();
  if constexpr (kKvCache) {
    if (fused_append && m_block == 0 && split_idx == 0 && h == hk * p.shape.group_size())
      append_rows_cta<Element>(p, sb, b, hk, tidx, Kt::kNThreads);
  }
  const int tile_rows = sb.seqlen_q * group;  // the kernel's rows of this sequence
  if (m0 >= tile_rows) return;
  const int valid_rows = min(kBlockM, tile_rows - m0);
  const Mask mask = make_mask(p.mask, sb);
  // The tile's queries [q0, q0 + q_rows) (packed: each row's query index is row / group).
  const int q0 = m0 / group, q_rows = (m0 + valid_rows - 1) / group - q0 + 1;
  int n_begin = 0, n_end = 0;
  mask.key_block_range(q0, kKvCache ? q_rows : kBlockM, kBlockN, &n_begin, &n_end);
  // KV cache: this split's key blocks, every kv_step-th from its first (SplitKv::first_block: the
  // splits interleave, so the grid sweeps the cache together). Visited last to first.
  const int kv_step = kKvCache ? split.block_step() : 1;
  if constexpr (kKvCache) n_end = split.first_block(n_end, split_idx) + 1;
  const int d = kAllCols ? kHeadDim : p.shape.headdim;  // <= kHeadDim: the columns past it are zero-filled, never stored
  constexpr bool all_cols = kAllCols;

  // Q and O from query q0 of head h (unpacked: row m0); tile row r's offset from there (packed:
  // the query and head of row m0 + r).
  const Element* q_ptr = static_cast<const Element*>(p.q) + row_offset(p.q_stride, b, sb.q_offset, q0, h);
  Element* o_ptr = static_cast<Element*>(p.o) + row_offset(p.o_stride, b, sb.q_offset, q0, h);
  auto packed_offset = [&](int r, int64_t row_stride, int64_t head_stride) {
    const int row = m0 + r;
    return int64_t(row / group - q0) * row_stride + int64_t(row % group) * head_stride;
  };
  // KV cache: K/V rows are gathered per tile (gather_rows); these bases are unused there.
  const Element* k_base = static_cast<const Element*>(p.k) + (kKvCache ? 0 : row_offset(p.k_stride, b, sb.k_offset, 0, hk));
  const Element* v_base = static_cast<const Element*>(p.v) + (kKvCache ? 0 : row_offset(p.v_stride, b, sb.k_offset, 0, hk));
  float* lse_ptr = p.lse == nullptr ? nullptr : p.lse + sb.lse_offset + int64_t(h) * sb.lse_head_stride + q0;
  int64_t lse_head_stride = sb.lse_head_stride;
  // Split-KV: fp32 partial O [split, b, row, h, d] and LSE [split, b, h, row] in the workspace
  // (unpacked layout: the combine sees the call's own rows and heads).
  const bool partial = kKvCache && split.num_splits > 1;
  float* o_part = nullptr;
  if (partial) {
    o_part = split.o_partial + split.o_index(split_idx, b, q0, h);
    lse_ptr = split.lse_partial + split.lse_index(split_idx, b, h, q0);
    lse_head_stride = split.seqlen_q;
  }
  // kPageLookahead (paged caches): the K and V row offsets of a key block's rows wait in smem
  // (s_row_off, one slot per block: block n & 1, or the staged kernel's stage of the block), looked
  // up by a thread per row ahead of the block's gathers. A block-table read right before each row's
  // cp.async put a dependent load's latency in front of every K/V tile (paged prefill ran 24-28%
  // slower than contiguous), and the page arithmetic per gathered row (~30 instructions) made the
  // staged decode tile miss its instruction cache (s20). A kernel of its own: as a runtime branch
  // in the contiguous kernel it cost that kernel 20% (prefill, H100).
  static_assert(!kPageLookahead || kKvCache);
  static_assert(Kt::kSmemSize % 8 == 0 && (!kPageLookahead || kKvStages <= kKvPageSlots));
  int64_t* s_row_off = kPageLookahead ? reinterpret_cast<int64_t*>(smem_ + Kt::kSmemSize) : nullptr;  // [slot][K, V][kBlockN]
  constexpr bool kStaged = kKvStages > 1;
  static_assert(!kStaged || (kKvCache && Kt::kWarpsN > 1));
  static_assert(!kKvCache || Kt::kNThreads >= kBlockN, "a thread per row of a key block");
  auto page_of_key = [&](int j) {  // thread tidx's row of key block n (its block-table entry; -1: no row)
    return j < sb.seqlen_k ? p.kv.page(b, sb.k_row0 + j) : -1;
  };
  // Row j's offsets (from page, its page_of_key) into slot `slot`, by the thread of row j % kBlockN.
  auto store_row_offsets = [&](int slot, int j, int page) {
    if (page >= 0) {
      const int64_t row = p.kv.row_in_page(sb.k_row0 + j);
      s_row_off[(2 * slot) * kBlockN + j % kBlockN] = int64_t(page) * p.k_stride.batch + row * p.k_stride.row;
      s_row_off[(2 * slot + 1) * kBlockN + j % kBlockN] = int64_t(page) * p.v_stride.batch + row * p.v_stride.row;
    }
  };
  // Key/value row j of this sequence (KV cache: through the cache's addressing, or paged with the
  // lookahead from its block's offsets in `slot`; a fused append's new rows, from key j_new on,
  // from k_new/v_new).
  const int j_new = fused_append ? sb.seqlen_k - p.kv.seqlen_new : INT_MAX;
  auto cache_row = [&](const void* base, const RowStrides& st, int which, int slot, int j) {
    if constexpr (kPageLookahead) {
      return static_cast<const Element*>(base) + s_row_off[(2 * slot + which) * kBlockN + j % kBlockN] +
             int64_t(hk) * st.head;
    } else {
      return static_cast<const Element*>(base) + key_offset(st, p.kv, b, sb, j, hk);
    }
  };
  auto k_row = [&](int j, int slot) {
    if (j >= j_new)
      return static_cast<const Element*>(p.kv.k_new) + b * p.kv.k_new_batch + (j - j_new) * p.kv.k_new_row +
             hk * p.kv.k_new_head;
    return cache_row(p.k, p.k_stride, 0, slot, j);
  };
  auto v_row = [&](int j, int slot) {
    if (j >= j_new)
      return static_cast<const Element*>(p.kv.v_new) + b * p.kv.v_new_batch + (j - j_new) * p.kv.v_new_row +
             hk * p.kv.v_new_head;
    return cache_row(p.v, p.v_stride, 1, slot, j);
  };
  // Contiguous caches: a key block wholly below the appended rows and the sequence's end has
  // equally spaced rows, copied from one base pointer (a per-row gather costs ~30 instructions a
  // row; the decode tile's instruction cache misses showed it, ncu).
  const bool kv_strided = kStaged && !kPageLookahead && !p.kv.paged();  // staged kernels only: elsewhere it cost a spill (s19)
  const int strided_end = kKvCache ? min(j_new, sb.seqlen_k) : 0;  // blocks ending at or before it qualify
  auto block_is_strided = [&](int n) { return kv_strided && (n + 1) * kBlockN <= strided_end; };
  // The output rows, scaled: Element rows of out, or the split's fp32 partial rows.
  auto store_out = [&](auto const& acc_rc, auto const& coord_rc, int rows, int cols, float scale) {
    if constexpr (kKvCache) {
      if (partial) {
        store_acc_rows_at<float>(acc_rc, coord_rc, o_part,
                                 [&](int r) { return packed_offset(r, split.o_row_stride(), split.headdim); }, rows,
                                 cols, scale);
      } else {
        store_acc_rows_at<Element>(acc_rc, coord_rc, o_ptr,
                                   [&](int r) { return packed_offset(r, p.o_stride.row, p.o_stride.head); }, rows,
                                   cols, scale);
      }
    } else {
      store_acc_rows<Element>(acc_rc, coord_rc, o_ptr, p.o_stride.row, rows, cols, scale);
    }
  };
  // LSE of tile row r (this thread's rows below valid_rows only).
  auto store_lse = [&](int r, float v) {
    if constexpr (kKvCache) {
      lse_ptr[packed_offset(r, 1, lse_head_stride)] = v;
    } else {
      lse_ptr[r] = v;
    }
  };

  typename Kt::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tidx);
  Tensor acc_o = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kHeadDim>>{});
  Tensor acc_o_rc = make_tensor(acc_o.data(), acc_rowcol(acc_o.layout()));
  Tensor cO = make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{});
  Tensor tOcO = thr_mma.partition_C(cO);
  Tensor tOcO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));
  constexpr int kRows = decltype(size<0>(acc_o_rc))::value;  // query rows owned by this thread

  if (n_begin >= n_end) {  // every row of the block is fully masked (or the split is empty): O = 0, LSE = -inf
    clear(acc_o);
    store_out(acc_o_rc, tOcO_rc, valid_rows, d, 1.f);
    if (lse_ptr != nullptr && get<1>(tOcO_rc(0, 0)) == 0) {
#pragma unroll
      for (int mi = 0; mi < kRows; ++mi) {
        const int row = get<0>(tOcO_rc(mi, 0));
        if (row < valid_rows) store_lse(row, -INFINITY);
      }
    }
    return;
  }

  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem_)), typename Kt::SmemLayoutQ{});
  Tensor sK = make_tensor(sQ.data() + size(sQ), typename Kt::SmemLayoutKV{});
  Tensor sV = make_tensor(sK.data() + size(sK), typename Kt::SmemLayoutKV{});
  Tensor sVt = make_tensor(sV.data(), typename Kt::SmemLayoutVt{});
  Tensor sVtNoSwizzle = make_tensor(sV.data().get(), typename Kt::SmemLayoutVtNoSwizzle{});
  // kWarpsN > 1 only: P, and the partial row statistics [kWarpsN][kBlockM] of the warps of a row.
  Tensor sP = make_tensor(sV.data() + size(sV), typename Kt::SmemLayoutP{});
  float* s_row_stats = reinterpret_cast<float*>(raw_pointer_cast((sP.data() + size(sP)).get()));
  const int warp_n = tidx / 32 / Kt::kWarpsM;  // warps are M-major in the TiledMma

  const int64_t ks = p.k_stride.row, vs = p.v_stride.row;
  Tensor gQ = make_tensor(make_gmem_ptr(q_ptr), Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_stride(p.q_stride.row, _1{}));
  // K and V tiles of the first visited block (the last one); each later tile is one block
  // earlier: the per-thread pointers move back by a block's rows (FA2), so the loop carries two
  // pointers instead of rebuilding base + block * stride + thread offset in 64 bits every time.
  const int n_last = n_end - 1;
  Tensor gK = make_tensor(make_gmem_ptr(k_base + int64_t(n_last) * kBlockN * ks), Shape<Int<kBlockN>, Int<kHeadDim>>{},
                          make_stride(ks, _1{}));
  Tensor gV = make_tensor(make_gmem_ptr(v_base + int64_t(n_last) * kBlockN * vs), Shape<Int<kBlockN>, Int<kHeadDim>>{},
                          make_stride(vs, _1{}));

  typename Kt::GmemTiledCopy gmem_tiled_copy;
  auto gmem_thr_copy = gmem_tiled_copy.get_thread_slice(tidx);
  Tensor tQgQ = gmem_thr_copy.partition_S(gQ);
  Tensor tQsQ = gmem_thr_copy.partition_D(sQ);
  Tensor tKgK = gmem_thr_copy.partition_S(gK);
  Tensor tVgV = gmem_thr_copy.partition_S(gV);
  Tensor tKsK = gmem_thr_copy.partition_D(sK);
  Tensor tVsV = gmem_thr_copy.partition_D(sV);
  // KV cache, contiguous: this thread's K/V copy sources in key block 0 (block n: + n * kBlockN rows).
  Tensor tKgKc = gmem_thr_copy.partition_S(make_tensor(
      make_gmem_ptr(static_cast<const Element*>(p.k) + (kv_strided ? key_offset(p.k_stride, p.kv, b, sb, 0, hk) : 0)),
      Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_stride(ks, _1{})));
  Tensor tVgVc = gmem_thr_copy.partition_S(make_tensor(
      make_gmem_ptr(static_cast<const Element*>(p.v) + (kv_strided ? key_offset(p.v_stride, p.kv, b, sb, 0, hk) : 0)),
      Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_stride(vs, _1{})));
  Tensor tQcQ = gmem_thr_copy.partition_S(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  Tensor tKVcKV = gmem_thr_copy.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));

  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
  Tensor tSrK = thr_mma.partition_fragment_B(sK);
  Tensor tOrVt = thr_mma.partition_fragment_B(sVtNoSwizzle);

  auto smem_tiled_copy_Q = make_tiled_copy_A(typename Kt::SmemCopyAtom{}, tiled_mma);
  auto smem_thr_copy_Q = smem_tiled_copy_Q.get_thread_slice(tidx);
  Tensor tSsQ = smem_thr_copy_Q.partition_S(sQ);
  auto smem_tiled_copy_K = make_tiled_copy_B(typename Kt::SmemCopyAtom{}, tiled_mma);
  auto smem_thr_copy_K = smem_tiled_copy_K.get_thread_slice(tidx);
  Tensor tSsK = smem_thr_copy_K.partition_S(sK);
  auto smem_tiled_copy_V = make_tiled_copy_B(typename Kt::SmemCopyAtomTransposed{}, tiled_mma);
  auto smem_thr_copy_V = smem_tiled_copy_V.get_thread_slice(tidx);
  Tensor tOsVt = smem_thr_copy_V.partition_S(sVt);
  auto copy_p = make_tiled_copy_C(typename Kt::SmemCopyAtomP{}, tiled_mma);
  auto thr_copy_p = copy_p.get_thread_slice(tidx);
  Tensor tPsP = thr_copy_p.partition_D(sP);
  Tensor tOrP_s = thr_mma.partition_fragment_A(sP);
  Tensor tOsP = smem_thr_copy_Q.partition_S(sP);

  // Score-tile coordinates of this thread's accumulator values (for masking).
  Tensor cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor tScS = thr_mma.partition_C(cS);
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));

  // Prologue: Q and the last K tile (blocks are visited last to first, so only the first
  // visited block can be partial at the end of the sequence). `it` counts the visited blocks: the
  // stage (staged kernels) or page-offset slot (it & 1) of a block.
  int n_block = n_last;
  int it = 0;
  if constexpr (kKvCache) {  // packed: each row from its own query and head
    gather_rows(gmem_tiled_copy, [&](int r) { return q_ptr + packed_offset(r, p.q_stride.row, p.q_stride.head); }, 0,
                tQsQ, tQcQ, valid_rows, d);
  } else {
    copy_rows(gmem_tiled_copy, tQgQ, tQsQ, tQcQ, valid_rows, d);
  }
  // KV cache: K (or V) rows of key block n into dst: strided where block_is_strided (from src0, the
  // thread's block-0 source, rows `stride` apart), else gathered row by row (row(j): key j's address).
  // (slot: the paged lookahead's slot of block n.)
  // Paged: a block wholly below the appended rows and the sequence's end takes every row from the
  // cache's looked-up offsets (cached_row), without the per-row end and append tests.
  auto load_block = [&](int n, auto& dst, int valid_rows, const auto& src0, int64_t stride, const auto& row,
                        const auto& cached_row) {
    if (block_is_strided(n)) {
      Tensor src = make_tensor(src0.data() + int64_t(n) * kBlockN * stride, src0.layout());
      copy_full_rows(gmem_tiled_copy, src, dst, tKVcKV, d, d == kHeadDim);
    } else if (kPageLookahead && (n + 1) * kBlockN <= strided_end) {
      gather_full_rows(gmem_tiled_copy, cached_row, n * kBlockN, dst, tKVcKV, d, d == kHeadDim);
    } else {
      gather_rows(gmem_tiled_copy, row, n * kBlockN, dst, tKVcKV, valid_rows, d);
    }
  };
  auto load_k_block = [&](int n, auto& dst, int valid_rows, int slot) {
    load_block(n, dst, valid_rows, tKgKc, ks, [&](int j) { return k_row(j, slot); },
               [&](int j) { return cache_row(p.k, p.k_stride, 0, slot, j); });
  };
  auto load_v_block = [&](int n, auto& dst, int valid_rows, int slot) {
    load_block(n, dst, valid_rows, tVgVc, vs, [&](int j) { return v_row(j, slot); },
               [&](int j) { return cache_row(p.v, p.v_stride, 1, slot, j); });
  };
  // Staged: stage s's K and V tiles, element offsets from sK and sV (stage 0 is sK/sV themselves).
  auto stage_k = [&](int s) { return s == 0 ? 0 : kv_stage_offset<Kt>(s) - int(size(sQ)); };
  auto stage_v = [&](int s) { return s == 0 ? 0 : kv_stage_offset<Kt>(s) + int(size(sK)) - int(size(sQ) + size(sK)); };
  // Staged: K and V of key block n into stage s, one cp.async group (empty past the split's blocks,
  // so that the group count stays one per block). Paged: block n's row offsets are in slot s.
  auto load_block_staged = [&](int n, int s) {
    if (n >= n_begin) {
      Tensor dK = make_tensor(tKsK.data() + stage_k(s), tKsK.layout());
      Tensor dV = make_tensor(tVsV.data() + stage_v(s), tVsV.layout());
      load_k_block(n, dK, sb.seqlen_k - n * kBlockN, s);
      load_v_block(n, dV, sb.seqlen_k - n * kBlockN, s);
    }
    cute::cp_async_fence();
  };
  if constexpr (kStaged) {
    if constexpr (kPageLookahead) {  // the offsets of the first kKvStages blocks (the loop's first
      int pages[kKvStages];          // iteration issues the last of them), one slot per stage
#pragma unroll
      for (int s = 0; s < kKvStages; ++s)
        pages[s] = tidx < kBlockN && n_last - s * kv_step >= n_begin
                       ? page_of_key((n_last - s * kv_step) * kBlockN + tidx)
                       : -1;
#pragma unroll
      for (int s = 0; s < kKvStages; ++s) store_row_offsets(s, (n_last - s * kv_step) * kBlockN + tidx, pages[s]);
      __syncthreads();
    }
#pragma unroll 1
    for (int s = 0; s < kKvStages - 1; ++s) load_block_staged(n_last - s * kv_step, s);
  } else if constexpr (kKvCache) {
    if constexpr (kPageLookahead) {
      if (tidx < kBlockN) store_row_offsets(0, n_last * kBlockN + tidx, page_of_key(n_last * kBlockN + tidx));
      __syncthreads();
    }
    load_k_block(n_last, tKsK, sb.seqlen_k - n_last * kBlockN, 0);
  } else {
    copy_rows(gmem_tiled_copy, tKgK, tKsK, tKVcKV, sb.seqlen_k - n_last * kBlockN, d);
  }
  if constexpr (!kStaged) cute::cp_async_fence();

  clear(acc_o);
  OnlineSoftmaxRow row_state[kRows];
#pragma unroll
  for (int mi = 0; mi < kRows; ++mi) row_state[mi].init();
  // KV cache: the query index of each of this thread's rows (packed: row / group; past the tile's
  // rows: seqlen_q, which the mask gives no keys).
  int row_query[kRows];
#pragma unroll
  for (int mi = 0; mi < kRows; ++mi) {
    const int row = m0 + get<0>(tScS_rc(mi, 0));
    row_query[mi] = kKvCache && row < tile_rows ? row / group : sb.seqlen_q;
  }
  const ScoreTransform st = ScoreTransform::make(p.mask.softmax_scale, p.mask.softcap);
  const ScoreMods mods = ScoreMods::make(p, st, sb, b, h);  // ALiBi, dropout

  // The softcap test sits outside the loop: inside it the compiler predicates the tanh path
  // instead of branching, and those dead instructions cost issue slots every block.
  auto mainloop = [&](auto softcap) {
    constexpr bool kSoftcap = decltype(softcap)::value;
    for (; n_block >= n_begin; n_block -= kv_step, ++it) {
      const int n0 = n_block * kBlockN;
      Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
      clear(acc_s);
      // Staged: this block's stage, and the stage the block kKvStages - 1 ahead refills (the one
      // block n + 1 used: every warp is done with it after the barrier below).
      [[maybe_unused]] const int stage = kStaged ? it % kKvStages : 0;
      [[maybe_unused]] int next_page = -1;
      if constexpr (kStaged) {
        cute::cp_async_wait<kKvStages - 2>();
        __syncthreads();  // K[n] and V[n] landed; every warp is done with the previous block's stage
        load_block_staged(n_block - (kKvStages - 1) * kv_step, (it + kKvStages - 1) % kKvStages);
        // Paged: the pages of the block the next iteration issues (stored to this block's slot
        // after the S GEMM).
        if constexpr (kPageLookahead) {
          if (tidx < kBlockN && n_block - kKvStages * kv_step >= n_begin)
            next_page = page_of_key((n_block - kKvStages * kv_step) * kBlockN + tidx);
        }
      } else {
        cute::cp_async_wait<0>();
        __syncthreads();  // K[n] landed; every warp is done with V[n+1]
        // Paged: the next block's pages, read now and stored to smem after the S GEMM (slot
        // (it + 1) & 1, last read by the previous block's gathers, before this barrier).
        if constexpr (kPageLookahead) {
          if (tidx < kBlockN && n_block - kv_step >= n_begin) next_page = page_of_key(n0 - kv_step * kBlockN + tidx);
        }
        if constexpr (kKvCache) {
          load_v_block(n_block, tVsV, sb.seqlen_k - n0, it & 1);
        } else if (n_block == n_last) {  // the only block that can end past the sequence
          copy_rows(gmem_tiled_copy, tVgV, tVsV, tKVcKV, sb.seqlen_k - n0, d);
        } else {
          copy_full_rows(gmem_tiled_copy, tVgV, tVsV, tKVcKV, d, all_cols);
        }
        cute::cp_async_fence();
        tVgV.data() = tVgV.data() + (-kBlockN * vs);
      }

      {  // stage_k(0) == 0: unstaged kernels read sK itself
        Tensor sKs = make_tensor(tSsK.data() + stage_k(stage), tSsK.layout());
        gemm_ss(acc_s, tSrQ, tSrK, tSsQ, sKs, tiled_mma, smem_tiled_copy_Q, smem_tiled_copy_K, smem_thr_copy_Q,
                smem_thr_copy_K);
      }

      Tensor scores = make_tensor(acc_s.data(), acc_rowcol(acc_s.layout()));
      if constexpr (kSoftcap) {
#pragma unroll
        for (int i = 0; i < size(scores); ++i) scores(i) = st.apply(scores(i));
      }
      if (mods.alibi()) alibi_apply<true>(scores, tScS_rc, m0, n0, mods);
      const bool needs_mask = kKvCache ? m0 + kBlockM > tile_rows || mask.tile_needs_key_mask(q0, q_rows, n0, kBlockN)
                                       : mask.tile_needs_mask(m0, kBlockM, n0, kBlockN);
      if (needs_mask) {
#pragma unroll
        for (int mi = 0; mi < kRows; ++mi) {
          const int row = kKvCache ? row_query[mi] : m0 + get<0>(tScS_rc(mi, 0));
          const int kb = mask.key_begin(row), ke = row < sb.seqlen_q ? mask.key_end(row) : 0;
#pragma unroll
          for (int ni = 0; ni < size<1>(scores); ++ni) {
            const int col = n0 + get<1>(tScS_rc(mi, ni));
            if (col < kb || col >= ke) scores(mi, ni) = -INFINITY;
          }
        }
      }

      // Max of row mi over this warp's keys of the tile.
      auto warp_row_max = [&](int mi) {
        float mx = -INFINITY;
#pragma unroll
        for (int ni = 0; ni < size<1>(scores); ++ni) mx = fmaxf(mx, scores(mi, ni));
        return quad_allreduce_max(mx);
      };
      // kWarpsN > 1: publish this warp's row maxima; the barrier below makes them visible.
      if constexpr (kWarpsN > 1) {
#pragma unroll
        for (int mi = 0; mi < kRows; ++mi) {
          const float mx = warp_row_max(mi);
          if (tidx % 4 == 0) s_row_stats[warp_n * kBlockM + get<0>(tScS_rc(mi, 0))] = mx;
        }
      }

      if constexpr (kPageLookahead) {  // (next_page is -1 where there is no such block)
        if (tidx < kBlockN) {
          if constexpr (kStaged) {  // kKvStages blocks on: this block's stage, whose loads have landed
            store_row_offsets(stage, (n_block - kKvStages * kv_step) * kBlockN + tidx, next_page);
          } else {
            store_row_offsets((it + 1) & 1, n0 - kv_step * kBlockN + tidx, next_page);
          }
        }
      }
      if constexpr (kStaged) {
        __syncthreads();  // the row maxima are in smem
      } else {
      cute::cp_async_wait<0>();
      __syncthreads();  // V[n] landed; every warp is done with K[n]; the next block's pages are in smem
      if (n_block - kv_step >= n_begin) {  // K of the next block: a whole block
        if constexpr (kKvCache) {
          load_k_block(n_block - kv_step, tKsK, kBlockN, (it + 1) & 1);
        } else {
          tKgK.data() = tKgK.data() + (-kBlockN * ks);
          copy_full_rows(gmem_tiled_copy, tKgK, tKsK, tKVcKV, d, all_cols);
        }
        cute::cp_async_fence();
      }
      }

      // Online softmax in the exp2 domain: one FMA + one exp2 per score. From hdim 128 the max
      // moves lazily (common/softmax.h), so after the first blocks no row of a warp changes it
      // and the warp skips the O rescale; below, each row is rescaled right away.
      constexpr bool kLazyMax = kHeadDim >= kLazyMaxMinHeadDim;
      float factor[kRows];
      bool rescale = false;
#pragma unroll
      for (int mi = 0; mi < kRows; ++mi) {
        float mx = -INFINITY;
        if constexpr (kWarpsN > 1) {
#pragma unroll
          for (int wn = 0; wn < kWarpsN; ++wn) mx = fmaxf(mx, s_row_stats[wn * kBlockM + get<0>(tScS_rc(mi, 0))]);
        } else {
          mx = warp_row_max(mi);
        }
        if constexpr (kLazyMax) {
          factor[mi] = row_state[mi].update_max_lazy(mx * st.exp2_scale, kLazyMaxSlackLog2);
          rescale |= factor[mi] != 1.f;
        } else {
          factor[mi] = row_state[mi].update_max(mx * st.exp2_scale);
#pragma unroll
          for (int di = 0; di < size<1>(acc_o_rc); ++di) acc_o_rc(mi, di) *= factor[mi];
        }
        const float offset = row_state[mi].exp_offset();
        float sum = 0.f;
#pragma unroll
        for (int ni = 0; ni < size<1>(scores); ++ni) {
          const float e = exp2f(fmaf(scores(mi, ni), st.exp2_scale, -offset));
          scores(mi, ni) = e;
          sum += e;
        }
        row_state[mi].l += sum;  // per-thread partial; the quad is reduced once at the end
      }
      if (kLazyMax && __any_sync(0xffffffffu, rescale)) {
#pragma unroll
        for (int mi = 0; mi < kRows; ++mi)
#pragma unroll
          for (int di = 0; di < size<1>(acc_o_rc); ++di) acc_o_rc(mi, di) *= factor[mi];
      }

      Tensor rP = convert_type<Element>(acc_s);
      if (mods.dropout()) {  // the softmax summed the undropped P; the epilogue scales O
        DropoutMask<decltype(tScS_rc), true, kWarpsN == 1> keep;
        keep.generate(tScS_rc, m0, n0, mods);
        Tensor rP_rc = make_tensor(rP.data(), acc_rowcol(rP.layout()));
#pragma unroll
        for (int mi = 0; mi < size<0>(rP_rc); ++mi)
#pragma unroll
          for (int ni = 0; ni < size<1>(rP_rc); ++ni)
            if (!keep.keep(mi, ni)) rP_rc(mi, ni) = Element(0.f);
      }
      if constexpr (kWarpsN > 1) {  // P through smem: the warps of a row hold its keys between them
        cute::copy(copy_p, thr_copy_p.retile_S(rP), tPsP);
        static_assert(Kt::kWarpsM <= 2, "one named barrier per row group: ids 1 and 2");
        if (Kt::kWarpsM == 1 || tidx / 32 % Kt::kWarpsM == 0) {
          named_barrier_sync<1, 32 * kWarpsN>();
        } else {
          named_barrier_sync<2, 32 * kWarpsN>();
        }
        Tensor sVts = make_tensor(tOsVt.data() + stage_v(stage), tOsVt.layout());  // stage_v(0) == 0
        gemm_ss(acc_o, tOrP_s, tOrVt, tOsP, sVts, tiled_mma, smem_tiled_copy_Q, smem_tiled_copy_V, smem_thr_copy_Q,
                smem_thr_copy_V);
      } else {
        Tensor tOrP = make_tensor(rP.data(), acc_as_A(rP.layout()));
        gemm_rs(acc_o, tOrP, tOrVt, tOsVt, tiled_mma, smem_tiled_copy_V, smem_thr_copy_V);
      }
    }
  };
  if (st.softcap > 0.f) {
    mainloop(std::true_type{});
  } else {
    mainloop(std::false_type{});
  }

  // Epilogue: O / l, LSE = (m + log2 l) ln 2; empty rows give O = 0, LSE = -inf.
#pragma unroll
  for (int mi = 0; mi < kRows; ++mi) row_state[mi].l = quad_allreduce_sum(row_state[mi].l);
  if constexpr (kWarpsN > 1) {  // the warps of a row summed over their own keys (same max)
    __syncthreads();  // every warp has read the last row maxima
#pragma unroll
    for (int mi = 0; mi < kRows; ++mi)
      if (tidx % 4 == 0) s_row_stats[warp_n * kBlockM + get<0>(tOcO_rc(mi, 0))] = row_state[mi].l;
    __syncthreads();
#pragma unroll
    for (int mi = 0; mi < kRows; ++mi) {
      float l = 0.f;
#pragma unroll
      for (int wn = 0; wn < kWarpsN; ++wn) l += s_row_stats[wn * kBlockM + get<0>(tOcO_rc(mi, 0))];
      row_state[mi].l = l;
    }
  }
#pragma unroll
  for (int mi = 0; mi < kRows; ++mi) {
    const float inv = row_state[mi].inv_sum() * (mods.dropout() ? p.dropout.scale : 1.f);
#pragma unroll
    for (int di = 0; di < size<1>(acc_o_rc); ++di) acc_o_rc(mi, di) *= inv;
  }
  store_out(acc_o_rc, tOcO_rc, valid_rows, d, 1.f);
  if (lse_ptr != nullptr && get<1>(tOcO_rc(0, 0)) == 0) {
#pragma unroll
    for (int mi = 0; mi < kRows; ++mi) {
      const int row = get<0>(tOcO_rc(mi, 0));
      if (row < valid_rows) store_lse(row, row_state[mi].lse());
    }
  }
}

}  // namespace flashattn::sm80
