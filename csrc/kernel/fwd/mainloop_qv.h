// The qv forward mainloop (FwdPolicy::kWideV: FA3's `qv`, MLA decode with q/k head dim 64 and v
// head dim 256 / 512): scores S = Q.K^T + Qv.V^T over the same K/V blocks, then the online
// softmax and O += P.V. Each consumer warpgroup owns 64 of the tile's rows, or (kSharedRows, dv 512)
// both share the tile's 64 rows, each computing the whole S and its half of O's columns (kHeadDimO
// of them). V's stage is the B operand of both GEMMs: K-major for Qv.V^T, MN-major for P.V. Per
// key block: S, softmax, P.V, in that order, while the producer loads the next block into the other
// stage; the warpgroups take turns issuing their S GEMMs (the base mainloop's ping-pong). Softcap,
// masks, softmax and epilogue are the base's [D:079].
#pragma once

#include "kernel/fwd/mainloop.h"

namespace flash {

using namespace cute;

template <typename Policy>
struct FwdQvMainloop : FwdMainloop<Policy> {
  using Base = FwdMainloop<Policy>;
  using Element = typename Base::Element;
  using SharedStorage = typename Base::SharedStorage;
  using Pipeline = typename Base::Pipeline;
  using PipelineState = typename Base::PipelineState;
  using ShapeQKV = typename Base::ShapeQKV;
  using StrideQKV = typename Base::StrideQKV;
  using TiledMmaQK = typename Base::TiledMmaQK;
  using TiledMmaPV = typename Base::TiledMmaPV;
  using Layouts = typename Base::Layouts;
  static constexpr int kHeadDim = Policy::kHeadDim;
  static constexpr int kHeadDimV = Policy::kHeadDimV;
  static constexpr int kHeadDimO = Policy::kHeadDimO;
  static constexpr int kBlockM = Policy::kBlockM;
  static constexpr int kBlockN = Policy::kBlockN;
  static constexpr bool kLocal = Policy::kLocal;
  static_assert(Policy::kWideV && !Policy::kPersistent);

  using SmemLayoutQv = typename Layouts::SmemLayoutQv;
  using SmemLayoutVtSlice = typename Layouts::SmemLayoutVtSlice;
  using TmaQv = decltype(make_tma_copy(
      SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQKV{}),
      SmemLayoutQv{}, Shape<Int<kBlockM>, Int<kHeadDimV>>{}, _1{}));
  // Kernel parameters of its own: Qv's TMA and global shape (rows, dv, heads_q, batch).
  struct QvArgs {
    TmaQv tma;
    ShapeQKV shape;
  };
  static constexpr uint32_t kBytesQv = kBlockM * kHeadDimV * sizeof(Element);

