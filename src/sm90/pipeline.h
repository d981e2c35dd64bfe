// The s-stage circular smem buffers between the producer and the consumer warpgroups.
// Each stage has a full/empty mbarrier pair with phase bits (CUTLASS PipelineTmaAsync):
//   producer: producer_acquire(state) waits "empty", arms "full" with the TMA byte count;
//             the TMA copy completes the transaction on "full".
//   consumer: consumer_wait(state) waits "full"; consumer_release(state) arrives on "empty"
//             (every consumer thread arrives: the count is kNumMmaThreads with cluster size 1).
// Q is a pipeline of its own (1 or 2 stages, tile_shapes.h), released when the tile's last
// Q K^T GEMM is done, so a persistent CTA loads the next tile's Q while the current tile
// finishes; with 2 stages the load starts a whole tile ahead.
#pragma once

#include <cutlass/pipeline/sm90_pipeline.hpp>

namespace flashattn::sm90 {

template <class Traits>
struct Pipelines {
  using KV = cutlass::PipelineTmaAsync<Traits::kStages>;
  using Q = cutlass::PipelineTmaAsync<Traits::kStagesQ>;
  using KVState = cutlass::PipelineState<Traits::kStages>;
  using QState = cutlass::PipelineState<Traits::kStagesQ>;

  struct SharedStorage {
    typename Q::SharedStorage q;
    typename KV::SharedStorage k;
    typename KV::SharedStorage v;
  };

  // Every thread constructs the pipeline objects; warp 0 initializes the barriers.
  // Warpgroup 0 is the producer (thread 0 issues everything), the others consume.
  template <class P>
  static __device__ P make(typename P::SharedStorage& storage, uint32_t tx_bytes) {
    typename P::Params params;
    params.transaction_bytes = tx_bytes;
    const int wg = int(threadIdx.x) / 128;
    params.role = wg == 0 ? P::ThreadCategory::Producer : P::ThreadCategory::Consumer;
    params.is_leader = threadIdx.x == 0;
    params.num_consumers = Traits::kNumMmaThreads;
    return P(storage, params, cute::Shape<cute::_1, cute::_1, cute::_1>{});
  }
};

}  // namespace flashattn::sm90
