// The CUDA combine of partial attention results (common/combine_params.h): flashattn_combine on
// device tensors, and the GPU paths' split-KV, which launch it on their fp32 partials.
// Four kernels, one semantics:
//  - many splits (decode's split-KV: 16-128 of them over a few rows): a CTA per (batch, row,
//    head) whose threads split the columns and the splits between them (a warp walking 57
//    splits in turn took 74 µs for a 32-row decode step); from 17 to 32 splits at d <= 128 the
//    same with an LSE reduction per warp and one barrier (combine_row_warps_kernel);
//  - up to 8 splits over fp32 partials with aligned rows: a warp per row, 4 columns a lane, every
//    split's row loaded before the LSE reduction;
//  - otherwise a warp per row, lanes over columns (any dtype, scalar loads).
// In each the LSEs are reduced first (max, then the sum of exp), each output column accumulates
// w_s / sum * O_s in fp32, splits whose LSE is -inf weigh 0 and their partial output is not
// used, and a NaN or +inf LSE makes the row NaN (as the host path).
#include <cuda_runtime.h>

#include <cmath>

#include "api/cuda_util.h"
#include "common/combine_params.h"
#include "common/error.h"
#include "common/half_convert.h"

namespace flashattn::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

// Programmatic dependent launch (sm90+): the split-KV combine is launched while the attention
// kernel before it on the stream still runs (that kernel lets it, griddepcontrol.launch_dependents)
// and waits here until the attention kernel has finished and its partials are visible, so the
// combine's launch latency (a few µs of a decode step) overlaps the attention's tail. Launched
// the ordinary way (flashattn_combine, older GPUs) this returns at once.
__device__ __forceinline__ void wait_for_primary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Max and sum over a warp's lanes (every lane gets the result).
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// acc += w * v, per component.
__device__ __forceinline__ void add_scaled(float4& acc, float w, const float4& v) {
  acc.x += w * v.x, acc.y += w * v.y;
  acc.z += w * v.z, acc.w += w * v.w;
}

__global__ void __launch_bounds__(32 * kWarpsPerBlock) combine_kernel(const CombineParams p) {
  wait_for_primary();
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
    m = warp_max(m);
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
      sum = warp_sum(sum);
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

// Few splits over fp32 partials with 16-byte aligned rows (split-KV's own, e.g. 2-8 splits over a
// batch of decode rows): a warp per row, each lane 4 columns per pass. Every partial row of the
// lane's columns is loaded before the LSE reduction, so the step costs one round trip of latency
// rather than the scalar kernel's one per split (6 µs for 1024 rows x 2 splits on an H100).
constexpr int kVecMaxSplits = 8;
constexpr int kVecMaxHeadDim = 256;  // two passes of 32 lanes x 4 columns

__global__ void __launch_bounds__(32 * kWarpsPerBlock) combine_warp_vec4_kernel(const CombineParams p) {
  wait_for_primary();
  const int64_t rows = p.batch * p.seqlen_q * p.nheads;
  const int lane = threadIdx.x % 32, num_splits = p.num_splits, d = int(p.headdim);
  const int64_t warps = int64_t(gridDim.x) * kWarpsPerBlock;
  const float* partial = static_cast<const float*>(p.o_partial);
  constexpr int kPasses = kVecMaxHeadDim / 128;
  for (int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; row < rows; row += warps) {
    const int64_t h = row % p.nheads, i = (row / p.nheads) % p.seqlen_q, b = row / (p.nheads * p.seqlen_q);
    const int64_t pbase = b * p.o_partial_stride[1] + i * p.o_partial_stride[2] + h * p.o_partial_stride[3];
    // Every split's row (a split that saw no key may hold anything: weighed by a select, below).
    float4 v[kPasses][kVecMaxSplits];
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int c = pass * 128 + lane * 4;
#pragma unroll
      for (int s = 0; s < kVecMaxSplits; ++s)
        if (s < num_splits && c < d)
          v[pass][s] = *reinterpret_cast<const float4*>(partial + s * p.o_partial_stride[0] + pbase + c);
    }
    const float l = lane < num_splits ? p.lse_partial[lane * p.lse_partial_stride[0] + b * p.lse_partial_stride[1] +
                                                      h * p.lse_partial_stride[2] + i * p.lse_partial_stride[3]]
                                      : -INFINITY;
    const bool nan = __any_sync(0xffffffffu, l != l);
    const float m = warp_max(l);
    const int64_t obase = b * p.out_stride[0] + i * p.out_stride[1] + h * p.out_stride[2];
    float lse_out;
    if (nan || m == INFINITY) {
      lse_out = NAN;
      for (int c = lane; c < d; c += 32) store_float(p.out, p.dtype, obase + c, NAN);
    } else if (m == -INFINITY) {  // no split saw a key for this row
      lse_out = -INFINITY;
      for (int c = lane; c < d; c += 32) store_float(p.out, p.dtype, obase + c, 0.f);
    } else {
      const float w = lane < num_splits ? expf(l - m) : 0.f;
      const float sum = warp_sum(w);
      lse_out = m + logf(sum);  // sum >= 1: the max's own term is 1
      const float inv = 1.f / sum;
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        const int c = pass * 128 + lane * 4;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int s = 0; s < kVecMaxSplits; ++s) {
          const float ws = __shfl_sync(0xffffffffu, w, s) * inv;
          if (s < num_splits && ws != 0.f) add_scaled(acc, ws, v[pass][s]);
        }
        if (c < d) {
          store_float(p.out, p.dtype, obase + c, acc.x);
          store_float(p.out, p.dtype, obase + c + 1, acc.y);
          store_float(p.out, p.dtype, obase + c + 2, acc.z);
          store_float(p.out, p.dtype, obase + c + 3, acc.w);
        }
      }
    }
    if (lane == 0 && p.lse != nullptr) p.lse[p.lse_index(b, h, i)] = lse_out;
  }
}

