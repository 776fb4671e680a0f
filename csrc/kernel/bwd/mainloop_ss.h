// The backward step loop of the SS path (hdim 192 / 256: 64 keys per CTA): the two consumer
// warpgroups split the queries for S^T / dP^T and the head dim for dK / dV, so P^T and dS^T go
// through shared memory. With one Q/dO stage (kSplitQdO) the GEMMs run dK, dV, dQ so that each
// stage is released as soon as its last reader is done [D:041].
#pragma once

#include "kernel/common/config.h"

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>

#include "kernel/bwd/mainloop.h"
#include "kernel/common/named_barriers.h"
#include "kernel/common/utils.h"

namespace flash {

using namespace cute;

template <typename Policy>
template <typename Params, typename Seq, typename DqReducer, typename Epilogue>
CUTLASS_DEVICE void BwdMainloop<Policy>::mma_ss(Params const& params, Seq const& seq, SharedStorage& smem,
                                                Pipeline& pipeline, Pipeline& pipeline_do, PipelineState& state,
                                                BwdProgress const& progress, Range const& range, int num_steps,
                                                int n_block, int head_kv, int batch, int mma_tidx,
                                                DqReducer const& dq, Epilogue const& epilogue) const {
  TiledMmaSdP mma_sdp;
  TiledMmadKV mma_dkv;
  TiledMmadQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(mma_tidx);
  int const wg_thread = warpgroup_first_thread(mma_tidx);  // operands: uniform descriptors
  auto wg_sdp = mma_sdp.get_thread_slice(wg_thread);
  auto wg_dkv = mma_dkv.get_thread_slice(wg_thread);
  auto wg_dq = mma_dq.get_thread_slice(wg_thread);

  auto [sQ, sQt, sdO, sdOt, sK, sKt, sV, sdSt, sdS] = smem_views(smem);
  Tensor sPt = make_tensor(make_smem_ptr(smem.pds.pt.data()), SmemLayoutPdSt{});  // (N, M, 2)

  // Operand descriptors.
  Tensor tSrK = wg_sdp.partition_fragment_A(sK);
  Tensor tSrV = wg_sdp.partition_fragment_A(sV);
  Tensor tSrQ = wg_sdp.partition_fragment_B(sQ);     // (..., stages)
  Tensor tSrdO = wg_sdp.partition_fragment_B(sdO);
  Tensor tdVrPt = wg_dkv.partition_fragment_A(sPt);  // (..., 2)
  Tensor tdKrdSt = wg_dkv.partition_fragment_A(sdSt);
  Tensor tdVrdOt = wg_dkv.partition_fragment_B(sdOt);  // (..., stages)
  Tensor tdKrQt = wg_dkv.partition_fragment_B(sQt);
  Tensor tdQrdS = wg_dq.partition_fragment_A(sdS);   // (..., 2)
  Tensor tdQrKt = wg_dq.partition_fragment_B(sKt);

  // Accumulators.
  Tensor tdVrdV = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  Tensor tdKrdK = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  clear(tdVrdV);
  clear(tdKrdK);

  // (key, query) coordinates of this thread's S^T elements, as (rows, cols).
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{}));
  Tensor tScS_rc = make_tensor(tScS.data(), acc_layout_rowcol(tScS.layout()));
  constexpr int kCols = decltype(size<1>(tScS_rc))::value;

  auto smem_copy_pds = make_tiled_copy_C(Copy_Atom<DefaultCopy, Element>{}, mma_sdp);
  auto smem_thr_copy_pds = smem_copy_pds.get_thread_slice(mma_tidx);
  Tensor tPsPt = smem_thr_copy_pds.partition_D(sPt);    // (CPY, CPY_N, CPY_M, 2)
  Tensor tPsdSt = smem_thr_copy_pds.partition_D(sdSt);

  int const n0 = n_block * kBlockN;
  if (num_steps > 0) { smem.barrier_kv.wait(progress.kv_loads & 1); }

  Walk walk(params, range, n_block);
  for (int step = 0; step < num_steps; ++step, walk.advance()) {
    int const m_block = walk.m_block;
    int const m0 = m_block * kBlockM;
    int const buf = (progress.steps + step) & 1;

    pipeline.consumer_wait(state);
    Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
    Tensor tSrdP = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
    wgmma_async</*kZeroInit=*/true>(mma_sdp, tSrK, tSrQ(_, _, _, state.index()), tSrS);
    if constexpr (kSplitQdO) { pipeline_do.consumer_wait(state); }
    wgmma_async</*kZeroInit=*/true>(mma_sdp, tSrV, tSrdO(_, _, _, state.index()), tSrdP);

    // Per-query LSE (log2 domain) and D for this thread's columns, read while the GEMMs run.
    float lse2[kCols];
    float dsum[kCols];
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < kCols; ++c) {
      int const query = get<1>(tScS_rc(0, c));
      lse2[c] = smem.lse2[state.index()][query];
      dsum[c] = smem.dsum[state.index()][query];
    }

    Tensor tSrS_rc = make_tensor(tSrS.data(), acc_layout_rowcol(tSrS.layout()));
    Tensor tSrdP_rc = make_tensor(tSrdP.data(), acc_layout_rowcol(tSrdP.layout()));
    warpgroup_wait<1>();  // S^T ready
    Tensor dtanh = make_tensor<SoftcapDerivative>(shape(tSrS_rc));  // kSoftcap: as in mma_rs
    if constexpr (kSoftcap) { cap_scores(tSrS_rc, dtanh, params.softcap_prescale); }
    bool const needs_mask = block_needs_mask(m0, n0, params, seq);
    StepMask const step_mask(params, seq, n0, m0);
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < size<0>(tSrS_rc); ++r) {
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < kCols; ++c) {
        float s = tSrS_rc(r, c) * params.softmax_scale_log2 - lse2[c];
        if (needs_mask && step_mask.hides(get<0>(tScS_rc(r, c)), get<1>(tScS_rc(r, c)))) { s = -INFINITY; }
        tSrS_rc(r, c) = exp2f(s);  // P^T
      }
    }
    warpgroup_wait<0>();  // dP^T ready
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < size<0>(tSrdP_rc); ++r) {
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < kCols; ++c) {
        tSrdP_rc(r, c) = tSrS_rc(r, c) * (tSrdP_rc(r, c) - dsum[c]);  // dS^T
        if constexpr (kSoftcap) { tSrdP_rc(r, c) *= float(dtanh(r, c)); }
      }
    }

    // P^T and dS^T to shared memory: the next GEMMs read them from both warpgroups.
    Tensor tPrP = make_tensor<Element>(tSrS.layout());
    Tensor tPrdS = make_tensor<Element>(tSrdP.layout());
    convert_into(tSrS, tPrP);
    convert_into(tSrdP, tPrdS);
    copy(smem_copy_pds, smem_thr_copy_pds.retile_S(tPrP), tPsPt(_, _, _, buf));
    copy(smem_copy_pds, smem_thr_copy_pds.retile_S(tPrdS), tPsdSt(_, _, _, buf));
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(kNumMmaThreads, static_cast<int>(BwdNamedBarrier::kPdSReady));

    Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
    if constexpr (kSplitQdO) {
      wgmma_async</*kZeroInit=*/false>(mma_dkv, tdKrdSt(_, _, _, buf), tdKrQt(_, _, _, state.index()), tdKrdK);
      wgmma_async</*kZeroInit=*/false>(mma_dkv, tdVrPt(_, _, _, buf), tdVrdOt(_, _, _, state.index()), tdVrdV);
      wgmma_async</*kZeroInit=*/true>(mma_dq, tdQrdS(_, _, _, buf), tdQrKt, tdQrdQ);
      warpgroup_wait<2>();  // dK done: Q's stage is free
      pipeline.consumer_release(state);
      warpgroup_wait<1>();  // dV done: dO's stage is free
      pipeline_do.consumer_release(state);
      warpgroup_wait<0>();
    } else {
      wgmma_async</*kZeroInit=*/false>(mma_dkv, tdVrPt(_, _, _, buf), tdVrdOt(_, _, _, state.index()), tdVrdV);
      wgmma_async</*kZeroInit=*/false>(mma_dkv, tdKrdSt(_, _, _, buf), tdKrQt(_, _, _, state.index()), tdKrdK);
      wgmma_async</*kZeroInit=*/true>(mma_dq, tdQrdS(_, _, _, buf), tdQrKt, tdQrdQ);
      warpgroup_wait<0>();
      pipeline.consumer_release(state);
    }
    ++state;

    dq.stage(smem, tdQrdQ, progress.steps + step, mma_tidx);
  }
  // Persistent: K and V are free for the next tile once the last step's GEMMs are done.
  if (kPersistent && num_steps > 0) { smem.barrier_kv_empty.arrive(); }
  epilogue.store(params, seq, mma_dkv, tdKrdK, tdVrdV, n_block, head_kv, batch, mma_tidx);
}

}  // namespace flash