  // Producer (one thread; paged: the warpgroup): Q and Qv under the Q barrier, then K(n) and V(n)
  // block by block in the consumers' order, so that a block's loads start as soon as the block two
  // before it is done.
  template <typename Params, typename Seq>
  CUTLASS_DEVICE void load(Params const& params, Seq const& seq, SharedStorage& smem, Pipeline& pipeline_k,
                           Pipeline& pipeline_v, PipelineState& state_k, PipelineState& state_v,
                           FwdTile const& t, BlockRange<kBlockM, kBlockN, kLocal> const& range,
                           int q_empty_phase, int /*q_slot: one Q buffer*/) const {
    if constexpr (Policy::kPaged) {
      load_paged(params, seq, smem, pipeline_k, pipeline_v, state_k, state_v, t, range);
      return;
    }
    int const head_kv = t.head / params.q_heads_per_kv_head;
    int const b = Base::batch_coord(t.batch);
    Tensor mK = Base::rows_of(params.tma_k.get_tma_tensor(params.shape_k)(_, _, head_kv, b), seq.offset_k(params));
    Tensor mV = Base::rows_of(params.tma_v.get_tma_tensor(Base::shape_v(params))(_, _, head_kv, b), seq.offset_k(params));
    Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));   // (N, D, n)
    Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kHeadDimV>>{}, make_coord(_, _0{}));  // (N, DV, n)
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Base::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Base::SmemLayoutV{});
    auto [tKgK, tKsK] = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto [tVgV, tVsV] = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    static_assert(!Policy::kSeparateO, "one Q buffer");
    if (q_empty_phase >= 0) { smem.barrier_q_empty.wait(q_empty_phase); }
    load_q(params, seq, smem, t);
    for (int n = range.n_block_max - 1; n >= range.n_block_min; --n) {
      pipeline_k.producer_acquire(state_k);
      copy(params.tma_k.with(*pipeline_k.producer_get_barrier(state_k)), tKgK(_, n), tKsK(_, state_k.index()));
      ++state_k;
      pipeline_v.producer_acquire(state_v);
      copy(params.tma_v.with(*pipeline_v.producer_get_barrier(state_v)), tVgV(_, n), tVsV(_, state_v.index()));
      ++state_v;
    }
  }

  // Q and Qv by TMA under the Q barrier (one thread).
  template <typename Params, typename Seq>
  CUTLASS_DEVICE void load_q(Params const& params, Seq const& seq, SharedStorage& smem, FwdTile const& t) const {
    int const b = Base::batch_coord(t.batch);
    Tensor mQ = Base::rows_of(params.tma_q.get_tma_tensor(params.shape_q)(_, _, t.head, b), seq.offset_q(params));
    Tensor mQv = Base::rows_of(params.qv.tma.get_tma_tensor(params.qv.shape)(_, _, t.head, b), seq.offset_q(params));
    Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(t.m_block, _0{}));
    Tensor gQv = local_tile(mQv, Shape<Int<kBlockM>, Int<kHeadDimV>>{}, make_coord(t.m_block, _0{}));
    Tensor sQ = make_tensor(make_smem_ptr(smem.q_data(0)), typename Base::SmemLayoutQ{});
    Tensor sQv = make_tensor(make_smem_ptr(smem.qv.data.data()), SmemLayoutQv{});
    auto [tQgQ, tQsQ] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto [tQvgQv, tQvsQv] =
        tma_partition(params.qv.tma, _0{}, Layout<_1>{}, group_modes<0, 2>(sQv), group_modes<0, 2>(gQv));
    smem.barrier_q.arrive_and_expect_tx(Base::kBytesQ + kBytesQv);
    copy(params.tma_q.with(reinterpret_cast<uint64_t&>(smem.barrier_q)), tQgQ, tQsQ);
    copy(params.qv.tma.with(reinterpret_cast<uint64_t&>(smem.barrier_q)), tQvgQv, tQvsQv);
  }

  // load() of paged qv kernels, by the producer warpgroup: K and V rows (each of its own width)
  // gathered page by page with cp.async (paged_kv.h), each thread arriving on the stage when its
  // copies land; V's columns past v's head dim are zero-filled, as K's past q's.
  template <typename Params, typename Seq>
  CUTLASS_DEVICE void load_paged(Params const& params, Seq const& seq, SharedStorage& smem, Pipeline& pipeline_k,
                                 Pipeline& pipeline_v, PipelineState& state_k, PipelineState& state_v,
                                 FwdTile const& t, BlockRange<kBlockM, kBlockN, kLocal> const& range) const {
    int const head_kv = t.head / params.q_heads_per_kv_head;
    int const tid = threadIdx.x % cutlass::NumThreadsPerWarpGroup;
    PagedKVParams paged_v = params.paged;
    paged_v.head_dim = get<1>(Base::shape_v(params));
    PagedKVLoader<Element, kBlockN, kHeadDim> const loader_k(params.paged, t.batch, seq.offset_k(params),
                                                             seq.seqlen_k(params), tid);
    PagedKVLoader<Element, kBlockN, kHeadDimV> const loader_v(paged_v, t.batch, seq.offset_k(params),
                                                              seq.seqlen_k(params), tid);
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Base::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Base::SmemLayoutV{});
    if (tid == 0) { load_q(params, seq, smem, t); }
    for (int n = range.n_block_max - 1; n >= range.n_block_min; --n) {
      pipeline_k.producer_acquire(state_k);
      loader_k.template load<true>(n, head_kv, sK(_, _, state_k.index()));
      pipeline_k.producer_commit(state_k, cutlass::arch::cpasync_barrier_arrive);
      ++state_k;
      pipeline_v.producer_acquire(state_v);
      loader_v.template load<false>(n, head_kv, sV(_, _, state_v.index()));
      pipeline_v.producer_commit(state_v, cutlass::arch::cpasync_barrier_arrive);
      ++state_v;
    }
  }

  // Consumer warpgroup `wg`: rows [64 wg, 64 wg + 64) of the tile, or (kSharedRows) all 64 rows and
  // O's columns [kHeadDimO * wg, kHeadDimO * (wg + 1)).
  template <typename Params, typename Seq, typename Epilogue>
  CUTLASS_DEVICE void mma(Params const& params, Seq const& seq, SharedStorage& smem, Pipeline& pipeline_k,
                          Pipeline& pipeline_v, PipelineState& state_k, PipelineState& state_v, int& q_phase,
                          FwdTile const& t, BlockRange<kBlockM, kBlockN, kLocal> const& range, int mma_tidx, int wg,
                          Epilogue const& epilogue, int split) const {
    constexpr bool kSharedRows = Policy::kSharedRows;
    static_assert(!kSharedRows || kBlockM == 64, "one warpgroup's rows, shared by both");
    // kSharedRows: the tiled MMAs are one warpgroup's, each warpgroup its own O slice.
    int const tidx = kSharedRows ? mma_tidx % cutlass::NumThreadsPerWarpGroup : mma_tidx;
    int const slice = kSharedRows ? wg : 0;
    TiledMmaQK tiled_mma_qk;
    TiledMmaPV tiled_mma_pv;
    auto thr_mma_qk = tiled_mma_qk.get_thread_slice(tidx);
    // Operands through the warpgroup's first thread: descriptors uniform over the warpgroup.
    int const wg_thread = kSharedRows ? 0 : warpgroup_first_thread(mma_tidx);
    auto wg_mma_qk = tiled_mma_qk.get_thread_slice(wg_thread);
    auto wg_mma_pv = tiled_mma_pv.get_thread_slice(wg_thread);

    Tensor sQ = make_tensor(make_smem_ptr(smem.q_data(0)), typename Base::SmemLayoutQ{});
    Tensor sQv = make_tensor(make_smem_ptr(smem.qv.data.data()), SmemLayoutQv{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Base::SmemLayoutKV{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Base::SmemLayoutV{});
    Tensor tSrQ = wg_mma_qk.partition_fragment_A(sQ);    // (MMA, MMA_M, MMA_K) descriptors
    Tensor tSrQv = wg_mma_qk.partition_fragment_A(sQv);  // (MMA, MMA_M, MMA_KV)
    Tensor tSrK = wg_mma_qk.partition_fragment_B(sK);    // (MMA, MMA_N, MMA_K, stages)
    Tensor tSrV = wg_mma_qk.partition_fragment_B(sV);    // (MMA, MMA_N, MMA_KV, stages): V as Qv.V^T's B
    // P.V's B operand: this slice's columns of V stage `stage`.
    auto slice_of_v = [&](int stage) {
      Tensor sVt = make_tensor(
          make_smem_ptr(smem.v.data() + stage * (kBlockN * kHeadDimV) + slice * (kBlockN * kHeadDimO)),
          SmemLayoutVtSlice{});
      return wg_mma_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K)
    };

    Tensor tSrS = partition_fragment_C(tiled_mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
    Tensor tOrO = partition_fragment_C(tiled_mma_pv, Shape<Int<kBlockM>, Int<kHeadDimO>>{});
    Tensor tOrP = make_tensor<Element>(acc_layout_as_a_operand(tSrS.layout()));
    Tensor tSrS_rc = make_tensor(tSrS.data(), acc_layout_rowcol(tSrS.layout()));
    Tensor tOrO_rc = make_tensor(tOrO.data(), acc_layout_rowcol(tOrO.layout()));
    Tensor tScS = thr_mma_qk.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
    Tensor tScS_rc = make_tensor(tScS.data(), acc_layout_rowcol(tScS.layout()));
    constexpr int kRows = decltype(size<0>(tSrS_rc))::value;

    OnlineSoftmax<kRows> softmax(params.softmax_scale_log2);
    Tensor lse = make_tensor<float>(Shape<Int<kRows>>{});
    Tensor rescale = make_tensor<float>(Shape<Int<kRows>>{});
    int const row0 = t.m_block * kBlockM;
    float const sink = params.sink != nullptr ? params.sink[t.head] : -INFINITY;

    if (!range.empty()) {
      smem.barrier_q.wait(q_phase);
      q_phase ^= 1;
      clear(tOrO);
      for (int n = range.n_block_max - 1; n >= range.n_block_min; --n) {
        Base::scheduler_sync(wg);
        pipeline_k.consumer_wait(state_k);
        pipeline_v.consumer_wait(state_v);
        warpgroup_fence_operand(tSrS);
        warpgroup_arrive();
        wgmma_issue</*kZeroInit=*/true>(tiled_mma_qk, tSrQ, tSrK(_, _, _, state_k.index()), tSrS);
        wgmma_issue</*kZeroInit=*/false>(tiled_mma_qk, tSrQv, tSrV(_, _, _, state_v.index()), tSrS);
        warpgroup_commit_batch();
        warpgroup_fence_operand(tSrS);
        Base::scheduler_arrive(wg);
        warpgroup_wait<0>();
        if (n == range.n_block_min) { Base::release_q(smem, mma_tidx, 0); }
        pipeline_k.consumer_release(state_k);
        ++state_k;
        if constexpr (Policy::kSoftcap) { apply_softcap(tSrS, params.softcap_prescale); }
        if (range.needs_mask(n)) {
          apply_mask<kLocal>(tSrS_rc, tScS_rc, row0, n * kBlockN, seq.seqlen_k(params), seq.diag(params),
                             params.window_left, params.window_right, n < range.n_unmasked_lo);
        }
        if (n == range.n_block_max - 1) {
          softmax.first_block(tSrS_rc);
        } else {
          bool const moved = softmax.next_block(tSrS_rc, rescale);
          if (softmax.warp_needs_rescale(moved)) { softmax.rescale_o(tOrO_rc, rescale); }
        }
        convert_into(tSrS, tOrP);
        Tensor tOrV = slice_of_v(state_v.index());
        wgmma_async</*kZeroInit=*/false>(tiled_mma_pv, tOrP, tOrV, tOrO);
        warpgroup_wait<0>();
        pipeline_v.consumer_release(state_v);
        ++state_v;
      }
      softmax.finalize(tOrO_rc, params.lse_scale, lse, sink);
    } else {
      clear(tOrO);
      fill(lse, sink);
    }
    epilogue.store(params, seq, smem, tiled_mma_pv, tOrO, lse, t.m_block, t.head, t.batch, tidx, wg, split, slice);
  }
};

}  // namespace flash
