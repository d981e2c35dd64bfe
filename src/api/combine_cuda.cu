// The CUDA combine of partial attention results (common/combine_params.h): flashattn_combine on
// device tensors, and the GPU paths' split-KV, which launch it on their fp32 partials.
// One warp per (batch, row, head): the lanes reduce the S LSEs (max, then the sum of exp), then
// each lane accumulates its columns over the splits in fp32. Splits whose LSE is -inf weigh 0 and
// their partial output is not read; a NaN or +inf LSE makes the row NaN (as the host path).
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

}  // namespace

flashattn_status combine(const CombineParams& p, void* stream) {
  if (p.lse_partial_fp64 != nullptr || p.lse_fp64 != nullptr || p.dtype == FLASHATTN_DTYPE_FP64 ||
      p.partial_dtype == FLASHATTN_DTYPE_FP64)
    return set_error(FLASHATTN_ERROR_NOT_SUPPORTED, "dtype: fp64 combines run on host tensors only");
  const int64_t rows = p.batch * p.seqlen_q * p.nheads;
  if (rows == 0) return FLASHATTN_SUCCESS;
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const unsigned grid = unsigned(blocks < (int64_t(1) << 20) ? blocks : (int64_t(1) << 20));
  combine_kernel<<<grid, 32 * kWarpsPerBlock, 0, static_cast<cudaStream_t>(stream)>>>(p);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return set_error(FLASHATTN_ERROR_CUDA, "combine kernel launch: %s", cudaGetErrorString(e));
  return FLASHATTN_SUCCESS;
}

}  // namespace flashattn::cuda
