// The CUDA combine of partial attention results (common/combine_params.h): flashattn_combine on
// device tensors, and the GPU paths' split-KV, which launch it on their fp32 partials.
// Two kernels, one semantics. Many splits (decode's split-KV: 16-128 of them over a few rows):
// a CTA per (batch, row, head) whose warps take every kSplitWarps-th split, so the partial rows
// are read by 8 warps at once instead of one after the other (a warp walking 57 splits in turn
// took 74 µs for a 32-row decode step, longer than its attention kernel). Few splits: one warp
// per row. Either way the LSEs are reduced first (max, then the sum of exp), each output column
// accumulates w_s / sum * O_s in fp32, splits whose LSE is -inf weigh 0 and their partial output
// is not read, and a NaN or +inf LSE makes the row NaN (as the host path).
#include <cuda_runtime.h>

#include <cmath>

#include "api/cuda_util.h"
#include "common/combine_params.h"
#include "common/error.h"
#include "common/half_convert.h"

namespace flashattn::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

__global__ void __launch_bounds__(32 * kWarpsPerBlock) combine_kernel(const CombineParams p) {
  const int64_t rows = p.batch * p.seqlen_q * p.nheads;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; row < rows; row += warps) {
    const int64_t h = row % p.nheads, i = (row / p.nheads) % p.seqlen_q, b = row / (p.nheads * p.seqlen_q);
    auto lse_of = [&](int s) {
      return p.lse_partial[s * p.lse_partial_stride[0] + b * p.lse_partial_stride[1] + h * p.lse_partial_stride[2] +
                           i * p.lse_partial_stride[3]];
    };
    float m = -INFINITY;
    bool nan = false;
    for (int s = lane; s < p.num_splits; s += 32) {
      const float l = lse_of(s);
      if (l != l) nan = true;
      else m = fmaxf(m, l);
    }
    nan = __any_sync(0xffffffffu, nan);
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float lse_out;
    const int64_t obase = b * p.out_stride[0] + i * p.out_stride[1] + h * p.out_stride[2];
    if (nan || m == INFINITY) {
      lse_out = NAN;
      for (int64_t c = lane; c < p.headdim; c += 32) store_float(p.out, p.dtype, obase + c, NAN);
    } else if (m == -INFINITY) {  // no split saw a key for this row
      lse_out = -INFINITY;
      for (int64_t c = lane; c < p.headdim; c += 32) store_float(p.out, p.dtype, obase + c, 0.f);
    } else {
      float sum = 0.f;
      for (int s = lane; s < p.num_splits; s += 32) sum += expf(lse_of(s) - m);
      for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      lse_out = m + logf(sum);  // sum >= 1: the max's own term is 1
      const float inv = 1.f / sum;
      for (int64_t c = lane; c < p.headdim; c += 32) {
        float acc = 0.f;
        for (int s = 0; s < p.num_splits; ++s) {
          const float w = expf(lse_of(s) - m);
          if (w == 0.f) continue;  // an empty split: its partial output may be anything
          const int64_t pi = s * p.o_partial_stride[0] + b * p.o_partial_stride[1] + i * p.o_partial_stride[2] +
                             h * p.o_partial_stride[3] + c;
          acc += w * inv * load_float(p.o_partial, p.partial_dtype, pi);
        }
        store_float(p.out, p.dtype, obase + c, acc);
      }
    }
    if (lane == 0 && p.lse != nullptr) p.lse[p.lse_index(b, h, i)] = lse_out;
  }
}

// The per-row kernel (many splits): kSplitWarps warps per row, up to kMaxColsPerLane * 32 columns.
constexpr int kSplitWarps = 8;
constexpr int kMaxColsPerLane = 8;               // head dims up to 256
constexpr int kMinSplitsPerRowKernel = 8;        // below, the warp kernel's one warp per row
constexpr int kMaxSplitsPerRowKernel = 8192;     // the LSEs live in 32 KB of dynamic smem

__device__ __forceinline__ float block_max(float v, float* scratch) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < kSplitWarps; ++w) v = fmaxf(v, scratch[w]);
  __syncthreads();  // scratch is reused by the next reduction
  return v;
}
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < kSplitWarps; ++w) v += scratch[w];
  __syncthreads();
  return v;
}

