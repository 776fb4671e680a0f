// The forward kernel's shared memory: the Q buffer(s), the K/V pipeline stages, the O buffer of
// kernels that have one, their barriers and the dynamic scheduler's ring.
#pragma once

#include "kernel/common/config.h"

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "kernel/common/tile_scheduler.h"
#include "kernel/common/utils.h"

namespace flash {

using namespace cute;

// cutlass::PipelineAsync for K/V stages filled with cp.async (paged kernels): each of the producer
// warpgroup's 128 threads arrives once its copies of the stage land. Built like PipelineTmaAsync
// (same Params fields, a cluster shape), so the kernel constructs either the same way.
template <int kStages>
struct CpAsyncPipeline : cutlass::PipelineAsync<kStages> {
  using Base = cutlass::PipelineAsync<kStages>;
  struct Params : Base::Params {
    uint32_t transaction_bytes = 0;  // unused: a stage completes by arrivals
    uint32_t is_leader = 0;          // unused
    uint32_t num_consumers = 0;      // consumer threads
  };
  template <typename ClusterShape>
  CUTLASS_DEVICE CpAsyncPipeline(typename Base::SharedStorage& storage, Params const& params, ClusterShape)
      : Base(storage, counts(params)) {}
  CUTLASS_DEVICE static typename Base::Params counts(Params const& params) {
    typename Base::Params base = params;
    base.producer_arv_count = cutlass::NumThreadsPerWarpGroup;
    base.consumer_arv_count = params.num_consumers;
    return base;
  }
};

template <typename Policy>
struct FwdSmemLayouts {
  using Element = typename Policy::Element;
  static constexpr int kHeadDim = Policy::kHeadDim;
  static constexpr int kHeadDimV = Policy::kHeadDimV;
  static constexpr int kBlockM = Policy::kBlockM;
  static constexpr int kBlockN = Policy::kBlockN;
  static constexpr int kStages = Policy::kStages;

  using SmemAtom = decltype(smem_atom_k_major<Element, kHeadDim>());
  using SmemAtomV = decltype(smem_atom_k_major<Element, kHeadDimV>());
  using SmemAtomO = decltype(smem_atom_k_major<typename Policy::OutElement, kHeadDimV>());
  // Q tiles whose buffer the epilogue reuses for O: atoms in row-major order, so that each
  // warpgroup's 64 rows form one contiguous block laid out like SmemLayoutO64 (with dv != d,
  // narrower); a TMA box then spans 8 rows. Kernels that stage O elsewhere (kSeparateO) or not at
  // all (kDirectO) order Q's atoms as K's, one TMA box per 64 columns.
  static constexpr bool kQHoldsO = !Policy::kSeparateO && !Policy::kDirectO;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{},
                                             std::conditional_t<kQHoldsO, Step<_2, _1>, Step<_1, _2>>{}));
  static constexpr int kHeadDimO = Policy::kHeadDimO;  // O's columns per warpgroup (kSharedRows: half of dv)
  using SmemLayoutO = decltype(tile_to_shape(SmemAtomO{}, Shape<Int<kBlockM>, Int<kHeadDimO>>{}, Step<_2, _1>{}));
  using SmemLayoutO64 = decltype(tile_to_shape(SmemAtomO{}, Shape<_64, Int<kHeadDimO>>{}, Step<_2, _1>{}));
  static_assert(!kQHoldsO || cosize_v<SmemLayoutO> <= cosize_v<SmemLayoutQ>, "O is staged in Q's buffer");
  // kWideV: Qv (M, dv), K-major like Q; and one O slice's columns of a V stage, (N, kHeadDimO) at
  // offset slice * N * kHeadDimO of it (V's atoms are N rows by 64 columns, N fastest), viewed
  // (kHeadDimO, N) as P.V's B operand.
  using SmemLayoutQv = decltype(tile_to_shape(SmemAtomV{}, Shape<Int<kBlockM>, Int<kHeadDimV>>{}, Step<_1, _2>{}));
  using SmemLayoutVtSlice = decltype(composition(
      tile_to_shape(SmemAtomV{}, Shape<Int<kBlockN>, Int<kHeadDimO>>{}),
      make_ordered_layout(Shape<Int<kHeadDimO>, Int<kBlockN>>{}, Step<_2, _1>{})));
  using SmemLayoutKV = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutV = decltype(tile_to_shape(SmemAtomV{}, Shape<Int<kBlockN>, Int<kHeadDimV>, Int<kStages>>{}));
  // (head_dim_v, block_n, stages) view of V: the B operand of P.V.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutV{}, make_ordered_layout(Shape<Int<kHeadDimV>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  // kFp8: V^T (head_dim_v, block_n, stages), keys contiguous: the K-major B operand of the FP8 P.V,
  // written by the producer warpgroup from each landed V stage (fp8.h transpose_v).
  using SmemLayoutVtK = decltype(tile_to_shape(smem_atom_k_major<Element, kBlockN>(),
                                               Shape<Int<kHeadDimV>, Int<kBlockN>, Int<kStages>>{}));
  // K/V stages filled by TMA (one transaction per stage), or (paged) by the producer warpgroup's
  // cp.async, each thread arriving when its copies land.
  using Pipeline = std::conditional_t<Policy::kPaged, CpAsyncPipeline<kStages>, cutlass::PipelineTmaAsync<kStages>>;
};

