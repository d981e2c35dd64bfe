// Small CuTe helpers shared by the sm80 forward and backward kernels: register-layout views of
// mma.sync accumulators, smem->register pipelined GEMMs, predicated tile loads, conversions.
#pragma once

#include <climits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

namespace flashattn::sm80 {

using namespace cute;
using cute::Shape;  // not flashattn::Shape (the problem shape)

// Accumulator (MMA=4, MMA_M, MMA_N) of m16n8 atoms -> (rows=(2, MMA_M), cols=(2, MMA_N)).
// Value v of the C fragment sits at row +8*(v/2), column +(v%2).
template <typename Layout>
CUTE_HOST_DEVICE auto acc_rowcol(Layout acc_layout) {
  static_assert(decltype(size<0>(acc_layout))::value == 4);
  static_assert(decltype(rank(acc_layout))::value == 3);
  auto l = logical_divide(acc_layout, Shape<_2>{});  // ((2, 2), MMA_M, MMA_N)
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<2>(l)));
}

// Accumulator (4, MMA_M, MMA_N) -> A operand of m16n8k16 ((4, 2), MMA_M, MMA_N / 2): the A
// fragment of a k16 slice is the C fragments of two adjacent n8 tiles, in that order.
template <typename Layout>
CUTE_HOST_DEVICE auto acc_as_A(Layout acc_layout) {
  static_assert(decltype(size<0>(acc_layout))::value == 4);
  static_assert(decltype(rank(acc_layout))::value == 3);
  auto l = logical_divide(acc_layout, Shape<Underscore, Underscore, _2>{});  // (4, MMA_M, (2, MMA_N/2))
  return make_layout(make_layout(get<0>(l), get<2, 0>(l)), get<1>(l), get<2, 1>(l));
}

