// The backward mainloop: the producer's TMA loads (K and V once per tile; Q, dO, LSE2 and D per
// step through a kStages pipeline) and what both consumer step loops share (shared-memory views,
// the walk over a tile's steps, the causal/window mask). The step loops themselves are in
// mainloop_rs.h (hdim <= 128: P^T and dS^T as register operands) and mainloop_ss.h (hdim 192 /
// 256: through shared memory).
//
// With S = Q.K^T (unscaled), P = exp2(S * scale * log2e - LSE2), D = rowsum(dO * O):
//   S^T  = K  . Q^T     dP^T = V . dO^T        (WGMMA, all operands in shared memory)
//   dS^T = P^T * (dP^T - D)                     (registers)
//   dV  += P^T  . dO    dK  += dS^T . Q
//   dQ   = dS   . K     (staged in shared memory, added into a float32 buffer by dq_reducer.h)
// With softcap (softcap.h), S^T is first capped, T = tanh(S^T * prescale), P^T comes from T and
// dS^T is multiplied by 1 - T^2.
// Computing the transposes keeps the keys on the MMA's M side, so dK and dV accumulate in the
// same threads for the whole loop.
#pragma once

#include "kernel/common/config.h"

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "kernel/bwd/shared_storage.h"
#include "kernel/common/block_range.h"
#include "kernel/common/named_barriers.h"
#include "kernel/common/seqlen.h"
#include "kernel/common/softcap.h"
#include "kernel/common/tile_scheduler.h"
#include "kernel/common/utils.h"
#include "params/bwd_params.h"  // kBwdPadM

namespace flash {

using namespace cute;

template <typename Policy>
struct BwdMainloop {
  using Element = typename Policy::Element;
  static constexpr int kHeadDim = Policy::kHeadDim;
  static constexpr int kBlockM = Policy::kBlockM;  // queries per step
  static constexpr int kBlockN = Policy::kBlockN;  // keys per CTA
  static constexpr int kStages = Policy::kStages;
  static constexpr bool kLocal = Policy::kLocal;
  static constexpr bool kRS = Policy::kRS;
  static constexpr bool kPersistent = Policy::kPersistent;
  static constexpr bool kSplitQdO = Policy::kSplitQdO;
  static constexpr bool kSplitSteps = Policy::kSplitSteps;
  static constexpr bool kDvAfterDs = Policy::kDvAfterDs;
  static constexpr bool kDvSplit = Policy::kDvSplit;
  static constexpr int kDvFirstKBlocks = Policy::kDvFirstKBlocks;
  static constexpr int kDvLate = Policy::kDvLate;
  static constexpr bool kLateP16 = Policy::kLateP16;
  static constexpr bool kDsKMajor = Policy::kDsKMajor;
  static constexpr bool kVarlen = Policy::kVarlen;
  static constexpr bool kSoftcap = Policy::kSoftcap;
  using SoftcapDerivative = typename Policy::SoftcapDerivative;

  static constexpr int kNumMmaWarpGroups = 2;
  static constexpr int kNumMmaThreads = 128 * kNumMmaWarpGroups;
  static_assert(kBlockM == 64 || (kBlockM == 128 && kBlockN == 128 && kHeadDim <= 64),
                "64 query rows per step (128 only for head dims <= 64)");
  static_assert(kBlockN == 64 || kBlockN == 128);
  static_assert(kRS || !kDvAfterDs);
  static_assert(!kDvSplit || (kDvFirstKBlocks > 0 && kDvFirstKBlocks < kBlockM / 16));

  using Layouts = BwdSmemLayouts<Policy>;
  using SharedStorage = typename BwdSmem<Policy>::SharedStorage;
  using SmemLayoutQ = typename Layouts::SmemLayoutQ;
  using SmemLayoutQt = typename Layouts::SmemLayoutQt;
  using SmemLayoutK = typename Layouts::SmemLayoutK;
  using SmemLayoutKt = typename Layouts::SmemLayoutKt;
  using SmemLayoutPdSt = typename Layouts::SmemLayoutPdSt;
  using SmemLayoutdS = typename Layouts::SmemLayoutdS;
  using SmemLayoutdSK = typename Layouts::SmemLayoutdSK;
  using SmemLayoutdStK = typename Layouts::SmemLayoutdStK;
  using Pipeline = typename Layouts::Pipeline;
  using PipelineState = typename Pipeline::PipelineState;
  using Range = BwdBlockRange<kBlockM, kBlockN, kLocal>;