template <typename Policy>
struct FwdSharedStorage {
  using L = FwdSmemLayouts<Policy>;
  using Element = typename Policy::Element;
  static constexpr bool kSeparateO = Policy::kSeparateO;

  struct NoO {};
  // kSeparateO: the O buffer and a second Q buffer, used by every other tile.
  struct BufferOQ2 {
    alignas(1024) cute::array_aligned<Element, cosize_v<typename L::SmemLayoutQ>> o;
    alignas(1024) cute::array_aligned<Element, cosize_v<typename L::SmemLayoutQ>> q2;
    alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_q2;
    alignas(16) cutlass::arch::ClusterBarrier barrier_q2_empty;
  };
  struct NoRing {};
  // Tiles from the producer to the consumers: kDynamic, tile ids (kRingDecode: decoded tiles);
  // varlen persistent kernels (kCompact), static or dynamic, the walk's tiles with their extents.
  using Ring = TileRing<std::conditional_t<Policy::kCompact, CompactTile, std::conditional_t<Policy::kRingDecode, FwdTile, int>>>;

  alignas(1024) cute::array_aligned<Element, cosize_v<typename L::SmemLayoutQ>> q;  // O reuses it unless kSeparateO
  alignas(1024) cute::array_aligned<Element, cosize_v<typename L::SmemLayoutKV>> k;
  alignas(1024) cute::array_aligned<Element, cosize_v<typename L::SmemLayoutV>> v;
  std::conditional_t<kSeparateO, BufferOQ2, NoO> o;
  struct NoQv {};
  struct BufferQv {  // kWideV: Qv, loaded with Q under barrier_q
    alignas(1024) cute::array_aligned<Element, cosize_v<typename L::SmemLayoutQv>> data;
  };
  [[no_unique_address]] std::conditional_t<Policy::kWideV, BufferQv, NoQv> qv;
  struct NoVt {};
  struct BufferVt {  // kFp8: V^T stages and their pipeline (producer warpgroup -> consumers)
    alignas(1024) cute::array_aligned<Element, cosize_v<typename L::SmemLayoutVtK>> data;
    alignas(16) typename CpAsyncPipeline<Policy::kStages>::SharedStorage pipeline;
  };
  [[no_unique_address]] std::conditional_t<Policy::kFp8, BufferVt, NoVt> vt;
  alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_q;  // Q tile landed
  alignas(16) cutlass::arch::ClusterBarrier barrier_q_empty;       // Q may be overwritten
  alignas(16) typename L::Pipeline::SharedStorage pipeline_k;
  alignas(16) typename L::Pipeline::SharedStorage pipeline_v;
  std::conditional_t<Policy::kRing, Ring, NoRing> ring;

  // Q buffer `slot` (always 0 without a second one) and its barriers.
  CUTLASS_DEVICE Element* q_data(int slot) {
    if constexpr (kSeparateO) { return slot ? o.q2.data() : q.data(); } else { return q.data(); }
  }
  CUTLASS_DEVICE cutlass::arch::ClusterTransactionBarrier& q_full(int slot) {
    if constexpr (kSeparateO) { return slot ? o.barrier_q2 : barrier_q; } else { return barrier_q; }
  }
  CUTLASS_DEVICE cutlass::arch::ClusterBarrier& q_empty(int slot) {
    if constexpr (kSeparateO) { return slot ? o.barrier_q2_empty : barrier_q_empty; } else { return barrier_q_empty; }
  }
  // The O staging buffer of the epilogue: its own, or the Q buffer it no longer reads.
  CUTLASS_DEVICE Element* o_data() {
    if constexpr (kSeparateO) { return o.o.data(); } else { return q.data(); }
  }
};

}  // namespace flash
