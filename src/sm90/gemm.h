// One warpgroup GEMM issued asynchronously (WGMMA), shared by the forward and the backward.
#pragma once

#include <cute/tensor.hpp>

namespace flashattn::sm90 {

// Issue one warpgroup GEMM (all K slices) as one async batch; the caller waits with
// warpgroup_wait<N>. Operand fences keep the compiler from moving register accesses of the
// accumulator (and of P for the RS GEMM) across the asynchronous region.
template <bool kZeroInit, class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void gemm_async(TiledMma& mma, TA const& a, TB const& b, TC& c) {
  using namespace cute;
  constexpr bool kRS = !is_base_of<GMMA::DescriptorIterator, typename TiledMma::FrgTypeA>::value;
  if constexpr (kRS) warpgroup_fence_operand(const_cast<TA&>(a));
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
#pragma unroll
  for (int k = 0; k < size<2>(a); ++k) {
    gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
  if constexpr (kRS) warpgroup_fence_operand(const_cast<TA&>(a));
}

}  // namespace flashattn::sm90