  // The two consumer warpgroups split the keys when there are 128 of them, else the other
  // dimension (queries for S^T/dP^T, head dim for dK/dV).
  static constexpr int kKeyWGs = kBlockN / 64;
  static constexpr int kOtherWGs = kNumMmaWarpGroups / kKeyWGs;
  using AtomLayoutKeys = Layout<Shape<Int<kKeyWGs>, Int<kOtherWGs>, _1>>;
  // S^T, dP^T: (keys, queries), K = head dim; A = K or V, B = Q or dO, both K-major.
  using SdPShape = Shape<_64, Int<kBlockM / kOtherWGs>, Int<kHeadDim>>;
  using TiledMmaSdP =
      decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, SdPShape>(), AtomLayoutKeys{}));
  // dV, dK: (keys, head dim), K = queries; A = P^T or dS^T (K-major: registers in RS, shared
  // memory in SS), B = dO^T or Q^T (MN-major).
  using MmadKVShape = Shape<_64, Int<kHeadDim / kOtherWGs>, Int<kBlockM>>;
  using MmadKVAtom = std::conditional_t<
      kRS, decltype(GMMA::rs_op_selector<Element, Element, float, MmadKVShape, GMMA::Major::K, GMMA::Major::MN>()),
      decltype(GMMA::ss_op_selector<Element, Element, float, MmadKVShape, GMMA::Major::K, GMMA::Major::MN>())>;
  using TiledMmadKV = decltype(make_tiled_mma(MmadKVAtom{}, AtomLayoutKeys{}));
  // dQ: (queries, head dim), K = keys; A = dS (MN-major view of dS^T, or K-major with kDsKMajor),
  // B = K^T (MN-major). The warpgroups split the head dim, or (kDqSplitQueries) the queries.
  static constexpr int kDqWGsM = Policy::kDqSplitQueries ? 2 : 1;
  static constexpr GMMA::Major kDsMajor = kDsKMajor ? GMMA::Major::K : GMMA::Major::MN;
  using TiledMmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim * kDqWGsM / 2>, Int<kBlockN>>, kDsMajor,
                           GMMA::Major::MN>(),
      Layout<Shape<Int<kDqWGsM>, Int<2 / kDqWGsM>, _1>>{}));
  // The dQ accumulator tile: (queries, head dim).
  using DqTileShape = Shape<Int<kBlockM>, Int<kHeadDim>>;

  using ShapeQKV = Shape<int32_t, int32_t, int32_t, int32_t>;  // (seqlen, d, heads, batch)
  using StrideQKV = Stride<int64_t, _1, int64_t, int64_t>;
  using TmaQ = decltype(make_tma_copy(
      SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQKV{}),
      take<0, 2>(SmemLayoutQ{}), Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaK = decltype(make_tma_copy(
      SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQKV{}),
      SmemLayoutK{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));

  static constexpr uint32_t kBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kBytesK = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kBytesRow = kBlockM * sizeof(float);  // LSE2 or D of one query block

  // A (rows, d) view of one head: dense, the batch entry's own; varlen (batch coordinate 0 of the
  // packed tensor), starting at the sequence's first row.
  // The TMA tensors' batch coordinate: varlen tensors are one packed batch entry (coordinate 0;
  // a sequence is found by its row offset), dense ones index the batch.
  CUTLASS_DEVICE static int batch_coord(int batch) { return kVarlen ? 0 : batch; }
  template <typename TensorT>
  CUTLASS_DEVICE static auto rows_of(TensorT const& t, int offset) {
    if constexpr (kVarlen) {
      return domain_offset(make_coord(offset, _0{}), t);
    } else {
      return t;
    }
  }

  // The first row of (batch, head) in the per-row float32 buffers (LSE2, D, the dQ accumulator):
  // dense (batch, heads_q, seqlen_q_padded); varlen (heads_q, seqlen_q_padded rows), each sequence
  // at its own kBwdPadM-aligned offset (seqlen.h).
  template <typename Params, typename Seq>
  CUTLASS_DEVICE static int64_t row_base(Params const& params, Seq const& seq, int batch, int head) {
    if constexpr (kVarlen) {
      return int64_t(head) * params.seqlen_q_padded + seq.template offset_q_padded<kBwdPadM>();
    } else {
      return (int64_t(batch) * params.heads_q + head) * params.seqlen_q_padded;
    }
  }

  template <typename Params, typename Seq>
  CUTLASS_DEVICE void load(Params const& params, Seq const& seq, SharedStorage& smem, Pipeline& pipeline,
                           Pipeline& pipeline_do, PipelineState& state, BwdProgress const& progress,
                           Range const& range, int num_steps, int n_block, int head_kv, int batch) const {
    if (num_steps == 0) { return; }
    // The consumers' last GEMMs of the previous tile have read K and V.
    if (progress.kv_loads > 0) { smem.barrier_kv_empty.wait((progress.kv_loads - 1) & 1); }
    Tensor mK = rows_of(params.tma_k.get_tma_tensor(params.shape_k)(_, _, head_kv, batch_coord(batch)), seq.offset_k(params));
    Tensor mV = rows_of(params.tma_v.get_tma_tensor(params.shape_k)(_, _, head_kv, batch_coord(batch)), seq.offset_k(params));
    Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(n_block, _0{}));
    Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(n_block, _0{}));
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), SmemLayoutK{});
    auto [tKgK, tKsK] = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto [tVgV, tVsV] = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    smem.barrier_kv.arrive_and_expect_tx(2 * kBytesK);
    copy(params.tma_k.with(reinterpret_cast<uint64_t&>(smem.barrier_kv)), tKgK, tKsK);
    copy(params.tma_v.with(reinterpret_cast<uint64_t&>(smem.barrier_kv)), tVgV, tVsV);

    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(smem.dout.data()), SmemLayoutQ{});
    Walk walk(params, range, n_block);
    for (int step = 0; step < num_steps; ++step, walk.advance()) {
      int const head = head_kv * params.q_heads_per_kv_head + walk.head_offset;
      int const m_block = walk.m_block;
      Tensor mQ = rows_of(params.tma_q.get_tma_tensor(params.shape_q)(_, _, head, batch_coord(batch)), seq.offset_q(params));
      Tensor mdO = rows_of(params.tma_do.get_tma_tensor(params.shape_q)(_, _, head, batch_coord(batch)), seq.offset_q(params));
      Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, _0{}));
      Tensor gdO = local_tile(mdO, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, _0{}));
      auto [tQgQ, tQsQ] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
      auto [tdOgdO, tdOsdO] =
          tma_partition(params.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
      int64_t const row = row_base(params, seq, batch, head) + m_block * kBlockM;
      pipeline.producer_acquire(state);
      uint64_t* const full = reinterpret_cast<uint64_t*>(pipeline.producer_get_barrier(state));
      copy(params.tma_q.with(*pipeline.producer_get_barrier(state)), tQgQ, tQsQ(_, state.index()));
      SM90_BULK_COPY_G2S::copy(params.lse_log2 + row, full, smem.lse2[state.index()], kBytesRow);
      if constexpr (kSplitQdO) {  // the two pipelines advance together: one state serves both
        pipeline_do.producer_acquire(state);
        uint64_t* const full_do = reinterpret_cast<uint64_t*>(pipeline_do.producer_get_barrier(state));
        copy(params.tma_do.with(*pipeline_do.producer_get_barrier(state)), tdOgdO, tdOsdO(_, state.index()));
        SM90_BULK_COPY_G2S::copy(params.dsum + row, full_do, smem.dsum[state.index()], kBytesRow);
      } else {
        copy(params.tma_do.with(*pipeline.producer_get_barrier(state)), tdOgdO, tdOsdO(_, state.index()));
        SM90_BULK_COPY_G2S::copy(params.dsum + row, full, smem.dsum[state.index()], kBytesRow);
      }
      ++state;
    }
  }

  // The shared-memory views both consumer paths read.
  CUTLASS_DEVICE static auto smem_views(SharedStorage& smem) {
    return cute::make_tuple(make_tensor(make_smem_ptr(smem.q.data()), SmemLayoutQ{}),        // sQ (M, D, stages)
                            make_tensor(make_smem_ptr(smem.q.data()), SmemLayoutQt{}),       // sQt (D, M, stages)
                            make_tensor(make_smem_ptr(smem.dout.data()), SmemLayoutQ{}),     // sdO
                            make_tensor(make_smem_ptr(smem.dout.data()), SmemLayoutQt{}),    // sdOt
                            make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutK{}),        // sK (N, D)
                            make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutKt{}),       // sKt (D, N)
                            make_tensor(make_smem_ptr(smem.v.data()), SmemLayoutK{}),        // sV
                            make_tensor(make_smem_ptr(smem.pds.dst.data()),
                                        std::conditional_t<kDsKMajor, SmemLayoutdStK, SmemLayoutPdSt>{}),  // sdSt (N, M, 2)
                            make_tensor(make_smem_ptr(smem.pds.dst.data()),
                                        std::conditional_t<kDsKMajor, SmemLayoutdSK, SmemLayoutdS>{}));  // sdS (M, N, 2)
  }

  // The steps' query blocks and query-head offsets, one step at a time: a tile's steps visit its
  // query block range once per query head of the KV head, starting at first_m_block and wrapping.
  // Advancing by one (rather than `step % count` and `step / count`, a run-time division per step
  // in the producer, the reducer and the consumers) [D:042].
  struct Walk {
    int lo, hi, first, m_block, head_offset;
    template <typename Params>
    CUTLASS_DEVICE Walk(Params const& params, Range const& range, int n_block)
        : lo(range.m_block_min),
          hi(range.m_block_max),
          first(range.count() > 0 ? first_m_block(params, range, n_block) : range.m_block_min),
          m_block(first),
          head_offset(0) {}
    CUTLASS_DEVICE void advance() {
      m_block = m_block + 1 == hi ? lo : m_block + 1;
      head_offset += m_block == first ? 1 : 0;  // a full round of the range: the next query head
    }
  };

  // The first step's query block. Were every key block's CTA to start at the first query block,
  // all CTAs of a non-causal head would add into the same dQ block at once; so CTA n_block starts
  // at query block n_block (modulo the range) and wraps [D:031]. Not in causal or windowed
  // problems, whose ranges start at the diagonal already, nor in deterministic mode, whose turns
  // assume the key order.
  template <typename Params>
  CUTLASS_DEVICE static int first_m_block(Params const& params, Range const& range,
                                          int n_block) {
    int index = 0;
    if constexpr (!kLocal) {
      if (params.dq_semaphore == nullptr) { index = n_block % range.count(); }
    }
    return range.m_block_min + index;
  }

  // Whether the mask hides a key of a step's (key block n0, query block m0) from a query, given
  // their offsets in the blocks: x = key - diag_key is > window_right or < -window_left, i.e.
  // x + window_left, taken as unsigned, exceeds window_left + window_right (both windows lie in
  // [0, seqlen_q + seqlen_k]). One add and one compare per element [D:042]. Varlen: keys at or
  // past the sequence's end (the next sequence's rows, not zeros as past a dense tensor's end)
  // are hidden too.
  struct StepMask {
    uint32_t base, width;
    int key_end;  // varlen: the sequence's end, as an offset from n0
    template <typename Params, typename Seq>
    CUTLASS_DEVICE StepMask(Params const& params, Seq const& seq, int n0, int m0)
        : base(uint32_t(n0 - m0 - seq.diag(params) + params.window_left)),
          width(uint32_t(params.window_left) + uint32_t(params.window_right)),
          key_end(kVarlen ? seq.seqlen_k(params) - n0 : 0) {}
    CUTLASS_DEVICE bool hides(int key_offset, int query_offset) const {
      if constexpr (kVarlen) {
        return base + uint32_t(key_offset - query_offset) > width || key_offset >= key_end;
      } else {
        return base + uint32_t(key_offset - query_offset) > width;
      }
    }
  };

  // Whether the (query block m0, key block n0) tile crosses a window edge (causal diagonal
  // included), or (varlen) the sequence's end, so that its elements need the mask.
  template <typename Params, typename Seq>
  CUTLASS_DEVICE static bool block_needs_mask(int m0, int n0, Params const& params, Seq const& seq) {
    if constexpr (kVarlen) {
      return (kLocal && (n0 + kBlockN - 1 > m0 + seq.diag(params) + params.window_right ||
                         n0 < m0 + kBlockM - 1 + seq.diag(params) - params.window_left)) ||
             n0 + kBlockN > seq.seqlen_k(params);
    } else {
      return kLocal && (n0 + kBlockN - 1 > m0 + seq.diag(params) + params.window_right ||
                        n0 < m0 + kBlockM - 1 + seq.diag(params) - params.window_left);
    }
  }

  // The consumer step loops (mainloop_ss.h, mainloop_rs.h): dK and dV accumulated over the tile's
  // steps, each step's dQ handed to the reducer, dK / dV stored by the epilogue.
  template <typename Params, typename Seq, typename DqReducer, typename Epilogue>
  CUTLASS_DEVICE void mma_ss(Params const& params, Seq const& seq, SharedStorage& smem, Pipeline& pipeline,
                             Pipeline& pipeline_do,
                             PipelineState& state, BwdProgress const& progress, Range const& range, int num_steps,
                             int n_block, int head_kv, int batch, int mma_tidx, DqReducer const& dq,
                             Epilogue const& epilogue) const;
  template <typename Params, typename Seq, typename DqReducer, typename Epilogue>
  CUTLASS_DEVICE void mma_rs(Params const& params, Seq const& seq, SharedStorage& smem, Pipeline& pipeline,
                             PipelineState& state,
                             BwdProgress const& progress, Range const& range, int num_steps, int n_block,
                             int head_kv, int batch, int mma_tidx, DqReducer const& dq,
                             Epilogue const& epilogue) const;
};

}  // namespace flash
