// The forward mainloop: the producer's TMA loads of Q and the K/V blocks, and a consumer
// warpgroup's key-block loop: S = Q.K^T (WGMMA, shared memory operands), the online softmax in
// registers, O += P.V (P from registers). S(n) and P(n+1).V(n+1) are issued together, so the
// softmax of one block runs while the tensor cores still work on the previous P.V
// (intra-warpgroup overlap), and the consumer warpgroups take turns issuing their GEMMs
// (inter-warpgroup ping-pong) [D:001].
#pragma once

#include "kernel/common/config.h"

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "kernel/common/block_range.h"
#include "kernel/common/mask.h"
#include "kernel/common/named_barriers.h"
#include "kernel/common/softcap.h"
#include "kernel/common/softmax.h"
#include "kernel/common/trace.h"
#include "kernel/common/tile_scheduler.h"
#include "kernel/common/utils.h"
#include "kernel/fwd/fp8.h"
#include "kernel/fwd/paged_kv.h"
#include "kernel/fwd/shared_storage.h"

namespace flash {

using namespace cute;

template <typename Policy>
struct FwdMainloop {
  using Element = typename Policy::Element;
  static constexpr int kHeadDim = Policy::kHeadDim;
  static constexpr int kHeadDimV = Policy::kHeadDimV;  // V's and O's
  static constexpr int kHeadDimO = Policy::kHeadDimO;  // O's columns per warpgroup: V's, or (kSharedRows) half
  static constexpr int kBlockM = Policy::kBlockM;
  static constexpr int kBlockN = Policy::kBlockN;
  static constexpr bool kLocal = Policy::kLocal;
  static constexpr bool kQ2 = Policy::kSeparateO;  // a second Q buffer, used by every other tile
  static constexpr bool kEarlyQ = Policy::kEarlyQ;
  static constexpr bool kSplitMask = Policy::kSplitMask;
  static constexpr bool kHalfSoftmax = Policy::kHalfSoftmax;
  static constexpr bool kMaxFree = Policy::kMaxFree;
  static constexpr bool kSoftcap = Policy::kSoftcap;
  static constexpr bool kFp8 = Policy::kFp8;
  // FP8 hdim 128 with 224-key tiles: O is rescaled right after P.V completes (FA3's order), in a
  // branch of its own, so that ptxas waits for P.V after the softmax's exp2s instead of before them
  // (+3-5 % there; -1-4 % at hdim 64 / 256 and 128-key tiles) [D:089].
  static constexpr bool kRescaleAfterPV = kFp8 && kHeadDim > 64 && kHeadDim <= 128 && kBlockN > 128;
  // FP8 (dev knob kFwdFp8Ends, policy.h): 1, a tile's first S GEMM and last P.V GEMM outside the
  // ping-pong (FA3's); 2, that and the final row factors (1 / sum, v_descale, LSE) while the last
  // P.V runs [D:101].
  static constexpr int kFp8Ends = kFp8 ? kFwdFp8Ends : 0;
  static constexpr bool kFreeEnds = kFp8Ends >= 1;

  // Consumer warpgroups: one per 64 rows, or (kSharedRows) two sharing them.
  static constexpr int kNumMmaWarpGroups = Policy::kSharedRows ? 2 : kBlockM / 64;
  static_assert(kBlockM % 64 == 0 && kNumMmaWarpGroups >= 2 && kNumMmaWarpGroups <= 3);
  // The warpgroups take turns issuing their GEMMs (ping-pong) [D:001]; not the three of FP8's
  // hdim-64 192-row tiles (FA3's FP8 choice) except in the non-causal persistent kernel, where
  // taking turns measured faster [D:094].
  static constexpr bool kPingPong =
      !(kFp8 && kHeadDim <= 64 && kNumMmaWarpGroups == 3 && (kLocal || !Policy::kPersistent));
  static_assert(kBlockN % 16 == 0 && kHeadDim % 16 == 0 && kHeadDimV % 16 == 0);
  static_assert(!Policy::kPaged || kHeadDimV == kHeadDim || Policy::kWideV,
                "paged kernels read K and V of one head dim (the qv kernels their own)");
  static_assert(!kMaxFree || kFwdVoteHwBarrier + kNumMmaWarpGroups <= 8, "vote barriers past CUTLASS's reserved ids");