// The per-row kernel (many splits): a CTA of kRowThreads per row, its threads `groups` split
// groups x `vecs` column vectors of kVec values; group g takes splits g, g + groups, ... A decode
// step's combine is bound by latency, not bandwidth (~1 MB over 32 rows): each thread loads its
// first kPrefetch partial rows before the LSE reduction, so those loads overlap it, and the rest
// come kPrefetch at a time. (A CTA of 8 warps taking every 8th split in turn, 4 columns each,
// took 12 µs for 64 splits of a 32-row step on an H100.)
constexpr int kRowThreads = 256;
constexpr int kPrefetch = 4;
constexpr int kMinSplitsPerRowKernel = 8;        // below (or up to 8 with float4 rows), a warp per row
constexpr int kMaxSplitsPerRowKernel = 8192;     // the weights live in 32 KB of dynamic smem
constexpr int kMaxRowKernelHeadDim = 256;

__device__ __forceinline__ float block_reduce(float v, float* scratch, bool is_max) {
  for (int o = 16; o > 0; o /= 2) {
    const float x = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, x) : v + x;
  }
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < kRowThreads / 32; ++w) v = is_max ? fmaxf(v, scratch[w]) : v + scratch[w];
  __syncthreads();  // scratch is reused by the next reduction
  return v;
}

// kVec 4: fp32 partials with 16-byte aligned rows (split-KV's own); kVec 1: any dtype.
template <int kVec>
__device__ __forceinline__ void load_partial(const CombineParams& p, int64_t index, float (&v)[kVec]) {
  if constexpr (kVec == 4) {
    const float4 x = *reinterpret_cast<const float4*>(static_cast<const float*>(p.o_partial) + index);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
  } else {
    v[0] = load_float(p.o_partial, p.partial_dtype, index);
  }
}