template <typename T>
struct Pack2;
template <>
struct Pack2<cutlass::half_t> {
  using type = __half2;
  static __device__ __forceinline__ type make(float a, float b) { return __floats2half2_rn(a, b); }
};
template <>
struct Pack2<float> {  // split-KV's fp32 partial outputs
  using type = float2;
  static __device__ __forceinline__ type make(float a, float b) { return make_float2(a, b); }
};
template <>
struct Pack2<cutlass::bfloat16_t> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ type make(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

// fp32 register tensor -> owning fp16/bf16 register tensor of the same (static) layout.
template <typename To, typename Tensor>
__device__ __forceinline__ auto convert_type(Tensor const& t) {
  auto out = make_tensor<To>(t.layout());
  constexpr int N = decltype(size(t))::value;
  static_assert(N % 2 == 0);
  static_assert(decltype(cosize(t.layout()))::value == N, "compact register fragments only");
  // Storage-order conversion: both tensors share the (compact) layout.
  auto* dst = reinterpret_cast<typename Pack2<To>::type*>(raw_pointer_cast(out.data()));
  const float* src = raw_pointer_cast(t.data());
#pragma unroll
  for (int i = 0; i < N / 2; ++i) dst[i] = Pack2<To>::make(src[2 * i], src[2 * i + 1]);
  return out;
}

// acc += A * B with both operands streamed from smem one k-slice ahead of the MMAs.
template <typename Acc, typename TA, typename TB, typename TsA, typename TsB, typename TiledMma,
          typename CopyA, typename CopyB, typename ThrCopyA, typename ThrCopyB>
__device__ __forceinline__ void gemm_ss(Acc& acc, TA& tCrA, TB& tCrB, TsA const& tCsA, TsB const& tCsB,
                                        TiledMma const& mma, CopyA const& copy_a, CopyB const& copy_b,
                                        ThrCopyA const& thr_a, ThrCopyB const& thr_b) {
  auto tCrA_v = thr_a.retile_D(tCrA);
  auto tCrB_v = thr_b.retile_D(tCrB);
  CUTE_STATIC_ASSERT_V(size<1>(tCsA) == size<1>(tCrA_v));
  CUTE_STATIC_ASSERT_V(size<1>(tCsB) == size<1>(tCrB_v));
  cute::copy(copy_a, tCsA(_, _, _0{}), tCrA_v(_, _, _0{}));
  cute::copy(copy_b, tCsB(_, _, _0{}), tCrB_v(_, _, _0{}));
  constexpr int K = decltype(size<2>(tCrA))::value;
#pragma unroll
  for (int i = 0; i < K; ++i) {
    if (i < K - 1) {
      cute::copy(copy_a, tCsA(_, _, i + 1), tCrA_v(_, _, i + 1));
      cute::copy(copy_b, tCsB(_, _, i + 1), tCrB_v(_, _, i + 1));
    }
    cute::gemm(mma, tCrA(_, _, i), tCrB(_, _, i), acc);
  }
}

// acc += A * B with A already in registers (P in the forward), B streamed from smem.
template <typename Acc, typename TA, typename TB, typename TsB, typename TiledMma, typename CopyB,
          typename ThrCopyB>
__device__ __forceinline__ void gemm_rs(Acc& acc, TA const& tCrA, TB& tCrB, TsB const& tCsB, TiledMma const& mma,
                                        CopyB const& copy_b, ThrCopyB const& thr_b) {
  auto tCrB_v = thr_b.retile_D(tCrB);
  CUTE_STATIC_ASSERT_V(size<1>(tCsB) == size<1>(tCrB_v));
  cute::copy(copy_b, tCsB(_, _, _0{}), tCrB_v(_, _, _0{}));
  constexpr int K = decltype(size<2>(tCrA))::value;
#pragma unroll
  for (int i = 0; i < K; ++i) {
    if (i < K - 1) cute::copy(copy_b, tCsB(_, _, i + 1), tCrB_v(_, _, i + 1));
    cute::gemm(mma, tCrA(_, _, i), tCrB(_, _, i), acc);
  }
}

// Global -> smem tile copy (cp.async) of rows [0, valid_rows) and columns [0, valid_cols); rows
// past the end are zero-filled so that no garbage (possibly NaN) from beyond the sequence
// reaches an MMA, and so are columns past the tensors' head dim (a head dim without its own
// kernel runs on the next larger one: zero columns add nothing to Q K^T, dO V^T, and the
// extra output columns are never stored). valid_cols is a multiple of 8, so each 16-byte
// chunk is wholly in or out.
// S, D: (CPY, CPY_M, CPY_K); C: identity coordinates partitioned the same way.
template <typename TiledCopy, typename TS, typename TD, typename TC>
__device__ __forceinline__ void copy_rows(TiledCopy const& tiled_copy, TS const& S, TD& D, TC const& C,
                                          int valid_rows, int valid_cols) {
#pragma unroll
  for (int m = 0; m < size<1>(S); ++m) {
    if (get<0>(C(0, m, 0)) < valid_rows) {
#pragma unroll
      for (int k = 0; k < size<2>(S); ++k) {
        if (get<1>(C(0, m, k)) < valid_cols) cute::copy(tiled_copy, S(_, m, k), D(_, m, k));
        else cute::clear(D(_, m, k));
      }
    } else {
      cute::clear(D(_, m, _));
    }
  }
}

// A tile with every row valid: the plain copy when every column is too (the kernel's own head
// dim, uniform), else copy_rows' column predicate.
template <typename TiledCopy, typename TS, typename TD, typename TC>
__device__ __forceinline__ void copy_full_rows(TiledCopy const& tiled_copy, TS const& S, TD& D, TC const& C,
                                               int valid_cols, bool all_cols) {
  if (all_cols) cute::copy(tiled_copy, S, D);
  else copy_rows(tiled_copy, S, D, C, INT_MAX, valid_cols);
}

// copy_rows for a tile whose rows have addresses of their own (KV cache: pages, or cache rows
// through batch_idx/leftpad): tile row r of D comes from row_ptr(row0 + r), a pointer to its
// column 0. Rows from valid_rows on and columns from valid_cols on are zeroed.
template <typename TiledCopy, typename RowPtr, typename TD, typename TC>
__device__ __forceinline__ void gather_rows(TiledCopy const& tiled_copy, RowPtr const& row_ptr, int row0, TD& D,
                                            TC const& C, int valid_rows, int valid_cols) {
#pragma unroll
  for (int m = 0; m < size<1>(D); ++m) {
    const int r = get<0>(C(0, m, 0));
    if (r < valid_rows) {
      const auto* src_row = row_ptr(row0 + r);
#pragma unroll
      for (int k = 0; k < size<2>(D); ++k) {
        const int c = get<1>(C(0, m, k));
        if (c < valid_cols) {
          Tensor src = make_tensor(make_gmem_ptr(src_row + c), make_layout(shape(D(_, m, k))));
          cute::copy(tiled_copy, src, D(_, m, k));
        } else {
          cute::clear(D(_, m, k));
        }
      }
    } else {
      cute::clear(D(_, m, _));
    }
  }
}

// gather_rows for a tile whose every row is valid: no row predicate; columns as copy_full_rows.
template <typename TiledCopy, typename RowPtr, typename TD, typename TC>
__device__ __forceinline__ void gather_full_rows(TiledCopy const& tiled_copy, RowPtr const& row_ptr, int row0, TD& D,
                                                 TC const& C, int valid_cols, bool all_cols) {
#pragma unroll
  for (int m = 0; m < size<1>(D); ++m) {
    const auto* src_row = row_ptr(row0 + get<0>(C(0, m, 0)));
#pragma unroll
    for (int k = 0; k < size<2>(D); ++k) {
      const int c = get<1>(C(0, m, k));
      if (all_cols || c < valid_cols) {
        Tensor src = make_tensor(make_gmem_ptr(src_row + c), make_layout(shape(D(_, m, k))));
        cute::copy(tiled_copy, src, D(_, m, k));
      } else {
        cute::clear(D(_, m, k));
      }
    }
  }
}

template <typename T>
__device__ __forceinline__ T quad_allreduce_max(T x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}
template <typename T>
__device__ __forceinline__ T quad_allreduce_sum(T x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

// Hardware named barrier kId (0 is __syncthreads) over kThreads threads, whole warps. The id is
// an immediate: with a register id ptxas reserves all 16 barriers of the CTA.
template <int kId, int kThreads>
__device__ __forceinline__ void named_barrier_sync() {
  static_assert(kId > 0 && kId < 16 && kThreads % 32 == 0);
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

// Stores a fp32 accumulator tile (rows x cols, coordinates from `coord`) as Element pairs to
// gmem rows [0, valid_rows), columns [0, valid_cols) (the tensors' head dim, even); tile row r
// starts at base + row_offset(r). The two values of a pair are adjacent columns (m16n8 C layout).
template <typename Element, typename Acc, typename Coord, typename RowOffset>
__device__ __forceinline__ void store_acc_rows_at(Acc const& acc_rc, Coord const& coord_rc, Element* base,
                                                  RowOffset const& row_offset, int valid_rows, int valid_cols,
                                                  float scale) {
  using P2 = Pack2<Element>;
#pragma unroll
  for (int mi = 0; mi < size<0>(acc_rc); ++mi) {
    const int row = get<0>(coord_rc(mi, 0));
    if (row >= valid_rows) continue;
    Element* out_row = base + row_offset(row);
#pragma unroll
    for (int ni = 0; ni < size<1>(acc_rc); ni += 2) {
      const int col = get<1>(coord_rc(mi, ni));
      if (col >= valid_cols) continue;
      *reinterpret_cast<typename P2::type*>(out_row + col) = P2::make(acc_rc(mi, ni) * scale, acc_rc(mi, ni + 1) * scale);
    }
  }
}

// The same for rows `row_stride` elements apart.
template <typename Element, typename Acc, typename Coord>
__device__ __forceinline__ void store_acc_rows(Acc const& acc_rc, Coord const& coord_rc, Element* base,
                                               int64_t row_stride, int valid_rows, int valid_cols, float scale) {
  store_acc_rows_at(acc_rc, coord_rc, base, [&](int row) { return row * row_stride; }, valid_rows, valid_cols, scale);
}

}  // namespace flashattn::sm80
