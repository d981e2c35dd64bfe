// sm80 backward (FlashAttention-2): preprocess D = rowsum(dO * O); main kernel with one CTA per
// (key block, kv head, batch entry) that keeps dK/dV in registers while it walks the query
// blocks (of every query head of its GQA group, so dK/dV need no atomics and no workspace);
// dQ is accumulated in an fp32 workspace with atomic reductions, then scaled and converted.
// Per (head, query block) pair: S = Q K^T, P, dP = dO V^T, dS, then dV += P^T dO, dK += dS^T Q,
// dQ += dS K; with two Q/dO stages the next pair's Q, dO, LSE and D load (cp.async) under
// these five GEMMs, so a pair starts with its operands already in smem.
// Deterministic mode orders the dQ accumulation of the key blocks touching a query block by a
// per-(batch, head, query block) counter, so the fp32 sums happen in a fixed order.
#pragma once

#include <cmath>

#include "common/dropout_tile.h"
#include "common/mask.h"
#include "common/score_mods.h"
#include "common/params.h"
#include "common/softmax.h"
#include "sm80/kernel_traits.h"
#include "sm80/utils.h"

namespace flashattn::sm80 {

// Workspace of one backward call (offsets computed on the host, see bwd_workspace_layout).
struct BwdWorkspace {
  float* dq_accum;  // fp32 dQ tiles, see dq_tile
  int64_t dq_accum_floats;
  float* dsum;      // D, indexed like LSE
  int* semaphores;  // [batch, nheads_q, num_m_blocks] (deterministic mode), else null
  int num_m_blocks;
};

// The dQ accumulator holds one kBlockM x headdim fp32 tile per (query block, query head), placed
// by dq_tile_index (common/params.h) and stored in the order of the dQ MMA's accumulator
// fragments: value i of thread t at (i / 4 * kNThreads + t) * 4 + i % 4. A warp's reduction then
// covers 512 contiguous bytes (FA2 stores its dQaccum permuted for the same reason) instead of 8
// rows of 32 bytes, with no per-row address arithmetic.
template <int kBlockM, int kHeadDim>
__device__ __forceinline__ float* dq_tile(const BwdWorkspace& ws, int64_t qrow0, int b, int m_block, int h,
                                          int nheads_q) {
  return ws.dq_accum + (dq_tile_index(qrow0, b, m_block, kBlockM) * nheads_q + h) * int64_t(kBlockM * kHeadDim);
}

// Row `r` of the packed [total_q] index space -> (batch entry, row within the sequence).
// Fixed length only (varlen rows are already global).
__device__ __forceinline__ int64_t lse_index(const flashattn::Shape& s, bool varlen, int64_t qrow, int h) {
  if (varlen) return int64_t(h) * s.total_q + qrow;
  const int64_t b = qrow / s.seqlen_q, r = qrow % s.seqlen_q;
  return (b * s.nheads_q + h) * s.seqlen_q + r;
}
__device__ __forceinline__ int64_t tensor_row_offset(const RowStrides& st, const flashattn::Shape& s, bool varlen,
                                                     int64_t qrow, int h) {
  if (varlen) return qrow * st.row + int64_t(h) * st.head;
  const int64_t b = qrow / s.seqlen_q, r = qrow % s.seqlen_q;
  return b * st.batch + r * st.row + int64_t(h) * st.head;
}

// D[i] = sum_d dO[i, d] * O[i, d], with 16-byte loads (device tensors are 16-byte aligned with
// strides of multiples of 8 elements: validate.cpp): kLanesPerRow lanes per (row, head), and
// kRowsPerThread rows per lane group per pass, their loads issued together so that enough bytes
// are in flight to approach DRAM bandwidth. The same launch zeroes the dQ accumulator (one pass
// fewer than a memset).
constexpr int kPreprocessThreads = 256;
constexpr int kPreprocessRowsPerThread = 4;
template <int kHeadDim>
constexpr int preprocess_lanes_per_row() {
  constexpr int chunks = kHeadDim / 8;
  return chunks <= 4 ? 4 : (chunks <= 8 ? 8 : (chunks <= 16 ? 16 : 32));
}

template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(kPreprocessThreads) bwd_preprocess_kernel(const BwdParams p, float* dsum,
                                                                            float4* dq_accum, int64_t dq_accum_vecs) {
  constexpr int kChunks = kHeadDim / 8;
  constexpr int kLanesPerRow = preprocess_lanes_per_row<kHeadDim>();
  constexpr int kRows = kPreprocessRowsPerThread;
  static_assert(kHeadDim % 8 == 0 && kChunks <= 32);
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t total = int64_t(p.shape.total_q) * p.shape.nheads_q;
  const int64_t thread = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n_threads = int64_t(gridDim.x) * blockDim.x;
  const int lane = threadIdx.x % kLanesPerRow;
  // Row w = base + r * groups + group: the lane groups of a warp read adjacent rows. Every lane
  // of a warp runs the same number of passes (the shuffles below need them all).
  const int64_t group = thread / kLanesPerRow, groups = n_threads / kLanesPerRow;
  const int64_t warp_group = (thread - threadIdx.x % 32) / kLanesPerRow;
  for (int64_t base = 0; base + warp_group < total; base += kRows * groups) {
    uint4 o[kRows], d_o[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t w = base + r * groups + group;
      if (w < total && lane < kChunks && lane * 8 < p.shape.headdim) {  // columns past the head dim: 0
        const int64_t qrow = w / p.shape.nheads_q;
        const int h = int(w % p.shape.nheads_q);
        o[r] = *reinterpret_cast<const uint4*>(static_cast<const Element*>(p.o) +
                                               tensor_row_offset(p.o_stride, p.shape, varlen, qrow, h) + lane * 8);
        d_o[r] = *reinterpret_cast<const uint4*>(static_cast<const Element*>(p.dout) +
                                                 tensor_row_offset(p.dout_stride, p.shape, varlen, qrow, h) + lane * 8);
      } else {
        o[r] = make_uint4(0u, 0u, 0u, 0u);
        d_o[r] = o[r];
      }
    }
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const Element* oe = reinterpret_cast<const Element*>(&o[r]);
      const Element* de = reinterpret_cast<const Element*>(&d_o[r]);
      acc[r] = 0.f;
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[r] += float(oe[k]) * float(de[k]);
#pragma unroll
      for (int off = kLanesPerRow / 2; off > 0; off /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t w = base + r * groups + group;
      if (w < total && lane == r % kLanesPerRow) {
        const int64_t qrow = w / p.shape.nheads_q;
        dsum[lse_index(p.shape, varlen, qrow, int(w % p.shape.nheads_q))] = acc[r];
      }
    }
  }
  for (int64_t i = thread; i < dq_accum_vecs; i += n_threads) dq_accum[i] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// dQ = softmax_scale * dQ_accum, converted to the output dtype: one CTA per (query block, query
// head, batch entry) reads its tile in the main kernel's fragment order (dq_tile), finds each
// value's (row, column) through the same TiledMMA partition, and stages the converted tile in
// smem so that gmem sees whole 16-byte row chunks (4-byte scattered stores measured 1.9x the
// time of FA2's convert_dQ under ncu).
template <typename Kt>
__global__ void __launch_bounds__(Kt::kNThreads) bwd_postprocess_kernel(const BwdParams p, const BwdWorkspace ws) {
  using Element = typename Kt::Element;
  constexpr int kBlockM = Kt::kBlockM;
  constexpr int kHeadDim = Kt::kHeadDim;
  // Rows padded by 16 bytes: the pair stores of the 8 rows of a warp land in distinct banks.
  constexpr int kRowElems = kHeadDim + 8;
  __shared__ __align__(16) Element tile_smem[kBlockM * kRowElems];
  const int m_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const SeqBounds sb = seq_bounds(p.shape, p.cu_seqlens_q, p.cu_seqlens_k, b);
  const int m0 = m_block * kBlockM;
  if (m0 >= sb.seqlen_q) return;
  const int valid_rows = min(kBlockM, sb.seqlen_q - m0);
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t qrow0 = varlen ? sb.q_offset : int64_t(b) * p.shape.seqlen_q;
  const float* tile = dq_tile<kBlockM, kHeadDim>(ws, qrow0, b, m_block, h, p.shape.nheads_q);

  typename Kt::TiledMmadQ mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(threadIdx.x);
  Tensor cdQ = thr_dq.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  constexpr int kFrag = decltype(size(cdQ))::value;
  static_assert(kFrag % 4 == 0 && kFrag * Kt::kNThreads == kBlockM * kHeadDim);
  const float scale = p.mask.softmax_scale;
#pragma unroll
  for (int j = 0; j < kFrag / 4; ++j) {
    const float4 x = reinterpret_cast<const float4*>(tile)[j * Kt::kNThreads + threadIdx.x];
    // values 4j, 4j + 1 (and 4j + 2, 4j + 3): adjacent columns of one row (m16n8 C layout)
    const int r0 = get<0>(cdQ(4 * j)), c0 = get<1>(cdQ(4 * j));
    const int r1 = get<0>(cdQ(4 * j + 2)), c1 = get<1>(cdQ(4 * j + 2));
    *reinterpret_cast<typename Pack2<Element>::type*>(&tile_smem[r0 * kRowElems + c0]) =
        Pack2<Element>::make(x.x * scale, x.y * scale);
    *reinterpret_cast<typename Pack2<Element>::type*>(&tile_smem[r1 * kRowElems + c1]) =
        Pack2<Element>::make(x.z * scale, x.w * scale);
  }
  __syncthreads();
  Element* dq = static_cast<Element*>(p.dq) + row_offset(p.dq_stride, b, sb.q_offset, m0, h);
  constexpr int kChunksPerRow = kHeadDim / 8;
  for (int c = threadIdx.x; c < kBlockM * kChunksPerRow; c += Kt::kNThreads) {
    const int row = c / kChunksPerRow, col = c % kChunksPerRow * 8;
    if (row < valid_rows && col < p.shape.headdim)
      *reinterpret_cast<uint4*>(dq + row * p.dq_stride.row + col) =
          *reinterpret_cast<const uint4*>(&tile_smem[row * kRowElems + col]);
  }
}

// Number of key blocks before `n_block` that accumulate into query block `m_block`; the key
// blocks touching a query block are contiguous and their query ranges are monotone, so the
// first one is found by bisection over [0, n_block].
__device__ __forceinline__ int dq_turn(const Mask& mask, int n_block, int m_block, int block_n, int block_m) {
  int lo = 0, hi = n_block;  // first n in [lo, hi] with a non-empty range ending past m_block
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    int mb, me;
    mask.query_block_range(mid * block_n, block_n, block_m, &mb, &me);
    if (me > mb && me > m_block) hi = mid; else lo = mid + 1;
  }
  return n_block - lo;
}

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// 4-byte cp.async; src_bytes = 0 zero-fills the destination (rows past the sequence end).
__device__ __forceinline__ void cp_async_f32(float* smem, const float* gmem, bool valid) {
  const uint32_t dst = cute::cast_smem_ptr_to_uint(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 4 : 0));
}

