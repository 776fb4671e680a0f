// The backward step loop of the RS path (hdim <= 128, 128 keys per CTA): consumer warpgroup w
// owns keys [64 w, 64 w + 64) for S^T, dP^T, dV and dK, so P^T and dS^T go from the S^T / dP^T
// accumulators straight into the A operand of the dV / dK WGMMAs; only dS goes to shared memory,
// for dQ [D:030].
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
CUTLASS_DEVICE void BwdMainloop<Policy>::mma_rs(Params const& params, Seq const& seq, SharedStorage& smem,
                                                Pipeline& pipeline, PipelineState& state,
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

  Tensor tSrK = wg_sdp.partition_fragment_A(sK);  // descriptors
  Tensor tSrV = wg_sdp.partition_fragment_A(sV);
  Tensor tSrQ = wg_sdp.partition_fragment_B(sQ);       // (..., stages)
  Tensor tSrdO = wg_sdp.partition_fragment_B(sdO);
  Tensor tdVrdOt = wg_dkv.partition_fragment_B(sdOt);  // (..., stages)
  Tensor tdKrQt = wg_dkv.partition_fragment_B(sQt);
  // dQ's operands: A = dS (..., 2 buffers), B = K^T.
  Tensor tdQrA = wg_dq.partition_fragment_A(sdS);
  Tensor tdQrB = wg_dq.partition_fragment_B(sKt);

  Tensor tdVrdV = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  Tensor tdKrdK = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  clear(tdVrdV);
  clear(tdKrdK);

  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{}));
  Tensor tScS_rc = make_tensor(tScS.data(), acc_layout_rowcol(tScS.layout()));
  constexpr int kCols = decltype(size<1>(tScS_rc))::value;

  // dS^T to shared memory with stmatrix (rows = keys, 16-byte runs of queries).
  auto smem_copy_ds = make_tiled_copy_C(
      Copy_Atom<std::conditional_t<kDsKMajor, SM90_U16x8_STSM_T, SM90_U32x4_STSM_N>, Element>{}, mma_sdp);
  auto smem_thr_copy_ds = smem_copy_ds.get_thread_slice(mma_tidx);
  Tensor tdSsdSt = smem_thr_copy_ds.partition_D(sdSt);  // (CPY, CPY_N, CPY_M, 2)
  // kDsKMajor: one stmatrix per (atom repeat, copy n, copy m); this thread's first row address
  // in buffer 0, plus per-store offsets taken from thread 0's layout (whole swizzle periods apart,
  // so the same for every thread), plus the buffer.
  static_assert(decltype(rank<0>(tdSsdSt))::value == 2 || !kDsKMajor);
  constexpr int kDsAtoms = kDsKMajor ? decltype(size<0, 1>(tdSsdSt))::value : 1;
  constexpr int kDsCopyN = decltype(size<1>(tdSsdSt))::value;
  constexpr int kDsCopies = kDsAtoms * kDsCopyN * decltype(size<2>(tdSsdSt))::value;
  [[maybe_unused]] uint32_t ds_base = 0;
  if constexpr (kDsKMajor) {
    ds_base = cute::cast_smem_ptr_to_uint(raw_pointer_cast(&tdSsdSt(make_coord(0, 0), 0, 0, 0)));
  }
  // Store i's (atom repeat, copy n, copy m), and its byte offset from store 0 (a constant).
  auto ds_store = [](auto i) {
    constexpr int k = decltype(i)::value;
    return make_coord(Int<k % kDsAtoms>{}, Int<(k / kDsAtoms) % kDsCopyN>{}, Int<k / (kDsAtoms * kDsCopyN)>{});
  };
  auto ds_offset = [&](auto store) {
    Tensor t0 = smem_copy_ds.get_thread_slice(0).partition_D(sdSt);
    int const off = int(t0.layout()(make_coord(make_coord(_0{}, get<0>(store)), get<1>(store), get<2>(store), _0{}))) -
                    int(t0.layout()(make_coord(make_coord(_0{}, _0{}), _0{}, _0{}, _0{})));
    return uint32_t(off * int(sizeof(Element)));
  };

  int const n0 = n_block * kBlockN;
  if (num_steps > 0) { smem.barrier_kv.wait(progress.kv_loads & 1); }

  // One step; masked: std::true_type where the step's block crosses the diagonal or a window
  // edge, std::false_type where it does not, or a bool decided at run time. kSplitSteps
  // (causal/local): the steps run in alternating masked / unmasked loops, so that the unmasked
  // steps carry no mask code (as the forward's split key-block loop); otherwise every
  // causal/local step tests its block at run time.
  auto step_body = [&](int step, int m_block, auto masked) CUTLASS_LAMBDA_FUNC_INLINE {
    int const m0 = m_block * kBlockM;
    int const buf = (progress.steps + step) & 1;
    int const stage = state.index();
    bool mask_on;  // a compile-time constant where masked is std::true_type / std::false_type
    if constexpr (std::is_same_v<decltype(masked), bool>) {
      mask_on = masked;
    } else {
      mask_on = decltype(masked)::value;
    }

    pipeline.consumer_wait(state);
    Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
    Tensor tSrdP = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
    wgmma_async</*kZeroInit=*/true>(mma_sdp, tSrK, tSrQ(_, _, _, stage), tSrS);
    wgmma_async</*kZeroInit=*/true>(mma_sdp, tSrV, tSrdO(_, _, _, stage), tSrdP);

    Tensor tSrS_rc = make_tensor(tSrS.data(), acc_layout_rowcol(tSrS.layout()));
    Tensor tSrdP_rc = make_tensor(tSrdP.data(), acc_layout_rowcol(tSrdP.layout()));
    warpgroup_wait<1>();  // S^T ready
    // kSoftcap: S^T capped before any mask, and the cap's derivative kept for dS^T (taken before
    // the mask writes -inf, whose derivative would be -inf against P^T = 0).
    Tensor dtanh = make_tensor<SoftcapDerivative>(shape(tSrS_rc));  // kSoftcap only (unused registers otherwise)
    if constexpr (kSoftcap) { cap_scores(tSrS_rc, dtanh, params.softcap_prescale); }
    StepMask const step_mask(params, seq, n0, m0);
    // Where the step decides at run time, the mask writes -inf into S^T in a loop of its own
    // under a uniform branch, so that unmasked steps skip it (-inf * scale - lse2 is -inf: lse2
    // is +inf, never -inf, for rows that see nothing). A select per element fused into the exp
    // loop was if-converted into every step (~96 of 633 instructions per step at hdim 128) [D:042].
    constexpr bool kPrepass = std::is_same_v<decltype(masked), bool>;
    if constexpr (kPrepass) {
      if (mask_on) {
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < kCols; ++c) {
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < size<0>(tSrS_rc); ++r) {
            if (step_mask.hides(get<0>(tScS_rc(r, c)), get<1>(tScS_rc(0, c)))) { tSrS_rc(r, c) = -INFINITY; }
          }
        }
      }
    }
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < kCols; ++c) {
      int const query = get<1>(tScS_rc(0, c));
      float const lse2 = smem.lse2[stage][query];
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < size<0>(tSrS_rc); ++r) {
        float s = tSrS_rc(r, c) * params.softmax_scale_log2 - lse2;
        if (!kPrepass && mask_on && step_mask.hides(get<0>(tScS_rc(r, c)), query)) { s = -INFINITY; }
        tSrS_rc(r, c) = exp2f(s);  // P^T
      }
    }
    // dV += P^T . dO with P^T from registers; it runs while dS^T is computed, or (kDvAfterDs)
    // while dS^T is written and the warpgroups meet before dQ, or (kDvSplit) its first
    // kDvFirstKBlocks K blocks while dS^T is computed and the rest from there.
    Tensor tdVrP = make_tensor<Element>(acc_layout_as_a_operand(tSrS.layout()));
    Tensor tSrS_a = make_tensor(tSrS.data(), acc_layout_as_a_operand(tSrS.layout()));  // kLateP16
    [[maybe_unused]] constexpr int kDvKBlocks = decltype(size<2>(tdVrP))::value;
    if constexpr (!kLateP16) {
      convert_into(tSrS, tdVrP);
    } else if constexpr (kDvSplit) {
      convert_k_blocks<0, kDvFirstKBlocks>(tSrS_a, tdVrP);
    }
    if constexpr (!kDvAfterDs) { wgmma_async</*kZeroInit=*/false>(mma_dkv, tdVrP, tdVrdOt(_, _, _, stage), tdVrdV); }
    if constexpr (kDvSplit) {
      wgmma_async_k_range<0, kDvFirstKBlocks, /*kZeroInit=*/false>(mma_dkv, tdVrP, tdVrdOt(_, _, _, stage), tdVrdV);
    }

    warpgroup_wait<(kDvAfterDs && !kDvSplit) ? 0 : 1>();  // dP^T ready (the dV GEMM, or its first half, may still run)
    // dS^T = P^T (dP^T - D) [* (1 - T^2)], with P^T in float32.
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < kCols; ++c) {
      float const dsum = smem.dsum[stage][get<1>(tScS_rc(0, c))];
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < size<0>(tSrdP_rc); ++r) {
        tSrdP_rc(r, c) = tSrS_rc(r, c) * (tSrdP_rc(r, c) - dsum);
        if constexpr (kSoftcap) { tSrdP_rc(r, c) *= float(dtanh(r, c)); }
      }
    }
    if constexpr (kLateP16) { convert_k_blocks<kDvSplit ? kDvFirstKBlocks : 0, kDvKBlocks>(tSrS_a, tdVrP); }
    Tensor tdKrdS = make_tensor<Element>(acc_layout_as_a_operand(tSrdP.layout()));
    convert_into(tSrdP, tdKrdS);

    // dS^T (both warpgroups' keys) to shared memory for dQ = dS . K.
    Tensor tdSrdS = make_tensor(tdKrdS.data(), tSrdP.layout());  // the same registers, C layout
    if constexpr (kDsKMajor) {
      Tensor src = smem_thr_copy_ds.retile_S(tdSrdS);  // ((8 values, atoms), CPY_N, CPY_M)
      uint32_t const buf_base = ds_base + uint32_t(buf) * uint32_t(kBlockN * kBlockM * sizeof(Element));
      cute::for_each(cute::make_int_sequence<kDsCopies>{}, [&](auto i) {
        auto const store = ds_store(i);
        Tensor words = recast<uint32_t>(src(make_coord(_, get<0>(store)), get<1>(store), get<2>(store)));
        static_assert(decltype(size(words))::value == 4);
        asm volatile("stmatrix.sync.aligned.x4.trans.m8n8.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                         buf_base + ds_offset(store)),
                     "r"(words(0)), "r"(words(1)), "r"(words(2)), "r"(words(3)));
      });
    } else {
      copy(smem_copy_ds, smem_thr_copy_ds.retile_S(tdSrdS), tdSsdSt(_, _, _, buf));
    }
    cutlass::arch::fence_view_async_shared();
    auto dv_rest = [&] {  // kDvSplit: the dV GEMM's K blocks after the first kDvFirstKBlocks
      if constexpr (kDvSplit) {
        wgmma_async_k_range<kDvFirstKBlocks, kDvKBlocks, /*kZeroInit=*/false>(mma_dkv, tdVrP,
                                                                            tdVrdOt(_, _, _, stage), tdVrdV);
      }
    };
    if constexpr (kDvSplit) {
      if constexpr (kDvLate == 0) { dv_rest(); }
    } else if constexpr (kDvAfterDs) {
      wgmma_async</*kZeroInit=*/false>(mma_dkv, tdVrP, tdVrdOt(_, _, _, stage), tdVrdV);
    }
    cutlass::arch::NamedBarrier::sync(kNumMmaThreads, static_cast<int>(BwdNamedBarrier::kPdSReady));

    // dQ first, then dK, so that dQ is staged while dK still runs [D:040].
    Tensor tdQrdQ = partition_fragment_C(mma_dq, DqTileShape{});
    wgmma_async</*kZeroInit=*/true>(mma_dq, tdQrA(_, _, _, buf), tdQrB, tdQrdQ);
    if constexpr (kDvLate == 2) { dv_rest(); }
    wgmma_async</*kZeroInit=*/false>(mma_dkv, tdKrdS, tdKrQt(_, _, _, stage), tdKrdK);
    if constexpr (kDvLate == 1) { dv_rest(); }
    // dQ done, and every part of dV issued before it; dK (and with kDvLate the rest of dV) may
    // still read Q's (dO's) stage until the wait below.
    warpgroup_wait<kDvLate ? 2 : 1>();
    dq.stage(smem, tdQrdQ, progress.steps + step, mma_tidx);
    warpgroup_wait<0>();
    pipeline.consumer_release(state);
    ++state;
  };
  if constexpr (kLocal && kSplitSteps) {
    // The walk (no rotation in causal/local problems: see first_m_block) split into masked
    // and unmasked runs.
    Walk walk(params, range, n_block);
    for (int step = 0; step < num_steps;) {
      for (; step < num_steps && block_needs_mask(walk.m_block * kBlockM, n0, params, seq);
           ++step, walk.advance()) {
        step_body(step, walk.m_block, std::true_type{});
      }
      for (; step < num_steps && !block_needs_mask(walk.m_block * kBlockM, n0, params, seq);
           ++step, walk.advance()) {
        step_body(step, walk.m_block, std::false_type{});
      }
    }
  } else {
    Walk walk(params, range, n_block);
    for (int step = 0; step < num_steps; ++step, walk.advance()) {
      int const m_block = walk.m_block;
      if constexpr (kLocal || kVarlen) {  // varlen: the block at the sequence's end is masked
        step_body(step, m_block, block_needs_mask(m_block * kBlockM, n0, params, seq));
      } else {
        step_body(step, m_block, std::false_type{});
      }
    }
  }
  // Persistent: K and V are free for the next tile once the last step's GEMMs are done.
  if (kPersistent && num_steps > 0) { smem.barrier_kv_empty.arrive(); }
  epilogue.store(params, seq, mma_dkv, tdKrdK, tdVrdV, n_block, head_kv, batch, mma_tidx);
}

}  // namespace flash