template <int kVec>
__global__ void __launch_bounds__(kRowThreads) combine_row_kernel(const CombineParams p) {
  extern __shared__ float weight[];  // [num_splits]: the LSEs, then exp(LSE_s - max)
  __shared__ float column_sums[kRowThreads * kVec];  // [groups][d]
  __shared__ float scratch[kRowThreads / 32];
  wait_for_primary();
  const int64_t rows = p.batch * p.seqlen_q * p.nheads;
  const int tid = threadIdx.x, num_splits = p.num_splits, d = int(p.headdim);
  const int vecs = (d + kVec - 1) / kVec;  // <= kRowThreads (host)
  const int groups = kRowThreads / vecs;
  const int g = tid / vecs, c0 = (tid % vecs) * kVec;
  const bool active = g < groups;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t h = row % p.nheads, i = (row / p.nheads) % p.seqlen_q, b = row / (p.nheads * p.seqlen_q);
    const int64_t pbase = b * p.o_partial_stride[1] + i * p.o_partial_stride[2] + h * p.o_partial_stride[3] + c0;
    float pre[kPrefetch][kVec];
#pragma unroll
    for (int k = 0; k < kPrefetch; ++k) {
      const int s = g + k * groups;
      if (active && s < num_splits) load_partial<kVec>(p, s * p.o_partial_stride[0] + pbase, pre[k]);
    }
    const int64_t lbase = b * p.lse_partial_stride[1] + h * p.lse_partial_stride[2] + i * p.lse_partial_stride[3];
    float m = -INFINITY;
    bool nan = false;
    for (int s = tid; s < num_splits; s += kRowThreads) {
      const float l = p.lse_partial[s * p.lse_partial_stride[0] + lbase];
      weight[s] = l;
      if (l != l) nan = true;
      else m = fmaxf(m, l);
    }
    nan = __syncthreads_or(nan);
    m = block_reduce(m, scratch, true);
    const int64_t obase = b * p.out_stride[0] + i * p.out_stride[1] + h * p.out_stride[2];
    float lse_out;
    if (nan || m == INFINITY) {  // uniform over the block, as m and nan are
      lse_out = NAN;
      for (int c = tid; c < d; c += kRowThreads) store_float(p.out, p.dtype, obase + c, NAN);
    } else if (m == -INFINITY) {  // no split saw a key for this row
      lse_out = -INFINITY;
      for (int c = tid; c < d; c += kRowThreads) store_float(p.out, p.dtype, obase + c, 0.f);
    } else {
      float sum = 0.f;
      for (int s = tid; s < num_splits; s += kRowThreads) {
        const float e = expf(weight[s] - m);
        weight[s] = e;
        sum += e;
      }
      sum = block_reduce(sum, scratch, false);  // its barriers also publish weight[]
      lse_out = m + logf(sum);  // sum >= 1: the max's own term is 1
      float acc[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[j] = 0.f;
      // An empty split weighs 0 and its partial output may be anything (NaN): skipped, not multiplied.
#pragma unroll
      for (int k = 0; k < kPrefetch; ++k) {
        const int s = g + k * groups;
        const float w = active && s < num_splits ? weight[s] : 0.f;
        if (w != 0.f) {
#pragma unroll
          for (int j = 0; j < kVec; ++j) acc[j] += w * pre[k][j];
        }
      }
      for (int s0 = g + kPrefetch * groups; active && s0 < num_splits; s0 += kPrefetch * groups) {
        float v[kPrefetch][kVec];
#pragma unroll
        for (int k = 0; k < kPrefetch; ++k) {
          const int s = s0 + k * groups;
          if (s < num_splits) load_partial<kVec>(p, s * p.o_partial_stride[0] + pbase, v[k]);
        }
#pragma unroll
        for (int k = 0; k < kPrefetch; ++k) {
          const int s = s0 + k * groups;
          const float w = s < num_splits ? weight[s] : 0.f;
          if (w != 0.f) {
#pragma unroll
            for (int j = 0; j < kVec; ++j) acc[j] += w * v[k][j];
          }
        }
      }
      if (active) {
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          if (c0 + j < d) column_sums[g * d + c0 + j] = acc[j];
      }
      __syncthreads();
      const float inv = 1.f / sum;
      for (int c = tid; c < d; c += kRowThreads) {
        float v = 0.f;
        for (int gg = 0; gg < groups; ++gg) v += column_sums[gg * d + c];
        store_float(p.out, p.dtype, obase + c, v * inv);
      }
    }
    if (tid == 0 && p.lse != nullptr) p.lse[p.lse_index(b, h, i)] = lse_out;
    __syncthreads();  // weight[] and column_sums are the next row's
  }
}

