// The FP8 forward's producer (FwdPolicy::kFp8): FwdMainloop::load_fp8, the TMA loads plus V's
// transpose in shared memory (fp8.h) by the producer warpgroup.
#pragma once

#include "kernel/common/config.h"

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "kernel/fwd/fp8.h"
#include "kernel/fwd/mainloop.h"
#include "kernel/fwd/paged_kv.h"

namespace flash {

using namespace cute;

// load() of FP8 kernels, by every thread of the producer warpgroup: one thread issues the TMA loads
// (paged caches: all gather K/V rows with cp.async); all transpose each V stage once it lands, one V
// block behind its load (two with three stages; its latency hides behind the next loads), and hand
// V^T to the consumers through pipeline_vt.
template <typename Policy>
template <typename Params, typename Seq, typename PipelineVt>
CUTLASS_DEVICE void FwdMainloop<Policy>::load_fp8(Params const& params, Seq const& seq, SharedStorage& smem,
                                                  Pipeline& pipeline_k, Pipeline& pipeline_v, PipelineVt& pipeline_vt,
                                                  int& blocks, FwdTile const& t,
                                                  BlockRange<kBlockM, kBlockN, kLocal> const& range,
                                                  int q_empty_phase, int q_slot) const {
  int const tid = threadIdx.x % cutlass::NumThreadsPerWarpGroup;
  bool const leader = tid == 0;
  auto [tQgQ, tQsQ, tKgK, tKsK, tVgV, tVsV] = tma_slices(params, seq, smem, t, q_slot);
  // kPaged: K/V gathered by all threads (paged_kv.h), each arriving when its copies land.
  auto paged = [&] {
    if constexpr (Policy::kPaged) {
      return PagedKVLoader<Element, kBlockN, kHeadDim>(params.paged, t.batch, seq.offset_k(params),
                                                      seq.seqlen_k(params), tid);
    } else {
      return NoPagedKV{};
    }
  }();
  int const head_kv = t.head / params.q_heads_per_kv_head;

  using LayoutV1 = decltype(take<0, 2>(SmemLayoutV{}));
  using LayoutVt1 = decltype(take<0, 2>(typename Layouts::SmemLayoutVtK{}));
  constexpr int kStageV = kBlockN * kHeadDimV;  // elements (bytes) per stage of either buffer
  auto transpose = [&](int c) {  // V of the producer's block c
    pipeline_v.consumer_wait(fp8_state(c, false));
    if (leader) { FLASH_TRACE(0, kVLanded); }
    pipeline_vt.producer_acquire(fp8_state(c, true));
    if (leader) { FLASH_TRACE(0, kVtFree); }
    int const stage = fp8_state(c, false).index();
    transpose_v<kBlockN, kHeadDimV, LayoutV1, LayoutVt1>(smem.v.data() + stage * kStageV,
                                                         smem.vt.data.data() + stage * kStageV, tid);
    cutlass::arch::fence_view_async_shared();  // V^T, written by the generic proxy, read by WGMMA
    pipeline_vt.producer_commit(fp8_state(c, true));
    if (leader) { FLASH_TRACE(0, kTDone); }
    pipeline_v.consumer_release(fp8_state(c, false));  // every thread's arrival: this thread read its share
  };
  // Block n's K and V into the stage of the producer's block `blocks` (then the next).
  auto load = [&](int n) {
    PipelineState const state = fp8_state(blocks, true);
    if constexpr (Policy::kPaged) {
      pipeline_v.producer_acquire(state);
      paged.template load<false>(n, head_kv, make_tensor(make_smem_ptr(smem.v.data()), SmemLayoutV{})(_, _, state.index()));
      pipeline_v.producer_commit(state, cutlass::arch::cpasync_barrier_arrive);
      pipeline_k.producer_acquire(state);
      paged.template load<true>(n, head_kv, make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutKV{})(_, _, state.index()));
      pipeline_k.producer_commit(state, cutlass::arch::cpasync_barrier_arrive);
    } else if (leader) {
      pipeline_v.producer_acquire(state);
      copy(params.tma_v.with(*pipeline_v.producer_get_barrier(state)), tVgV(_, n), tVsV(_, state.index()));
      pipeline_k.producer_acquire(state);
      copy(params.tma_k.with(*pipeline_k.producer_get_barrier(state)), tKgK(_, n), tKsK(_, state.index()));
      FLASH_TRACE(0, kLoad);
    }
    ++blocks;
  };
  // FA3's order: V(n) and K(n) issued together, then V(n + kAhead) transposed. K(n)'s stage frees when
  // S(n + 2) is done, a block before the consumers need V(n + 1)^T (with S(n), for P(n + 1).V(n + 1)).
  // With three or more stages the loads run two blocks ahead of the transpose (its wait for a landed V
  // no longer holds back the next block's loads); with two, V(n)'s stage is V(n + 2)'s, so one.
  constexpr int kAhead = Policy::kStages >= 3 ? 2 : 1;
  int n = range.n_block_max - 1;
  load(n);
  if (leader) {
    if (q_empty_phase >= 0) { smem.q_empty(q_slot).wait(q_empty_phase); }
    smem.q_full(q_slot).arrive_and_expect_tx(kBytesQ);
    copy(params.tma_q.with(reinterpret_cast<uint64_t&>(smem.q_full(q_slot))), tQgQ, tQsQ);
    FLASH_TRACE(0, kQ);
  }
  int pending = 1;  // blocks loaded, V not yet transposed (the oldest is blocks - pending)
  for (--n; n >= range.n_block_min; --n) {
    load(n);
    if (++pending > kAhead) {
      transpose(blocks - pending);  // V(n + kAhead)
      --pending;
    }
  }
  for (; pending > 0; --pending) { transpose(blocks - pending); }  // the tile's last Vs
}

}  // namespace flash