  using Layouts = FwdSmemLayouts<Policy>;
  using SharedStorage = FwdSharedStorage<Policy>;
  using SmemLayoutQ = typename Layouts::SmemLayoutQ;
  using SmemLayoutKV = typename Layouts::SmemLayoutKV;
  using SmemLayoutV = typename Layouts::SmemLayoutV;
  using SmemLayoutVt = typename Layouts::SmemLayoutVt;
  using Pipeline = typename Layouts::Pipeline;
  using PipelineState = typename Pipeline::PipelineState;

  using TileShapeMNK = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;
  using AtomLayoutMNK = Layout<Shape<Int<kBlockM / 64>, _1, _1>>;
  // S = Q.K^T: both operands K-major in shared memory.
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, TileShapeMNK>(), AtomLayoutMNK{}));
  // O += P.V: P from registers, V^T read MN-major (V is stored as it arrives, head dim fastest), or
  // (kFp8) K-major from its transposed copy.
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kHeadDimO>, Int<kBlockN>>,
                           GMMA::Major::K, kFp8 ? GMMA::Major::K : GMMA::Major::MN>(),
      AtomLayoutMNK{}));
  // kHalfSoftmax: views of one half of the diagonal block's S (the GEMMs stay full width: a
  // run-time choice between two WGMMA shapes serializes them).
  using TiledMmaQKHalf = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kBlockN / 2>, Int<kHeadDim>>>(),
      AtomLayoutMNK{}));

  // Global tensors are (seqlen, head_dim, heads, batch) with a unit head_dim stride.
  using ShapeQKV = Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideQKV = Stride<int64_t, _1, int64_t, int64_t>;
  using TmaQ = decltype(make_tma_copy(
      SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQKV{}),
      SmemLayoutQ{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaKV = decltype(make_tma_copy(
      SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQKV{}),
      take<0, 2>(SmemLayoutKV{}), Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  using TmaV = decltype(make_tma_copy(
      SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQKV{}),
      take<0, 2>(SmemLayoutV{}), Shape<Int<kBlockN>, Int<kHeadDimV>>{}, _1{}));

  static constexpr uint32_t kBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kBytesKV = kBlockN * kHeadDim * sizeof(Element);  // a K stage
  static constexpr uint32_t kBytesV = kBlockN * kHeadDimV * sizeof(Element);
  struct QvArgs {};  // kernel parameters of the qv mainloop (mainloop_qv.h), none here

  // V's global shape: K's, or (dv != d) its own (Params::shapes_v).
  template <typename Params>
  CUTLASS_DEVICE static auto const& shape_v(Params const& params) {
    if constexpr (kHeadDimV == kHeadDim) {
      return params.shape_k;
    } else {
      return params.shapes_v.v;
    }
  }

  struct MaskIfNeeded {};  // a block() argument: the range decides at run time

  // kFp8: every pipeline state of the producer warpgroup follows from c, the K / V blocks it has
  // loaded before (over all its tiles; each tile transposes all its Vs): K's and V's stage for block c
  // (producer), V's landed stage the transpose reads (consumer) and V^T's it writes (producer). One
  // counter instead of three states keeps hdim 256's 24-register producer from spilling [D:089].
  CUTLASS_DEVICE static PipelineState fp8_state(int c, bool producer) {
    constexpr uint32_t kStages = Policy::kStages;
    return PipelineState(uint32_t(c) % kStages, ((uint32_t(c) / kStages) & 1) ^ uint32_t(producer), uint32_t(c));
  }
  template <typename Params, typename Seq, typename PipelineVt>
  CUTLASS_DEVICE void load_fp8(Params const& params, Seq const& seq, SharedStorage& smem, Pipeline& pipeline_k,
                               Pipeline& pipeline_v, PipelineVt& pipeline_vt, int& blocks, FwdTile const& t,
                               BlockRange<kBlockM, kBlockN, kLocal> const& range, int q_empty_phase, int q_slot) const;

  // The scores' descale q_descale * k_descale (kFp8; else 1) and the output's v_descale of a tile.
  template <typename Params>
  CUTLASS_DEVICE static float qk_descale(Params const& params, int batch, int head_kv) {
    if constexpr (kFp8) { return params.fp8.qk(batch, head_kv); } else { return 1.f; }
  }
  // softcap's factor inside the tanh (softcap.h), with (kFp8) the scores' descale.
  template <typename Params>
  CUTLASS_DEVICE static float softcap_prescale(Params const& params, float descale_qk) {
    if constexpr (kFp8) { return params.softcap_prescale * descale_qk; } else { return params.softcap_prescale; }
  }
  // P for P.V from the softmax's float32 S: its 16-bit copy, or (kFp8) e4m3 in the permuted order.
  template <typename TensorS, typename TensorP>
  CUTLASS_DEVICE static void make_p(TensorS const& s, TensorP& p) {
    if constexpr (kFp8) { quantize_p(s, p); } else { convert_into(s, p); }
  }

  // A (rows, d) view of one head: dense, the batch entry's own; varlen (batch coordinate 0 of the
  // packed tensor), starting at the sequence's first row.
  // The TMA tensors' batch coordinate: varlen tensors are one packed batch entry (coordinate 0;
  // a sequence is found by its row offset), dense ones index the batch.
  CUTLASS_DEVICE static int batch_coord(int batch) { return Policy::kVarlen ? 0 : batch; }
  template <typename TensorT>
  CUTLASS_DEVICE static auto rows_of(TensorT const& t, int offset) {
    if constexpr (Policy::kVarlen) {
      return domain_offset(make_coord(offset, _0{}), t);
    } else {
      return t;
    }
  }

  // Producer: one thread issues the TMA loads of a tile in walk()'s order, Q once the previous
  // tile released its buffer (persistent mode); in paged kernels the producer warpgroup gathers K/V
  // (load_paged).
  template <typename Params, typename Seq>
  CUTLASS_DEVICE void load(Params const& params, Seq const& seq, SharedStorage& smem, Pipeline& pipeline_k,
                           Pipeline& pipeline_v, PipelineState& state_k, PipelineState& state_v,
                           FwdTile const& t, BlockRange<kBlockM, kBlockN, kLocal> const& range,
                           int q_empty_phase, int q_slot) const {
    if constexpr (Policy::kPaged) {
      load_paged(params, seq, smem, pipeline_k, pipeline_v, state_k, state_v, t, range, q_empty_phase, q_slot);
      return;
    }
    auto [tQgQ, tQsQ, tKgK, tKsK, tVgV, tVsV] = tma_slices(params, seq, smem, t, q_slot);
    auto load_k = [&](int n) {
      pipeline_k.producer_acquire(state_k);
      copy(params.tma_k.with(*pipeline_k.producer_get_barrier(state_k)), tKgK(_, n), tKsK(_, state_k.index()));
      ++state_k;
    };
    auto load_v = [&](int n) {
      pipeline_v.producer_acquire(state_v);
      copy(params.tma_v.with(*pipeline_v.producer_get_barrier(state_v)), tVgV(_, n), tVsV(_, state_v.index()));
      ++state_v;
    };
    // The Q buffer is free once the previous tile that used it released it (its epilogue's O
    // store has read it, or with kEarlyQ its last Q.K^T GEMM is done; with kQ2 that tile is
    // the one before the previous).
    walk(range, load_k, load_v, [&] {
      if (q_empty_phase >= 0) { smem.q_empty(q_slot).wait(q_empty_phase); }
      smem.q_full(q_slot).arrive_and_expect_tx(kBytesQ);
      copy(params.tma_q.with(reinterpret_cast<uint64_t&>(smem.q_full(q_slot))), tQgQ, tQsQ);
    });
  }

  // Tile t's TMA views, (global, shared) pairs: Q's (into Q buffer q_slot) and, per key block, K's and V's.
  template <typename Params, typename Seq>
  CUTLASS_DEVICE auto tma_slices(Params const& params, Seq const& seq, SharedStorage& smem, FwdTile const& t,
                                 int q_slot) const {
    int const head_kv = t.head / params.q_heads_per_kv_head;
    Tensor mQ = rows_of(params.tma_q.get_tma_tensor(params.shape_q)(_, _, t.head, batch_coord(t.batch)), seq.offset_q(params));  // (sq, d)
    Tensor mK = rows_of(params.tma_k.get_tma_tensor(params.shape_k)(_, _, head_kv, batch_coord(t.batch)), seq.offset_k(params));  // (sk, d)
    Tensor mV = rows_of(params.tma_v.get_tma_tensor(shape_v(params))(_, _, head_kv, batch_coord(t.batch)), seq.offset_k(params));
    Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(t.m_block, _0{}));  // (M, D)
    Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));  // (N, D, n)
    Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kHeadDimV>>{}, make_coord(_, _0{}));  // (N, DV, n)
    Tensor sQ = make_tensor(make_smem_ptr(smem.q_data(q_slot)), SmemLayoutQ{});  // (M, D)
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutKV{});   // (N, D, stages)
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), SmemLayoutV{});    // (N, DV, stages)
    auto [tQgQ, tQsQ] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto [tKgK, tKsK] = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto [tVgV, tVsV] = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    return cute::make_tuple(tQgQ, tQsQ, tKgK, tKsK, tVgV, tVsV);
  }

  // The producer's order: K(n_max-1) (it may stream in while the previous tile still holds the Q
  // buffer), then Q, then K(n-1) ahead of V(n), matching the consumers' order.
  template <typename LoadK, typename LoadV, typename LoadQ>
  CUTLASS_DEVICE static void walk(BlockRange<kBlockM, kBlockN, kLocal> const& range, LoadK&& load_k, LoadV&& load_v,
                                  LoadQ&& load_q) {
    int n = range.n_block_max - 1;
    load_k(n);
    load_q();
    for (; n > range.n_block_min; --n) {
      load_k(n - 1);
      load_v(n);
    }
    load_v(range.n_block_min);
  }

  // load() of paged kernels, by every thread of the producer warpgroup: K/V rows gathered page by
  // page with cp.async (paged_kv.h), each thread arriving on the stage when its copies land; Q by
  // TMA from the first thread. One tile per CTA, so Q's buffer is never waited for.
  template <typename Params, typename Seq>
  CUTLASS_DEVICE void load_paged(Params const& params, Seq const& seq, SharedStorage& smem, Pipeline& pipeline_k,
                                 Pipeline& pipeline_v, PipelineState& state_k, PipelineState& state_v,
                                 FwdTile const& t, BlockRange<kBlockM, kBlockN, kLocal> const& range,
                                 int q_empty_phase, int q_slot) const {
    int const head_kv = t.head / params.q_heads_per_kv_head;
    int const tid = threadIdx.x % cutlass::NumThreadsPerWarpGroup;
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutKV{});  // (N, D, stages)
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), SmemLayoutKV{});
    PagedKVLoader<Element, kBlockN, kHeadDim> const paged(params.paged, t.batch, seq.offset_k(params),
                                                          seq.seqlen_k(params), tid);
    auto load_kv = [&](auto keys, Pipeline& pipeline, PipelineState& state, auto& s, int n) {
      pipeline.producer_acquire(state);
      paged.template load<decltype(keys)::value>(n, head_kv, s(_, _, state.index()));
      pipeline.producer_commit(state, cutlass::arch::cpasync_barrier_arrive);
      ++state;
    };
    auto load_q = [&] {
      if (tid != 0) { return; }
      Tensor mQ = rows_of(params.tma_q.get_tma_tensor(params.shape_q)(_, _, t.head, batch_coord(t.batch)), seq.offset_q(params));
      Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(t.m_block, _0{}));  // (M, D)
      Tensor sQ = make_tensor(make_smem_ptr(smem.q_data(q_slot)), SmemLayoutQ{});
      auto [tQgQ, tQsQ] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
      if (q_empty_phase >= 0) { smem.q_empty(q_slot).wait(q_empty_phase); }
      smem.q_full(q_slot).arrive_and_expect_tx(kBytesQ);
      copy(params.tma_q.with(reinterpret_cast<uint64_t&>(smem.q_full(q_slot))), tQgQ, tQsQ);
    };
    walk(range, [&](int n) { load_kv(std::true_type{}, pipeline_k, state_k, sK, n); },
         [&](int n) { load_kv(std::false_type{}, pipeline_v, state_v, sV, n); }, load_q);
  }

  // Inter-warpgroup ping-pong: the consumer warpgroups take turns issuing GEMMs, so one
  // warpgroup's softmax runs while the tensor cores serve another's. Warpgroup w syncs on its
  // barrier (128 threads) and its predecessor arrives there (128 more).
  static constexpr int kPingPongThreads = 2 * 128;
  CUTLASS_DEVICE static void scheduler_sync(int wg) {
    if constexpr (kPingPong) {
      cutlass::arch::NamedBarrier::sync(kPingPongThreads, static_cast<int>(FwdNamedBarrier::kSchedulerWG1) + wg);
    }
  }
  CUTLASS_DEVICE static void scheduler_arrive(int wg) {
    if constexpr (kPingPong) {
      int const next = wg + 1 == kNumMmaWarpGroups ? 0 : wg + 1;
      cutlass::arch::NamedBarrier::arrive(kPingPongThreads, static_cast<int>(FwdNamedBarrier::kSchedulerWG1) + next);
    }
  }
  // The first warpgroup's first turn needs no predecessor: it arrives on its own barrier.
  CUTLASS_DEVICE static void scheduler_init(int wg) {
    if (kPingPong && wg == 0) {
      cutlass::arch::NamedBarrier::arrive(kPingPongThreads, static_cast<int>(FwdNamedBarrier::kSchedulerWG1));
    }
  }