// 17-32 splits over fp32 partials with 16-byte aligned rows and d <= 128 (a batch-1 decode step: 29 splits
// over 32 rows): a CTA per row as in combine_row_kernel, whose 8 warps each take every 8th split for all the
// row's columns (a lane per 4 columns), but every warp reduces the splits' LSEs itself (a lane per split,
// shuffles) instead of block-wide reductions: one barrier, before the warps' column sums are added, where
// the block reductions take seven. Measured on an H200 (perf-notes s38): 0.2-1.2 us less per 29-split
// decode step, 0.3-0.6 us more at 15 splits, so it starts where some warp has three splits.
constexpr int kRowWarps = 8;
constexpr int kRowWarpsMinSplits = 2 * kRowWarps + 1;
constexpr int kRowWarpsMaxSplits = 32;  // a lane per split's LSE
constexpr int kRowWarpsMaxHeadDim = 128;  // a lane per 4 columns

__global__ void __launch_bounds__(32 * kRowWarps) combine_row_warps_kernel(const CombineParams p) {
  __shared__ float4 column_sums[kRowWarps][32];
  wait_for_primary();
  constexpr int kPerWarp = kRowWarpsMaxSplits / kRowWarps;
  const int64_t rows = p.batch * p.seqlen_q * p.nheads;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_splits = p.num_splits, d = int(p.headdim);
  const bool has_cols = lane * 4 < d;
  const float* partial = static_cast<const float*>(p.o_partial);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t h = row % p.nheads, i = (row / p.nheads) % p.seqlen_q, b = row / (p.nheads * p.seqlen_q);
    const int64_t pbase = b * p.o_partial_stride[1] + i * p.o_partial_stride[2] + h * p.o_partial_stride[3] + lane * 4;
    // This warp's splits' columns, loaded before the LSEs are reduced (a split that saw no key may hold
    // anything: weighed by a select, below).
    float4 v[kPerWarp];
#pragma unroll
    for (int k = 0; k < kPerWarp; ++k) {
      const int s = warp + k * kRowWarps;
      if (s < num_splits && has_cols) v[k] = *reinterpret_cast<const float4*>(partial + s * p.o_partial_stride[0] + pbase);
    }
    const float l = lane < num_splits ? p.lse_partial[lane * p.lse_partial_stride[0] + b * p.lse_partial_stride[1] +
                                                      h * p.lse_partial_stride[2] + i * p.lse_partial_stride[3]]
                                      : -INFINITY;
    const bool nan = __any_sync(0xffffffffu, l != l);
    const float m = warp_max(l);
    const bool finite = !nan && m != INFINITY && m != -INFINITY;  // the same in every warp
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float lse_out = nan || m == INFINITY ? NAN : -INFINITY;  // -inf: no split saw a key for this row
    if (finite) {
      const float w = lane < num_splits ? expf(l - m) : 0.f;
      const float sum = warp_sum(w);
      lse_out = m + logf(sum);  // sum >= 1: the max's own term is 1
      const float inv = 1.f / sum;
#pragma unroll
      for (int k = 0; k < kPerWarp; ++k) {
        const int s = warp + k * kRowWarps;
        const float ws = __shfl_sync(0xffffffffu, w, s) * inv;
        if (s < num_splits && ws != 0.f) add_scaled(acc, ws, v[k]);
      }
    }
    column_sums[warp][lane] = acc;
    __syncthreads();
    if (warp == 0 && has_cols) {
      const int64_t o = b * p.out_stride[0] + i * p.out_stride[1] + h * p.out_stride[2] + lane * 4;
      float4 out = make_float4(0.f, 0.f, 0.f, 0.f);  // an empty row: O = 0
      if (lse_out != lse_out) {
        out = make_float4(NAN, NAN, NAN, NAN);
      } else if (finite) {
#pragma unroll
        for (int w = 0; w < kRowWarps; ++w) {
          const float4 c = column_sums[w][lane];
          out.x += c.x, out.y += c.y, out.z += c.z, out.w += c.w;
        }
      }
      store_float(p.out, p.dtype, o, out.x);
      store_float(p.out, p.dtype, o + 1, out.y);
      store_float(p.out, p.dtype, o + 2, out.z);
      store_float(p.out, p.dtype, o + 3, out.w);
    }
    if (threadIdx.x == 0 && p.lse != nullptr) p.lse[p.lse_index(b, h, i)] = lse_out;
    __syncthreads();  // column_sums is the next row's
  }
}