__global__ void __launch_bounds__(32 * kSplitWarps) combine_row_kernel(const CombineParams p) {
  extern __shared__ float weight[];  // [num_splits]: the LSEs, then exp(LSE_s - max)
  __shared__ float column_sums[kSplitWarps][kMaxColsPerLane * 32];
  __shared__ float scratch[kSplitWarps];
  const int64_t rows = p.batch * p.seqlen_q * p.nheads;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, num_splits = p.num_splits;
  const int d = int(p.headdim);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t h = row % p.nheads, i = (row / p.nheads) % p.seqlen_q, b = row / (p.nheads * p.seqlen_q);
    const int64_t lbase = b * p.lse_partial_stride[1] + h * p.lse_partial_stride[2] + i * p.lse_partial_stride[3];
    float m = -INFINITY;
    bool nan = false;
    for (int s = tid; s < num_splits; s += blockDim.x) {
      const float l = p.lse_partial[s * p.lse_partial_stride[0] + lbase];
      weight[s] = l;
      if (l != l) nan = true;
      else m = fmaxf(m, l);
    }
    nan = __syncthreads_or(nan);
    m = block_max(m, scratch);
    const int64_t obase = b * p.out_stride[0] + i * p.out_stride[1] + h * p.out_stride[2];
    float lse_out;
    if (nan || m == INFINITY) {  // uniform over the block, as m and nan are
      lse_out = NAN;
      for (int c = tid; c < d; c += blockDim.x) store_float(p.out, p.dtype, obase + c, NAN);
    } else if (m == -INFINITY) {  // no split saw a key for this row
      lse_out = -INFINITY;
      for (int c = tid; c < d; c += blockDim.x) store_float(p.out, p.dtype, obase + c, 0.f);
    } else {
      float sum = 0.f;
      for (int s = tid; s < num_splits; s += blockDim.x) {
        const float e = expf(weight[s] - m);
        weight[s] = e;
        sum += e;
      }
      sum = block_sum(sum, scratch);  // its barriers also publish weight[]
      lse_out = m + logf(sum);  // sum >= 1: the max's own term is 1
      const float inv = 1.f / sum;
      float acc[kMaxColsPerLane];
#pragma unroll
      for (int j = 0; j < kMaxColsPerLane; ++j) acc[j] = 0.f;
      const int64_t pbase = b * p.o_partial_stride[1] + i * p.o_partial_stride[2] + h * p.o_partial_stride[3];
#pragma unroll 2
      for (int s = warp; s < num_splits; s += kSplitWarps) {
        const float w = weight[s];
        if (w == 0.f) continue;  // an empty split (warp-uniform): its partial output may be anything
        const float ws = w * inv;
        const int64_t ps = s * p.o_partial_stride[0] + pbase;
#pragma unroll
        for (int j = 0; j < kMaxColsPerLane; ++j) {
          const int c = lane + 32 * j;
          if (c < d) acc[j] += ws * load_float(p.o_partial, p.partial_dtype, ps + c);
        }
      }
#pragma unroll
      for (int j = 0; j < kMaxColsPerLane; ++j) column_sums[warp][lane + 32 * j] = acc[j];
      __syncthreads();
      for (int c = tid; c < d; c += blockDim.x) {
        float v = column_sums[0][c];
        for (int w = 1; w < kSplitWarps; ++w) v += column_sums[w][c];
        store_float(p.out, p.dtype, obase + c, v);
      }
    }
    if (tid == 0 && p.lse != nullptr) p.lse[p.lse_index(b, h, i)] = lse_out;
    __syncthreads();  // weight[] and column_sums are the next row's
  }
}

}  // namespace

flashattn_status combine(const CombineParams& p, void* stream) {
  if (p.lse_partial_fp64 != nullptr || p.lse_fp64 != nullptr || p.dtype == FLASHATTN_DTYPE_FP64 ||
      p.partial_dtype == FLASHATTN_DTYPE_FP64)
    return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "dtype: fp64 combines run on host tensors only");
  const int64_t rows = p.batch * p.seqlen_q * p.nheads;
  if (rows == 0) return FLASHATTN_SUCCESS;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  const int64_t max_grid = int64_t(1) << 20;
  if (p.num_splits >= kMinSplitsPerRowKernel && p.num_splits <= kMaxSplitsPerRowKernel &&
      p.headdim <= kMaxColsPerLane * 32) {
    const unsigned grid = unsigned(rows < max_grid ? rows : max_grid);
    combine_row_kernel<<<grid, 32 * kSplitWarps, size_t(p.num_splits) * sizeof(float), st>>>(p);
  } else {
    const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    const unsigned grid = unsigned(blocks < max_grid ? blocks : max_grid);
    combine_kernel<<<grid, 32 * kWarpsPerBlock, 0, st>>>(p);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return set_error(FLASHATTN_ERROR_CUDA, "combine kernel launch: %s", cudaGetErrorString(e));
  return FLASHATTN_SUCCESS;
}

}  // namespace flashattn::cuda