// The trace knob (trace.h): FP8 consumers stamp their events, warpgroup w as role 1 + w.
#define FLASH_MMA_TRACE(e) FLASH_TRACE(kFp8 && mma_tidx % 128 == 0 ? 1 + wg : 3, e)
  // Consumer warpgroup `wg` (0-based) owns rows [64 wg, 64 wg + 64) of the tile.
  // The epilogue (epilogue.h) stores the tile's O and LSE.
  template <typename Params, typename Seq, typename Epilogue, typename PipelineV>
  CUTLASS_DEVICE void mma(Params const& params, Seq const& seq, SharedStorage& smem, Pipeline& pipeline_k,
                          PipelineV& pipeline_v, PipelineState& state_k, PipelineState& state_v, int& q_phase,
                          FwdTile const& t, BlockRange<kBlockM, kBlockN, kLocal> const& range, int mma_tidx, int wg,
                          Epilogue const& epilogue, int split = 0) const {
    int const m_block = t.m_block, head = t.head, batch = t.batch;
    TiledMmaQK tiled_mma_qk;
    TiledMmaPV tiled_mma_pv;
    auto thr_mma_qk = tiled_mma_qk.get_thread_slice(mma_tidx);
    // Operands through the warpgroup's first thread: Q's descriptors, which depend on the
    // warpgroup's rows, are then built in uniform registers (warpgroup_first_thread, utils.h).
    int const wg_thread = warpgroup_first_thread(mma_tidx);
    auto wg_mma_qk = tiled_mma_qk.get_thread_slice(wg_thread);
    auto wg_mma_pv = tiled_mma_pv.get_thread_slice(wg_thread);

    // kQ2: q_phase counts the tiles that loaded Q (slot = its low bit, phase = the next bit).
    int const q_slot = kQ2 ? q_phase & 1 : 0;
    Tensor sQ = make_tensor(make_smem_ptr(smem.q_data(q_slot)), SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutKV{});
    Tensor sVt = [&] {
      if constexpr (kFp8) {
        return make_tensor(make_smem_ptr(smem.vt.data.data()), typename Layouts::SmemLayoutVtK{});
      } else {
        return make_tensor(make_smem_ptr(smem.v.data()), SmemLayoutVt{});
      }
    }();
    Tensor tSrQ = wg_mma_qk.partition_fragment_A(sQ);   // (MMA, MMA_M, MMA_K) descriptors
    Tensor tSrK = wg_mma_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stages)
    Tensor tOrV = wg_mma_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stages)

    Tensor tSrS = partition_fragment_C(tiled_mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});  // fp32
    Tensor tOrO = partition_fragment_C(tiled_mma_pv, Shape<Int<kBlockM>, Int<kHeadDimO>>{});  // fp32
    Tensor tOrP = [&] {
      if constexpr (kFp8) {
        return make_tensor<Element>(fp8_p_layout<kBlockN>());
      } else {
        return make_tensor<Element>(acc_layout_as_a_operand(tSrS.layout()));
      }
    }();
    Tensor tSrS_rc = make_tensor(tSrS.data(), acc_layout_rowcol(tSrS.layout()));  // (rows, cols)
    Tensor tOrO_rc = make_tensor(tOrO.data(), acc_layout_rowcol(tOrO.layout()));
    Tensor tScS = thr_mma_qk.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
    Tensor tScS_rc = make_tensor(tScS.data(), acc_layout_rowcol(tScS.layout()));
    constexpr int kRows = decltype(size<0>(tSrS_rc))::value;

    // kFp8: q_descale * k_descale scales the raw scores: inside the cap with softcap (whose
    // softmax scale and LSE factor are the cap's), else the softmax's scale and the LSE's factor.
    float const descale_qk = qk_descale(params, batch, head / params.q_heads_per_kv_head);
    constexpr bool kDescaleScores = kFp8 && !kSoftcap;
    // kFp8: a descale of 0 would make the scale 0 and a masked score's -inf * 0 NaN (softmax.h).
    using Softmax = OnlineSoftmax<kRows, kFp8 ? 8 : 0, kFp8 || Policy::kUncheckedInf>;
    Softmax softmax(kDescaleScores ? params.softmax_scale_log2 * descale_qk : params.softmax_scale_log2);
    Tensor lse = make_tensor<float>(Shape<Int<kRows>>{});
    int const row0 = m_block * kBlockM;
    auto mask = [&](int n) {
      if (range.needs_mask(n)) {
        apply_mask<kLocal>(tSrS_rc, tScS_rc, row0, n * kBlockN, seq.seqlen_k(params), seq.diag(params),
                           params.window_left, params.window_right, n < range.n_unmasked_lo);
      }
    };

    // S(n) is final: K's stage is free, and after the tile's last block (n_block_min) Q's buffer.
    auto release_k = [&](int n) CUTLASS_LAMBDA_FUNC_INLINE {
      if (n == range.n_block_min) { release_q(smem, mma_tidx, q_slot); }
      pipeline_k.consumer_release(state_k);
      ++state_k;
    };

    if (!range.empty()) {
      FLASH_MMA_TRACE(kTile);
      if constexpr (kQ2) {
        smem.q_full(q_slot).wait((q_phase >> 1) & 1);
        ++q_phase;
      } else {
        smem.barrier_q.wait(q_phase);
        q_phase ^= 1;
      }
      FLASH_MMA_TRACE(kQReady);

      int n = range.n_block_max - 1;
      if constexpr (!kFreeEnds) { scheduler_sync(wg); }
      pipeline_k.consumer_wait(state_k);
      FLASH_MMA_TRACE(kK);
      wgmma_async</*kZeroInit=*/true>(tiled_mma_qk, tSrQ, tSrK(_, _, _, state_k.index()), tSrS);
      if constexpr (!kFreeEnds) { scheduler_arrive(wg); }
      warpgroup_wait<0>();
      FLASH_MMA_TRACE(kS);
      release_k(n);
      if constexpr (kSoftcap) { apply_softcap(tSrS, softcap_prescale(params, descale_qk)); }
      if constexpr (kHalfSoftmax) {
        // This warpgroup's last row sees no key past the first half of block n (BlockRange's
        // bound, for this warpgroup's rows).
        int const wg_last_row = min(row0 + 64 * wg + 63, seq.seqlen_q(params) - 1);
        int const hi = min(seq.seqlen_k(params), wg_last_row + seq.diag(params) + params.window_right + 1);
        // Views of one half of S: the first kBlockN / 2 columns are the first half of the
        // accumulator's registers (column groups of 8 are the fragment's outermost value mode).
        TiledMmaQKHalf mma_half;
        auto const half_layout = partition_fragment_C(mma_half, Shape<Int<kBlockM>, Int<kBlockN / 2>>{}).layout();
        static_assert(decltype(size(half_layout))::value * 2 == decltype(size(tSrS))::value);
        Tensor c_half = mma_half.get_thread_slice(mma_tidx).partition_C(
            make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN / 2>>{}));
        Tensor c_half_rc = make_tensor(c_half.data(), acc_layout_rowcol(c_half.layout()));
        if (hi - n * kBlockN <= kBlockN / 2) {
          Tensor s_half_rc = make_tensor(tSrS.data(), acc_layout_rowcol(half_layout));
          if (range.needs_mask(n)) {
            apply_mask<kLocal>(s_half_rc, c_half_rc, row0, n * kBlockN, seq.seqlen_k(params), seq.diag(params),
                               params.window_left, params.window_right, n < range.n_unmasked_lo);
          }
          softmax.first_block(s_half_rc);
          CUTLASS_PRAGMA_UNROLL
          for (int i = size(tSrS) / 2; i < size(tSrS); ++i) { tSrS(i) = 0.f; }
        } else {
          // A warpgroup whose rows all see the first half of block n whole masks only the second
          // half (the first half's coordinates, 64 columns on).
          int const wg_first_row = row0 + 64 * wg;
          bool const first_half_whole =
              min(seq.seqlen_k(params), wg_first_row + seq.diag(params) + params.window_right + 1) >=
                  n * kBlockN + kBlockN / 2 &&
              wg_last_row + seq.diag(params) - params.window_left <= n * kBlockN;
          if (first_half_whole) {
            Tensor s_upper_rc = make_tensor(tSrS.data() + size(half_layout), acc_layout_rowcol(half_layout));
            if (range.needs_mask(n)) {
              apply_mask<kLocal>(s_upper_rc, c_half_rc, row0, n * kBlockN + kBlockN / 2, seq.seqlen_k(params),
                                 seq.diag(params), params.window_left, params.window_right,
                                 n < range.n_unmasked_lo);
            }
          } else {
            mask(n);
          }
          softmax.first_block(tSrS_rc);
        }
      } else {
        mask(n);
        softmax.first_block(tSrS_rc);
      }
      make_p(tSrS, tOrP);
      clear(tOrO);
      // Factor for O before P(n+1).V(n+1) is added; applied while S(n) runs on the tensor cores
      // (kRescaleAfterPV: right after the previous block's P.V completes).
      Tensor rescale = make_tensor<float>(Shape<Int<kRows>>{});
      fill(rescale, 1.f);
      bool moved = false;  // some factor of `rescale` differs from 1

      // The first key block that every row of the tile sees whole (no mask); the blocks below
      // it may skip the max search (kMaxFree).
      int const n_free_from = min(range.n_block_max, range.n_unmasked_hi) - 1;
      // One K/V block after the first. masked: std::true_type (it crosses the sequence end or a
      // window edge), std::false_type (it does not), MaskIfNeeded (the range decides at run time).
      auto block = [&](int n, auto masked) CUTLASS_LAMBDA_FUNC_INLINE {  // inlined: its tensors stay in registers
        scheduler_sync(wg);
        FLASH_MMA_TRACE(kTurn);
        pipeline_k.consumer_wait(state_k);
        FLASH_MMA_TRACE(kK);
        wgmma_async</*kZeroInit=*/true>(tiled_mma_qk, tSrQ, tSrK(_, _, _, state_k.index()), tSrS);
        if (!kRescaleAfterPV && softmax.warp_needs_rescale(moved)) { softmax.rescale_o(tOrO_rc, rescale); }
        pipeline_v.consumer_wait(state_v);
        FLASH_MMA_TRACE(kV);
        wgmma_async</*kZeroInit=*/false>(tiled_mma_pv, tOrP, tOrV(_, _, _, state_v.index()), tOrO);
        scheduler_arrive(wg);  // the next warpgroup's GEMMs queue behind ours while we do softmax
        warpgroup_wait<1>();   // S(n) is ready; P.V of the previous block still runs
        FLASH_MMA_TRACE(kS);
        // S(n) as the softmax takes it: capped (kSoftcap), then masked.
        auto mask_block = [&]() CUTLASS_LAMBDA_FUNC_INLINE {
          if constexpr (kSoftcap) { apply_softcap(tSrS, softcap_prescale(params, descale_qk)); }
          if constexpr (std::is_same_v<decltype(masked), MaskIfNeeded>) {
            mask(n);
          } else if constexpr (decltype(masked)::value) {
            apply_mask<kLocal>(tSrS_rc, tScS_rc, row0, n * kBlockN, seq.seqlen_k(params), seq.diag(params),
                               params.window_left, params.window_right, n < range.n_unmasked_lo);
          }
        };
        if constexpr (kMaxFree) {
          // Only blocks after a full unmasked one (n < n_free_from) go without the max search:
          // before that some row's max may stand on a few keys. Q and this K stage stay held
          // until the softmax knows it needs no second S(n).
          mask_block();
          bool done = false;
          if (n < n_free_from) {  // uniform over the warpgroup
            Tensor sums = make_tensor<float>(Shape<Int<kRows>>{});
            bool const fits = softmax.block_without_max(tSrS_rc, sums);
            if (named_barrier_all(fits, kFwdVoteHwBarrier + wg, 128)) {
              softmax.add_sums(sums);
              moved = false;
              done = true;
            } else {  // some p would exceed the slack (or a row has no max yet): S(n) again
              wgmma_async</*kZeroInit=*/true>(tiled_mma_qk, tSrQ, tSrK(_, _, _, state_k.index()), tSrS);
              warpgroup_wait<0>();
              mask_block();
            }
          }
          if (!done) { moved = softmax.next_block</*kExact=*/true>(tSrS_rc, rescale); }
          release_k(n);
        } else {
          release_k(n);
          mask_block();
          constexpr bool kExact = kFp8 && !Policy::kFp8Slack;
          constexpr bool kCheckInf = !(Policy::kUncheckedInf && std::is_same_v<decltype(masked), std::false_type>);
          moved = softmax.template next_block<kExact, kCheckInf>(tSrS_rc, rescale);
        }
        if (kRescaleAfterPV && softmax.warp_needs_rescale(moved)) {
          warpgroup_wait<0>();  // P.V done: O may be rescaled
          softmax.rescale_o(tOrO_rc, rescale);
        } else {
          warpgroup_wait<0>();  // P.V done: V's stage and the P registers are free
        }
        FLASH_MMA_TRACE(kPV);
        pipeline_v.consumer_release(state_v);
        ++state_v;
        make_p(tSrS, tOrP);
      };
      // kSplitMask: three loops, as FA3, so that the long middle one carries no mask code or
      // registers: the blocks at the sequence end / right window edge (masked), the inner blocks,
      // the blocks past the left window edge (masked). Otherwise one loop masks where needed.
      if constexpr (kSplitMask) {
        for (--n; n >= range.n_block_min && n >= range.n_unmasked_hi; --n) { block(n, std::true_type{}); }
        for (; n >= range.n_block_min && n >= range.n_unmasked_lo; --n) { block(n, std::false_type{}); }
        if constexpr (kLocal) {
          for (; n >= range.n_block_min; --n) { block(n, std::true_type{}); }
        }
      } else {
        for (--n; n >= range.n_block_min; --n) { block(n, MaskIfNeeded{}); }
      }
      if constexpr (!kFreeEnds) { scheduler_sync(wg); }
      if (!kRescaleAfterPV && softmax.warp_needs_rescale(moved)) { softmax.rescale_o(tOrO_rc, rescale); }
      pipeline_v.consumer_wait(state_v);
      FLASH_MMA_TRACE(kV);
      wgmma_async</*kZeroInit=*/false>(tiled_mma_pv, tOrP, tOrV(_, _, _, state_v.index()), tOrO);
      if constexpr (!kFreeEnds) { scheduler_arrive(wg); }
      if constexpr (kFp8Ends >= 2) {
        Tensor factor = make_tensor<float>(Shape<Int<kRows>>{});
        softmax.finalize_factors(kDescaleScores ? params.lse_scale * descale_qk : params.lse_scale, lse,
                                 params.sink != nullptr ? params.sink[head] : -INFINITY, factor,
                                 params.fp8.v(batch, head / params.q_heads_per_kv_head));
        warpgroup_wait<0>();
        FLASH_MMA_TRACE(kPV);
        pipeline_v.consumer_release(state_v);
        ++state_v;
        softmax.rescale_o(tOrO_rc, factor);
      } else {
        warpgroup_wait<0>();
        FLASH_MMA_TRACE(kPV);
        pipeline_v.consumer_release(state_v);
        ++state_v;  // persistent mode: the next tile's first V is the next stage
        softmax.finalize(tOrO_rc, kDescaleScores ? params.lse_scale * descale_qk : params.lse_scale, lse,
                         params.sink != nullptr ? params.sink[head] : -INFINITY);
        if constexpr (kFp8) {
          float const descale_v = params.fp8.v(batch, head / params.q_heads_per_kv_head);
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < size(tOrO); ++i) { tOrO(i) *= descale_v; }
        }
      }
    } else {
      clear(tOrO);
      fill(lse, params.sink != nullptr ? params.sink[head] : -INFINITY);
    }
    epilogue.store(params, seq, smem, tiled_mma_pv, tOrO, lse, m_block, head, batch, mma_tidx, wg, split);
    FLASH_MMA_TRACE(kEpi);
  }

#undef FLASH_MMA_TRACE

  // kEarlyQ (own O buffer, or O stored from registers): this warpgroup's last Q.K^T GEMM of the
  // tile has completed, so the producer may load the next tile's Q; one arrival per warpgroup and
  // tile that loaded Q. Otherwise Q is released by the epilogue, after O's TMA store has read it.
  CUTLASS_DEVICE static void release_q(SharedStorage& smem, int mma_tidx, int q_slot) {
    if constexpr (kEarlyQ) {
      if (mma_tidx % 128 == 0) { smem.q_empty(q_slot).arrive(); }
    }
  }

};

}  // namespace flash
