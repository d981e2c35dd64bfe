// The s-stage circular smem buffers between the producer and the consumer warpgroups.
// Each stage has a full/empty mbarrier pair with phase bits (CUTLASS PipelineTmaAsync):
//   producer: producer_acquire(state) waits "empty", arms "full" with the TMA byte count;
//             the TMA copy completes the transaction on "full".
//   consumer: consumer_wait(state) waits "full"; consumer_release(state) arrives on "empty"
//             (every consumer thread arrives: the count is kNumMmaThreads with cluster size 1).
// Q is a pipeline of its own (1 or 2 stages, tile_shapes.h), released when the tile's last
// Q K^T GEMM is done, so a persistent CTA loads the next tile's Q while the current tile
// finishes; with 2 stages the load starts a whole tile ahead.
// FP8 adds a fourth pipeline: V's TMA loads are consumed by the threads that transpose them,
// which produce the transposed V the consumers read (tile_shapes.h says why).
#pragma once

#include <type_traits>

#include <cutlass/pipeline/sm90_pipeline.hpp>

namespace flashattn::sm90 {

template <class Traits>
struct Pipelines {
  using KV = cutlass::PipelineTmaAsync<Traits::kStages>;
  using Q = cutlass::PipelineTmaAsync<Traits::kStagesQ>;
  using KVState = cutlass::PipelineState<Traits::kStages>;
  using QState = cutlass::PipelineState<Traits::kStagesQ>;
  // FP8 only: the transposed V (producer.h VTransposer -> consumers), arrive-count barriers.
  using Vt = cutlass::PipelineAsync<Traits::kStages>;
  // What the consumers read V through: the TMA pipeline, or for FP8 the transposed copy's.
  using VRead = std::conditional_t<Traits::kTransposeV, Vt, KV>;

  struct NoStorage {};
  struct SharedStorage {
    typename Q::SharedStorage q;
    typename KV::SharedStorage k;
    typename KV::SharedStorage v;  // V's TMA loads
    std::conditional_t<Traits::kTransposeV, typename Vt::SharedStorage, NoStorage> vt;
  };

  // Every thread constructs the pipeline objects; warp 0 initializes the barriers.
  // Warpgroup 0 is the producer (thread 0 issues every TMA load); the consumers of a TMA
  // pipeline are the consumer warpgroups, or for FP8's V loads the transposing threads.
  // producer_consumes: warpgroup 0 also consumes (FP8's V loads, read by its transposing warps).
  template <class P>
  static __device__ P make(typename P::SharedStorage& storage, uint32_t tx_bytes,
                           int num_consumers = Traits::kNumMmaThreads, bool producer_consumes = false) {
    typename P::Params params;
    params.transaction_bytes = tx_bytes;
    const int wg = int(threadIdx.x) / 128;
    params.role = wg > 0 ? P::ThreadCategory::Consumer
                         : (producer_consumes ? P::ThreadCategory::ProducerConsumer : P::ThreadCategory::Producer);
    params.is_leader = threadIdx.x == 0;
    params.num_consumers = uint32_t(num_consumers);
    return P(storage, params, cute::Shape<cute::_1, cute::_1, cute::_1>{});
  }
  // V's TMA pipeline: consumed by the consumers, or for FP8 by the transposing threads.
  static __device__ KV make_v(SharedStorage& s) {
    return make<KV>(s.v, Traits::kBytesKV, Traits::kTransposeV ? Traits::kNumTransposeThreads : Traits::kNumMmaThreads,
                    Traits::kTransposeV);
  }
  // FP8: the transposed V, produced by the transposing threads, consumed by the consumers.
  static __device__ Vt make_vt(SharedStorage& s) {
    static_assert(Traits::kTransposeV);
    typename Vt::Params params;
    const int wg = int(threadIdx.x) / 128;
    params.role = wg == 0 ? Vt::ThreadCategory::Producer : Vt::ThreadCategory::Consumer;
    params.producer_arv_count = Traits::kNumTransposeThreads;
    params.consumer_arv_count = Traits::kNumMmaThreads;
    return Vt(s.vt, params);
  }
};

}  // namespace flashattn::sm90