// dst[0..3] += (a, b, c, d): one vector reduction on sm90, four scalar ones before.
// Inline PTX because atomicAdd(float4*) compiles to a returning ATOMG, whose pending result
// registers stall the warp (long scoreboard) where a RED would not.
__device__ __forceinline__ void atomic_add_4(float* dst, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
  atomicAdd(dst + 2, c);
  atomicAdd(dst + 3, d);
#endif
}

// kRareOptions compiles the code of softcap, deterministic, ALiBi and dropout (each still
// tested at run time); without it the common case carries none of their branches, registers
// or spills.
template <typename Kt, bool kRareOptions>
__global__ void __launch_bounds__(Kt::kNThreads, 1) bwd_kernel(const BwdParams p, const BwdWorkspace ws) {
  using Element = typename Kt::Element;
  constexpr int kBlockM = Kt::kBlockM;
  constexpr int kBlockN = Kt::kBlockN;
  constexpr int kHeadDim = Kt::kHeadDim;
  constexpr int kStages = Kt::kStagesQdO;
  extern __shared__ __align__(128) char smem_[];

  const int tidx = threadIdx.x;
  const int n_block = blockIdx.x;
  const int hk = blockIdx.y;
  const int b = blockIdx.z;
  const SeqBounds sb = seq_bounds(p.shape, p.cu_seqlens_q, p.cu_seqlens_k, b);
  const int n0 = n_block * kBlockN;
  if (n0 >= sb.seqlen_k) return;
  const Mask mask = make_mask(p.mask, sb);
  int m_begin = 0, m_end = 0;
  mask.query_block_range(n0, kBlockN, kBlockM, &m_begin, &m_end);
  const int valid_cols = min(kBlockN, sb.seqlen_k - n0);
  const int d = p.shape.headdim;  // <= kHeadDim: the columns past it are zero-filled, never stored
  const int group = p.shape.group_size();
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t qrow0 = varlen ? sb.q_offset : int64_t(b) * p.shape.seqlen_q;  // packed row of query row 0
  constexpr int kNThreadsDq = Kt::kNThreads;
  const ScoreTransform st = ScoreTransform::make(p.mask.softmax_scale, p.mask.softcap);

  // smem: [stage][Q, dO], K, V, dS, P, [stage][LSE, D]. A stage's tensors are stage 0's shifted
  // by a whole number of swizzle periods, so the partitions below are built once.
  constexpr int kQdOStageElems = 2 * kBlockM * kHeadDim;
  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem_)), typename Kt::SmemLayoutQdO{});
  Tensor sQt = make_tensor(sQ.data(), typename Kt::SmemLayoutQdOt{});
  Tensor sQtNoSwizzle = make_tensor(sQ.data().get(), typename Kt::SmemLayoutQdOtNoSwizzle{});
  Tensor sdO = make_tensor(sQ.data() + size(sQ), typename Kt::SmemLayoutQdO{});
  Tensor sdOt = make_tensor(sdO.data(), typename Kt::SmemLayoutQdOt{});
  Tensor sdOtNoSwizzle = make_tensor(sdO.data().get(), typename Kt::SmemLayoutQdOtNoSwizzle{});
  Tensor sK = make_tensor(sQ.data() + kStages * kQdOStageElems, typename Kt::SmemLayoutKV{});
  Tensor sKt = make_tensor(sK.data(), typename Kt::SmemLayoutKt{});
  Tensor sKtNoSwizzle = make_tensor(sK.data().get(), typename Kt::SmemLayoutKtNoSwizzle{});
  Tensor sV = make_tensor(sK.data() + size(sK), typename Kt::SmemLayoutKV{});
  Tensor sdS = make_tensor(sV.data() + size(sV), typename Kt::SmemLayoutPdS{});
  Tensor sdSt = make_tensor(sdS.data(), typename Kt::SmemLayoutPdSt{});
  Tensor sdStNoSwizzle = make_tensor(sdS.data().get(), typename Kt::SmemLayoutPdStNoSwizzle{});
  Tensor sP = make_tensor(sdS.data() + size(sdS), typename Kt::SmemLayoutPdS{});
  Tensor sPt = make_tensor(sP.data(), typename Kt::SmemLayoutPdSt{});
  Tensor sPtNoSwizzle = make_tensor(sP.data().get(), typename Kt::SmemLayoutPdStNoSwizzle{});
  float* s_stats = reinterpret_cast<float*>(raw_pointer_cast((sP.data() + size(sP)).get()));  // [stage][2][M]

  // ---- gmem tiles -------------------------------------------------------------------------
  typename Kt::GmemTiledCopy gmem_tiled_copy;
  auto gmem_thr_copy = gmem_tiled_copy.get_thread_slice(tidx);
  Tensor tQcQ = gmem_thr_copy.partition_S(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  Tensor tKVcKV = gmem_thr_copy.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  Tensor tQsQ = gmem_thr_copy.partition_D(sQ);
  Tensor tdOsdO = gmem_thr_copy.partition_D(sdO);
  Tensor tKsK = gmem_thr_copy.partition_D(sK);
  Tensor tVsV = gmem_thr_copy.partition_D(sV);

  const Element* k_ptr = static_cast<const Element*>(p.k) + row_offset(p.k_stride, b, sb.k_offset, n0, hk);
  const Element* v_ptr = static_cast<const Element*>(p.v) + row_offset(p.v_stride, b, sb.k_offset, n0, hk);
  {
    Tensor gK = make_tensor(make_gmem_ptr(k_ptr), Shape<Int<kBlockN>, Int<kHeadDim>>{},
                            make_stride(p.k_stride.row, _1{}));
    Tensor gV = make_tensor(make_gmem_ptr(v_ptr), Shape<Int<kBlockN>, Int<kHeadDim>>{},
                            make_stride(p.v_stride.row, _1{}));
    copy_rows(gmem_tiled_copy, gmem_thr_copy.partition_S(gK), tKsK, tKVcKV, valid_cols, d);
    copy_rows(gmem_tiled_copy, gmem_thr_copy.partition_S(gV), tVsV, tKVcKV, valid_cols, d);
  }

  // The CTA walks (query head of its GQA group, query block) pairs, head-major; `it` indexes them.
  const int n_mblocks = m_end - m_begin;
  const int n_iters = group * n_mblocks;
  // Issues the cp.async loads of pair `it` into `stage`: Q, dO (rows past the end zero-filled),
  // LSE in the log2 domain is converted on read, D zero-filled past the end.
  // Pairs are tracked incrementally: a runtime division per iteration costs ~25 instructions.
  struct Pair {
    int h, m_block;
  };
  auto next_pair = [&](Pair x) { return x.m_block + 1 < m_end ? Pair{x.h, x.m_block + 1} : Pair{x.h + 1, m_begin}; };
  auto load_qdo = [&](Pair x, int stage) {
    const int h = x.h;
    const int m0 = x.m_block * kBlockM;
    const int valid_rows = min(kBlockM, sb.seqlen_q - m0);
    const Element* q = static_cast<const Element*>(p.q) + row_offset(p.q_stride, b, sb.q_offset, m0, h);
    const Element* d_o = static_cast<const Element*>(p.dout) + row_offset(p.dout_stride, b, sb.q_offset, m0, h);
    Tensor gQ = make_tensor(make_gmem_ptr(q), Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_stride(p.q_stride.row, _1{}));
    Tensor gdO =
        make_tensor(make_gmem_ptr(d_o), Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_stride(p.dout_stride.row, _1{}));
    Tensor tQsQ_s = tQsQ, tdOsdO_s = tdOsdO;
    tQsQ_s.data() = tQsQ_s.data() + stage * kQdOStageElems;
    tdOsdO_s.data() = tdOsdO_s.data() + stage * kQdOStageElems;
    if (valid_rows == kBlockM && d == kHeadDim) {  // a whole block (uniform): no row tests, no zero-fill code
      cute::copy(gmem_tiled_copy, gmem_thr_copy.partition_S(gQ), tQsQ_s);
      cute::copy(gmem_tiled_copy, gmem_thr_copy.partition_S(gdO), tdOsdO_s);
    } else {
      copy_rows(gmem_tiled_copy, gmem_thr_copy.partition_S(gQ), tQsQ_s, tQcQ, valid_rows, d);
      copy_rows(gmem_tiled_copy, gmem_thr_copy.partition_S(gdO), tdOsdO_s, tQcQ, valid_rows, d);
    }
    if (tidx < 2 * kBlockM) {
      const int row = tidx % kBlockM;
      const float* src = (tidx < kBlockM ? p.lse : ws.dsum) + sb.lse_offset + int64_t(h) * sb.lse_head_stride + m0;
      cp_async_f32(s_stats + stage * 2 * kBlockM + tidx, src + (row < valid_rows ? row : 0), row < valid_rows);
    }
  };
  Pair cur{hk * group, m_begin};
  if (n_iters > 0) load_qdo(cur, 0);
  cute::cp_async_fence();

  // ---- MMAs and smem->register copies --------------------------------------------------------
  typename Kt::TiledMmaSdP mma_sdp;
  auto thr_sdp = mma_sdp.get_thread_slice(tidx);
  Tensor tSrQ = thr_sdp.partition_fragment_A(sQ);
  Tensor tSrK = thr_sdp.partition_fragment_B(sK);
  Tensor tdPrdO = thr_sdp.partition_fragment_A(sdO);
  Tensor tdPrV = thr_sdp.partition_fragment_B(sV);
  auto copy_a_sdp = make_tiled_copy_A(typename Kt::SmemCopyAtom{}, mma_sdp);
  auto thr_copy_a_sdp = copy_a_sdp.get_thread_slice(tidx);
  Tensor tSsQ = thr_copy_a_sdp.partition_S(sQ);
  Tensor tdPsdO = thr_copy_a_sdp.partition_S(sdO);
  auto copy_b_sdp = make_tiled_copy_B(typename Kt::SmemCopyAtom{}, mma_sdp);
  auto thr_copy_b_sdp = copy_b_sdp.get_thread_slice(tidx);
  Tensor tSsK = thr_copy_b_sdp.partition_S(sK);
  Tensor tdPsV = thr_copy_b_sdp.partition_S(sV);
  auto copy_pds = make_tiled_copy_C(typename Kt::SmemCopyAtomPdS{}, mma_sdp);
  auto thr_copy_pds = copy_pds.get_thread_slice(tidx);
  Tensor tPsP = thr_copy_pds.partition_D(sP);
  Tensor tdSsdS = thr_copy_pds.partition_D(sdS);

  typename Kt::TiledMmadKV mma_dkv;
  auto thr_dkv = mma_dkv.get_thread_slice(tidx);
  Tensor tdVrPt = thr_dkv.partition_fragment_A(sPtNoSwizzle);
  Tensor tdVrdO = thr_dkv.partition_fragment_B(sdOtNoSwizzle);
  Tensor tdKrdSt = thr_dkv.partition_fragment_A(sdStNoSwizzle);
  Tensor tdKrQt = thr_dkv.partition_fragment_B(sQtNoSwizzle);
  auto copy_a_dkv = make_tiled_copy_A(typename Kt::SmemCopyAtomTransposed{}, mma_dkv);
  auto thr_copy_a_dkv = copy_a_dkv.get_thread_slice(tidx);
  Tensor tdVsPt = thr_copy_a_dkv.partition_S(sPt);
  Tensor tdKsdSt = thr_copy_a_dkv.partition_S(sdSt);
  auto copy_b_dkv = make_tiled_copy_B(typename Kt::SmemCopyAtomTransposed{}, mma_dkv);
  auto thr_copy_b_dkv = copy_b_dkv.get_thread_slice(tidx);
  Tensor tdVsdOt = thr_copy_b_dkv.partition_S(sdOt);
  Tensor tdKsQt = thr_copy_b_dkv.partition_S(sQt);

  typename Kt::TiledMmadQ mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(tidx);
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKtNoSwizzle);
  auto copy_a_dq = make_tiled_copy_A(typename Kt::SmemCopyAtom{}, mma_dq);
  auto thr_copy_a_dq = copy_a_dq.get_thread_slice(tidx);
  Tensor tdQsdS = thr_copy_a_dq.partition_S(sdS);
  auto copy_b_dq = make_tiled_copy_B(typename Kt::SmemCopyAtomTransposed{}, mma_dq);
  auto thr_copy_b_dq = copy_b_dq.get_thread_slice(tidx);
  Tensor tdQsKt = thr_copy_b_dq.partition_S(sKt);

  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  clear(acc_dk);
  clear(acc_dv);

  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  constexpr int kRows = decltype(size<0>(tScS_rc))::value;
  constexpr int kCols = decltype(size<1>(tScS_rc))::value;

  // Shifts a stage-0 smem view to `stage`.
  auto at_stage = [](auto t, int stage) {
    t.data() = t.data() + stage * kQdOStageElems;
    return t;
  };

  bool gave_up = false;  // thread 0 only: stop waiting after a timed-out turn
  for (int it = 0; it < n_iters; ++it, cur = next_pair(cur)) {
    const int stage = kStages == 2 ? it % 2 : 0;
    const int h = cur.h;
    const int m_block = cur.m_block;
    const int m0 = m_block * kBlockM;
    cute::cp_async_wait<0>();
    __syncthreads();  // pair `it` landed; every warp is done with the previous pair's smem

    // LSE (log2 domain; an empty row's -inf becomes +inf so its P is exp2(-inf) = 0) and D.
    float lse2[kRows], dsum[kRows];
#pragma unroll
    for (int mi = 0; mi < kRows; ++mi) {
      const int row = get<0>(tScS_rc(mi, 0));
      const float lse = s_stats[stage * 2 * kBlockM + row];
      lse2[mi] = lse == -INFINITY ? INFINITY : lse * kLog2e;
      dsum[mi] = s_stats[stage * 2 * kBlockM + kBlockM + row];
    }

    // S = Q K^T -> P = exp2(S * scale * log2e - LSE * log2e).
    Tensor acc_s = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
    clear(acc_s);
    Tensor tSsQ_s = at_stage(tSsQ, stage);
    gemm_ss(acc_s, tSrQ, tSrK, tSsQ_s, tSsK, mma_sdp, copy_a_sdp, copy_b_sdp, thr_copy_a_sdp, thr_copy_b_sdp);
    if (kStages == 2 && it + 1 < n_iters) {
      // The next pair's loads, under this pair's remaining GEMMs; issued after the first one so
      // its address arithmetic does not delay the first MMA after the barrier (FA2 does the same).
      load_qdo(next_pair(cur), stage ^ 1);
      cute::cp_async_fence();
    }
    Tensor scores = make_tensor(acc_s.data(), acc_rowcol(acc_s.layout()));
    if (kRareOptions && __builtin_expect(st.softcap > 0.f, 0)) {  // a branch, not predication
#pragma unroll
      for (int i = 0; i < size(scores); ++i) scores(i) = st.apply(scores(i));
    }
    ScoreMods mods;  // ALiBi and dropout of (b, h): off unless kRareOptions
    if constexpr (kRareOptions) mods = ScoreMods::make(p, st, sb, b, h);
    if (kRareOptions && mods.alibi()) alibi_apply<true>(scores, tScS_rc, m0, n0, mods);
    if (mask.tile_needs_mask(m0, kBlockM, n0, kBlockN)) {  // rows past the end see no key
#pragma unroll
      for (int mi = 0; mi < kRows; ++mi) {
        const int row = m0 + get<0>(tScS_rc(mi, 0));
        const int kb = mask.key_begin(row), ke = row < sb.seqlen_q ? mask.key_end(row) : 0;
#pragma unroll
        for (int ni = 0; ni < kCols; ++ni) {
          const int col = n0 + get<1>(tScS_rc(mi, ni));
          if (col < kb || col >= ke) scores(mi, ni) = -INFINITY;
        }
      }
    }
    // Dropout's keep bits (common/dropout_tile.h); dV sums the kept P, scaled once at the end.
    DropoutMask<decltype(tScS_rc), true, Kt::kWarpsNSdP == 1> keep;
    const bool dropout = kRareOptions && mods.dropout();
    if (dropout) keep.generate(tScS_rc, m0, n0, mods);
    // P goes to smem (for dV) in the input precision; `scores` keeps P * d(capped)/d(raw)
    // (the softcap's 1 - tanh^2, else 1) in fp32 for dS.
    if (kRareOptions && __builtin_expect(st.softcap > 0.f, 0)) {  // a branch, not predication
      Tensor rP = make_tensor<Element>(acc_s.layout());
      Tensor rP_rc = make_tensor(rP.data(), acc_rowcol(rP.layout()));
#pragma unroll
      for (int mi = 0; mi < kRows; ++mi) {
#pragma unroll
        for (int ni = 0; ni < kCols; ++ni) {
          const float s = scores(mi, ni);
          const float prob = exp2f(fmaf(s, st.exp2_scale, -lse2[mi]));
          rP_rc(mi, ni) = Element(dropout && !keep.keep(mi, ni) ? 0.f : prob);
          // The capped score without ALiBi's bias. Masked scores are -inf: their 1 - tanh^2
          // would be -inf, times P = 0 a NaN.
          const float capped = mods.alibi() ? s - mods.alibi_units(m0 + get<0>(tScS_rc(mi, ni)),
                                                                   n0 + get<1>(tScS_rc(mi, ni)))
                                            : s;
          scores(mi, ni) = prob * fmaxf(st.dtanh_factor(capped), 0.f);
        }
      }
      cute::copy(copy_pds, thr_copy_pds.retile_S(rP), tPsP);
    } else {
#pragma unroll
      for (int mi = 0; mi < kRows; ++mi) {
#pragma unroll
        for (int ni = 0; ni < kCols; ++ni) scores(mi, ni) = exp2f(fmaf(scores(mi, ni), st.exp2_scale, -lse2[mi]));
      }
      Tensor rP = convert_type<Element>(acc_s);  // packed conversions
      if (dropout) {
        Tensor rP_rc = make_tensor(rP.data(), acc_rowcol(rP.layout()));
#pragma unroll
        for (int mi = 0; mi < kRows; ++mi)
#pragma unroll
          for (int ni = 0; ni < kCols; ++ni)
            if (!keep.keep(mi, ni)) rP_rc(mi, ni) = Element(0.f);
      }
      cute::copy(copy_pds, thr_copy_pds.retile_S(rP), tPsP);
    }

    // dP = dO V^T -> dS = P (dP - D) [* (1 - tanh^2)].
    Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
    clear(acc_dp);
    Tensor tdPsdO_s = at_stage(tdPsdO, stage);
    gemm_ss(acc_dp, tdPrdO, tdPrV, tdPsdO_s, tdPsV, mma_sdp, copy_a_sdp, copy_b_sdp, thr_copy_a_sdp, thr_copy_b_sdp);
    Tensor dS = make_tensor(acc_dp.data(), acc_rowcol(acc_dp.layout()));
    if (dropout) {  // dP of the dropped P: dS = P (keep * scale * dP - D)
#pragma unroll
      for (int mi = 0; mi < kRows; ++mi) {
#pragma unroll
        for (int ni = 0; ni < kCols; ++ni)
          dS(mi, ni) = scores(mi, ni) * ((keep.keep(mi, ni) ? dS(mi, ni) * p.dropout.scale : 0.f) - dsum[mi]);
      }
    } else {
#pragma unroll
      for (int mi = 0; mi < kRows; ++mi) {
#pragma unroll
        for (int ni = 0; ni < kCols; ++ni) dS(mi, ni) = scores(mi, ni) * (dS(mi, ni) - dsum[mi]);
      }
    }
    Tensor rdS = convert_type<Element>(acc_dp);
    cute::copy(copy_pds, thr_copy_pds.retile_S(rdS), tdSsdS);
    __syncthreads();  // P and dS visible to every warp

    // dV += P^T dO; dK += dS^T Q. With two Q/dO stages dK runs last (FA2's order): its MMAs
    // then run while the dQ reductions drain, instead of the reductions sitting right before the
    // next pair's barrier (same-run A/Bs on an H100: +5-6% at hdim 64; +2-3% at 128 and 256 once
    // the reductions became one v4 per 4 values). One stage keeps dK here: the next pair's loads
    // go under the dQ GEMM, after the last read of Q.
    constexpr bool kDkLast = kStages == 2;
    Tensor tdVsdOt_s = at_stage(tdVsdOt, stage);
    gemm_ss(acc_dv, tdVrPt, tdVrdO, tdVsPt, tdVsdOt_s, mma_dkv, copy_a_dkv, copy_b_dkv, thr_copy_a_dkv,
            thr_copy_b_dkv);
    auto gemm_dk = [&]() {
      Tensor tdKsQt_s = at_stage(tdKsQt, stage);
      gemm_ss(acc_dk, tdKrdSt, tdKrQt, tdKsdSt, tdKsQt_s, mma_dkv, copy_a_dkv, copy_b_dkv, thr_copy_a_dkv,
              thr_copy_b_dkv);
    };
    if constexpr (!kDkLast) {
      gemm_dk();
      if (kStages == 1 && it + 1 < n_iters) {
        __syncthreads();  // every warp is done reading Q and dO
        load_qdo(next_pair(cur), 0);  // under the dQ GEMM and its atomics
        cute::cp_async_fence();
      }
    }

    // dQ_accum += dS K (unscaled; the postprocess multiplies by softmax_scale).
    Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
    clear(acc_dq);
    gemm_ss(acc_dq, tdQrdS, tdQrKt, tdQsdS, tdQsKt, mma_dq, copy_a_dq, copy_b_dq, thr_copy_a_dq, thr_copy_b_dq);

    int* sem = nullptr;
    if (kRareOptions && ws.semaphores != nullptr) {
      sem = ws.semaphores + (int64_t(b) * p.shape.nheads_q + h) * ws.num_m_blocks + m_block;
      if (tidx == 0 && !gave_up) {
        const int turn = dq_turn(mask, n_block, m_block, kBlockN, kBlockM);
        // Bounded spin: a scheduling surprise degrades to non-deterministic, never to a hang.
        long spins = 0;
        while (load_acquire(sem) != turn && spins < (1l << 24)) {
          __nanosleep(128);
          ++spins;
        }
        gave_up = spins >= (1l << 24);
      }
      __syncthreads();
    }
    // Whole tile, fragment order (dq_tile): rows past the sequence end add zeros (their P and
    // dS are 0) to padding the postprocess never reads.
    float* dq_acc = dq_tile<kBlockM, kHeadDim>(ws, qrow0, b, m_block, h, p.shape.nheads_q) + tidx * 4;
#pragma unroll
    for (int j = 0; j < size(acc_dq) / 4; ++j)
      atomic_add_4(dq_acc + j * (kNThreadsDq * 4), acc_dq(4 * j), acc_dq(4 * j + 1), acc_dq(4 * j + 2),
                   acc_dq(4 * j + 3));
    if (sem != nullptr) {
      __threadfence();
      __syncthreads();
      if (tidx == 0) atomicAdd(sem, 1);
    }
    if constexpr (kDkLast) gemm_dk();
  }
  cute::cp_async_wait<0>();  // no copy may land after the CTA's smem is handed on (n_iters == 0)

  // Epilogue: dK = scale * dS^T Q (dV needs no scale), rows past the sequence end dropped.
  Tensor tdKVcdKV = thr_dkv.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  Tensor tdKVcdKV_rc = make_tensor(tdKVcdKV.data(), acc_rowcol(tdKVcdKV.layout()));
  Tensor acc_dk_rc = make_tensor(acc_dk.data(), acc_rowcol(acc_dk.layout()));
  Tensor acc_dv_rc = make_tensor(acc_dv.data(), acc_rowcol(acc_dv.layout()));
  Element* dk_ptr = static_cast<Element*>(p.dk) + row_offset(p.dk_stride, b, sb.k_offset, n0, hk);
  Element* dv_ptr = static_cast<Element*>(p.dv) + row_offset(p.dv_stride, b, sb.k_offset, n0, hk);
  store_acc_rows<Element>(acc_dk_rc, tdKVcdKV_rc, dk_ptr, p.dk_stride.row, valid_cols, d, p.mask.softmax_scale);
  // dV summed the kept P: kept entries are 1 / keep probability.
  store_acc_rows<Element>(acc_dv_rc, tdKVcdKV_rc, dv_ptr, p.dv_stride.row, valid_cols, d,
                          kRareOptions && p.dropout.enabled() ? p.dropout.scale : 1.f);
}

}  // namespace flashattn::sm80
