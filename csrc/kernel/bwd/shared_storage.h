// The backward kernel's shared memory: Q and dO stages (with their LSE2 and D rows), K and V of
// the CTA's key block, P^T / dS^T, the dQ staging buffer(s), their barriers and the dynamic
// scheduler's ring.
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

template <typename Policy>
struct BwdSmemLayouts {
  using Element = typename Policy::Element;
  static constexpr int kHeadDim = Policy::kHeadDim;
  static constexpr int kBlockM = Policy::kBlockM;
  static constexpr int kBlockN = Policy::kBlockN;
  static constexpr int kStages = Policy::kStages;
  static constexpr bool kDsKMajor = Policy::kDsKMajor;

  // The MN-major views (Q^T, dO^T, K^T) are cut in two along the head dim for dQ (and for
  // dK/dV when the warpgroups split it), so the swizzle must fit half a head dim.
  using SmemAtom = decltype(smem_atom_k_major<Element, kHeadDim / 2>());
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Step<_2, _1>{})));
  // P^T and dS^T: (keys, queries, 2 buffers), queries contiguous.
  using SmemAtomPdS = decltype(smem_atom_k_major<Element, kBlockM>());
  using SmemLayoutPdSt = decltype(tile_to_shape(SmemAtomPdS{}, Shape<Int<kBlockN>, Int<kBlockM>, _2>{}));
  using SmemLayoutdS = decltype(composition(
      SmemLayoutPdSt{}, make_ordered_layout(Shape<Int<kBlockM>, Int<kBlockN>, _2>{}, Step<_2, _1, _3>{})));
  // kDsKMajor: dS (queries, keys, 2), keys contiguous, and its (keys, queries, 2) view for stmatrix.
  using SmemAtomdSK = decltype(smem_atom_k_major<Element, kBlockN>());
  using SmemLayoutdSK = decltype(tile_to_shape(SmemAtomdSK{}, Shape<Int<kBlockM>, Int<kBlockN>, _2>{}));
  using SmemLayoutdStK = decltype(composition(
      SmemLayoutdSK{}, make_ordered_layout(Shape<Int<kBlockN>, Int<kBlockM>, _2>{}, Step<_2, _1, _3>{})));
  static_assert(cosize_v<SmemLayoutdSK> == cosize_v<SmemLayoutPdSt>);
  // The stores' constant offsets rest on whole 1 KB swizzle atoms (8 query rows of 64 keys): a
  // warp's stores sit 16 query rows apart, and a buffer is kBlockM * 256 bytes.
  static_assert(!kDsKMajor || std::is_same_v<SmemAtomdSK, GMMA::Layout_K_SW128_Atom<Element>>);

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
};

template <typename Policy, int kDqBuffers>
struct BwdStorage {
  using L = BwdSmemLayouts<Policy>;
  using Element = typename Policy::Element;
  static constexpr int kBlockM = Policy::kBlockM;
  static constexpr int kHeadDim = Policy::kHeadDim;
  static constexpr int kStages = Policy::kStages;

  // P^T and dS^T buffers (SS), or dS alone (RS).
  struct SmemSS {
    alignas(1024) cute::array_aligned<Element, cosize_v<typename L::SmemLayoutPdSt>> pt;
    alignas(1024) cute::array_aligned<Element, cosize_v<typename L::SmemLayoutPdSt>> dst;
  };
  struct SmemRS {
    alignas(1024) cute::array_aligned<Element, cosize_v<typename L::SmemLayoutPdSt>> dst;
  };
  struct SmemDq {
    alignas(1024) cute::array_aligned<float, kDqBuffers * kBlockM * kHeadDim> dq;
  };
  struct NoRing {};
  // kDynamic: tile ids from the producer to the consumers and the dQ reducer.
  using Ring = TileRing<int>;

  alignas(1024) cute::array_aligned<Element, cosize_v<typename L::SmemLayoutQ>> q;
  alignas(1024) cute::array_aligned<Element, cosize_v<typename L::SmemLayoutQ>> dout;
  alignas(1024) cute::array_aligned<Element, cosize_v<typename L::SmemLayoutK>> k;
  alignas(1024) cute::array_aligned<Element, cosize_v<typename L::SmemLayoutK>> v;
  std::conditional_t<Policy::kRS, SmemRS, SmemSS> pds;
  SmemDq dq;
  alignas(16) float lse2[kStages][kBlockM];
  alignas(16) float dsum[kStages][kBlockM];
  alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_kv;
  alignas(16) cutlass::arch::ClusterBarrier barrier_kv_empty;  // persistent: consumers done with K, V
  std::conditional_t<Policy::kDynamic, Ring, NoRing> ring;
  alignas(16) typename L::Pipeline::SharedStorage pipeline_qdo;
  alignas(16) typename L::Pipeline::SharedStorage pipeline_do;  // kSplitQdO: dO and D (Q and LSE in pipeline_qdo)
};

// Two dQ staging buffers where they fit, else one (kDqPerWG: one buffer, whose two halves take
// the barrier ids of two buffers).
template <typename Policy>
struct BwdSmem {
  static constexpr int kSmemLimit = 227 * 1024;
  static constexpr int kDqStages = Policy::kDqPerWG ? 1 : (sizeof(BwdStorage<Policy, 2>) <= kSmemLimit ? 2 : 1);
  using SharedStorage = BwdStorage<Policy, kDqStages>;
  static_assert(sizeof(SharedStorage) <= kSmemLimit,
                "backward tile (with a dQ staging buffer) does not fit in shared memory: fewer Q/dO stages");
};

}  // namespace flash