// The launch, as a programmatic dependent of the kernel before it where `after_primary` asks and
// the device has it (compute capability 9+).
cudaError_t launch(void (*kernel)(const CombineParams), unsigned grid, unsigned block, size_t smem, cudaStream_t st,
                   bool after_primary, const CombineParams& p) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = after_primary ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, p);
}

// Whether the current device has programmatic dependent launch (sm90+): two attribute queries.
bool device_has_pdl() {
  int dev = 0, cc = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return device_props(dev, &cc, nullptr, nullptr, 0) && cc >= 90;
}

}  // namespace

flashattn_status combine(const CombineParams& p, void* stream, bool after_primary) {
  if (p.lse_partial_fp64 != nullptr || p.lse_fp64 != nullptr || p.dtype == FLASHATTN_DTYPE_FP64 ||
      p.partial_dtype == FLASHATTN_DTYPE_FP64)
    return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "dtype: fp64 combines run on host tensors only");
  const int64_t rows = p.batch * p.seqlen_q * p.nheads;
  if (rows == 0) return FLASHATTN_SUCCESS;
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  const bool pdl = after_primary && device_has_pdl();
  cudaError_t e = cudaSuccess;
  const int64_t max_grid = int64_t(1) << 20;
  // float4 loads where every partial row starts 16-byte aligned (split-KV's fp32 partials).
  bool vec4 = p.partial_dtype == FLASHATTN_DTYPE_FP32 && p.headdim % 4 == 0 &&
              reinterpret_cast<uintptr_t>(p.o_partial) % 16 == 0;
  for (int k = 0; k < 4; ++k) vec4 = vec4 && p.o_partial_stride[k] % 4 == 0;
  static_assert(kVecMaxSplits >= kMinSplitsPerRowKernel - 1, "every split count has a vector kernel");
  // The vector warp kernel up to its 8 splits (8 splits x 512 rows, a b 8 decode step with 64
  // query heads: a warp per row beats a 256-thread CTA per row, most of whose threads idle).
  const bool warp_vec4 = vec4 && p.num_splits <= kVecMaxSplits && p.headdim <= kVecMaxHeadDim;
  const bool row_warps = vec4 && p.num_splits >= kRowWarpsMinSplits && p.num_splits <= kRowWarpsMaxSplits &&
                         p.headdim <= kRowWarpsMaxHeadDim;
  if (row_warps) {
    const unsigned grid = unsigned(rows < max_grid ? rows : max_grid);
    e = launch(combine_row_warps_kernel, grid, 32 * kRowWarps, 0, st, pdl, p);
  } else if (!warp_vec4 && p.num_splits >= kMinSplitsPerRowKernel && p.num_splits <= kMaxSplitsPerRowKernel &&
      p.headdim <= kMaxRowKernelHeadDim) {
    const unsigned grid = unsigned(rows < max_grid ? rows : max_grid);
    const size_t smem = size_t(p.num_splits) * sizeof(float);
    e = launch(vec4 ? combine_row_kernel<4> : combine_row_kernel<1>, grid, kRowThreads, smem, st, pdl, p);
  } else {
    const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    const unsigned grid = unsigned(blocks < max_grid ? blocks : max_grid);
    e = launch(warp_vec4 ? combine_warp_vec4_kernel : combine_kernel, grid, 32 * kWarpsPerBlock, 0, st, pdl, p);
  }
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess)
    return set_error(FLASHATTN_ERROR_CUDA, "combine kernel launch: %s", cudaGetErrorString(e));
  return FLASHATTN_SUCCESS;
}

}  // namespace flashattn::cuda
