// The forward epilogue: O from the consumers' registers to global memory, through shared memory
// and a TMA store (which clips rows past seqlen_q and columns past the real head dim), or
// (kDirectO) straight from registers in 16-byte stores; the LSE per row.
#pragma once

#include "kernel/common/config.h"

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>

#include "kernel/common/named_barriers.h"
#include "kernel/common/utils.h"
#include "kernel/fwd/shared_storage.h"

namespace flash {

using namespace cute;

// kDirectO: where O goes when it skips shared memory.
template <typename Element>
struct DirectOArgs {
  Element* ptr;
  int64_t row_stride, head_stride, batch_stride;
};
struct NoDirectO {};

// Split-KV kernels (FwdPolicy::kSplit): where the partial O and LSE go (FwdParams' oaccum / lseaccum).
struct SplitArgs {
  float* oaccum;
  float* lseaccum;
  int num_splits;
  int64_t o_split_stride, o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_split_stride;
};
struct NoSplit {};

template <typename Policy, typename TiledMmaPV>
struct FwdEpilogue {
  using Element = typename Policy::OutElement;  // O's: the inputs', or (kFp8) bf16
  static constexpr int kHeadDim = Policy::kHeadDimO;  // O's columns per warpgroup: V's head dim, or (kSharedRows) half
  static constexpr bool kSameV = Policy::kHeadDimV == Policy::kHeadDim;
  static constexpr int kBlockM = Policy::kBlockM;
  static constexpr int kNumMmaWarpGroups = kBlockM / 64;
  static constexpr bool kSeparateO = Policy::kSeparateO;
  static constexpr bool kDirectO = Policy::kDirectO;
  // kSeparateO: the thread that issued a tile's O store waits for the store to have read shared
  // memory only when the next tile's O is about to be written there [D:013].
  static constexpr bool kLazyStore = Policy::kSeparateO;

  using Layouts = FwdSmemLayouts<Policy>;
  using SharedStorage = FwdSharedStorage<Policy>;
  using SmemLayoutO = typename Layouts::SmemLayoutO;  // O's staging: Q's buffer, or its own
  using SmemLayoutO64 = typename Layouts::SmemLayoutO64;
  using ShapeQKV = Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideQKV = Stride<int64_t, _1, int64_t, int64_t>;
  using TmaO = decltype(make_tma_copy(
      SM90_TMA_STORE{}, make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)), ShapeQKV{}, StrideQKV{}),
      SmemLayoutO64{}, Shape<_64, Int<kHeadDim>>{}, _1{}));
  using DirectO = std::conditional_t<kDirectO, DirectOArgs<Element>, NoDirectO>;

  // O's global shape (rows, head dim, heads, batch): Q's, or (dv != d) its own.
  template <typename Params>
  CUTLASS_DEVICE static auto const& shape_o(Params const& params) {
    if constexpr (kSameV) {
      return params.shape_q;
    } else {
      return params.shapes_v.o;
    }
  }

  // kDirectO: O straight to global memory in 16-byte stores. A quad of lanes holds a row's 8-column
  // chunks in pairs (lane q: columns 2q, 2q + 1 of every chunk); a 4 x 4 transpose across the quad
  // (utils.h quad_transpose, two butterfly steps) leaves lane q the whole chunk 4g + q of each group of four
  // chunks. Rows past seqlen_q and chunks past the real head dim (a multiple of 8) are left out.
  template <typename Params, typename Seq, typename TensorO>
  CUTLASS_DEVICE void store_o_direct(Params const& params, Seq const& seq, TiledMmaPV const& tiled_mma_pv,
                                     TensorO const& tOrO_out,
                                     int m_block, int head, int batch, int mma_tidx, int slice) const {
    static_assert(kHeadDim % 32 == 0, "groups of four 8-column chunks");
    auto thr_mma_pv = tiled_mma_pv.get_thread_slice(mma_tidx);
    Tensor tOcO = thr_mma_pv.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    Tensor tOcO_rc = make_tensor(tOcO.data(), acc_layout_rowcol(tOcO.layout()));
    Tensor tOrO_rc = make_tensor(tOrO_out.data(), acc_layout_rowcol(tOrO_out.layout()));
    constexpr int kCols = decltype(size<1>(tOrO_rc))::value;  // pairs of 2: kCols / 2 chunks
    static_assert(kCols % 8 == 0);
    int const head_dim = get<1>(shape_o(params)) - slice * kHeadDim;  // this slice's real columns
    int const quad_lane = threadIdx.x % 4;
    Element* o_head;  // this head's rows of the batch entry, or of the sequence, from the slice's first column
    if constexpr (Policy::kVarlen) {
      o_head = params.direct_o.ptr + int64_t(seq.offset_q(params)) * params.direct_o.row_stride +
               int64_t(head) * params.direct_o.head_stride;
    } else {
      o_head = params.direct_o.ptr + int64_t(batch) * params.direct_o.batch_stride +
               int64_t(head) * params.direct_o.head_stride;
    }
    o_head += slice * kHeadDim;
    auto pack = [&](int r, int c) {
      cutlass::Array<Element, 2> pair;
      pair[0] = tOrO_rc(r, c);
      pair[1] = tOrO_rc(r, c + 1);
      return reinterpret_cast<uint32_t const&>(pair);
    };
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < size<0>(tOrO_rc); ++r) {
      int const row = m_block * kBlockM + get<0>(tOcO_rc(r, 0));
      Element* const o_row = o_head + int64_t(row) * params.direct_o.row_stride;
      CUTLASS_PRAGMA_UNROLL
      for (int g = 0; g < kCols / 8; ++g) {
        uint32_t a[4];
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < 4; ++i) { a[i] = pack(r, 8 * g + 2 * i); }
        if constexpr (Policy::kFp8) {
          // fp8.h's O layout: lane q holds columns 4q..4q + 3 of each 16 (pairs a[0], a[1] and a[2], a[3],
          // interleaved): two 8-byte stores, no shuffles.
          int const col = get<1>(tOcO_rc(r, 8 * g)) + 2 * quad_lane;  // 32 g + 4 q
          uint2 const lo{__byte_perm(a[0], a[1], 0x5410), __byte_perm(a[0], a[1], 0x7632)};
          uint2 const hi{__byte_perm(a[2], a[3], 0x5410), __byte_perm(a[2], a[3], 0x7632)};
          if (row < seq.seqlen_q(params) && col < head_dim) { *reinterpret_cast<uint2*>(o_row + col) = lo; }
          if (row < seq.seqlen_q(params) && col + 16 < head_dim) { *reinterpret_cast<uint2*>(o_row + col + 16) = hi; }
          continue;
        }
        uint4 const chunk = quad_transpose(a, quad_lane);  // utils.h
        // Chunk 4g + q starts 8 q columns after chunk 4g, whose first column lane 0 holds.
        int const col = get<1>(tOcO_rc(r, 8 * g)) - 2 * quad_lane + 8 * quad_lane;
        if (row < seq.seqlen_q(params) && col < head_dim) { *reinterpret_cast<uint4*>(o_row + col) = chunk; }
      }
    }
  }

  // kSplit: this split's O (normalised by its own softmax) as float32 pairs straight from
  // registers, and its LSE, into the split's slice of the partial buffers (SplitArgs). Rows past
  // seqlen_q and columns past the real head dim are left out.
  template <typename Params, typename Seq, typename TensorO, typename TensorL>
  CUTLASS_DEVICE void store_partial(Params const& params, Seq const& seq, TiledMmaPV const& tiled_mma_pv,
                                    TensorO const& tOrO, TensorL const& lse, int m_block, int head, int batch,
                                    int split, int mma_tidx, int slice) const {
    auto const& sp = params.split;
    auto thr_mma_pv = tiled_mma_pv.get_thread_slice(mma_tidx);
    Tensor tOcO = thr_mma_pv.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    Tensor tOcO_rc = make_tensor(tOcO.data(), acc_layout_rowcol(tOcO.layout()));
    Tensor tOrO_rc = make_tensor(tOrO.data(), acc_layout_rowcol(tOrO.layout()));
    int const head_dim = get<1>(shape_o(params)) - slice * kHeadDim;
    // Varlen: the sequence's rows of the packed (splits, total_q, heads, d) buffer.
    int64_t const first_row = Policy::kVarlen ? int64_t(seq.offset_q(params)) * sp.o_row_stride
                                              : int64_t(batch) * sp.o_batch_stride;
    float* const o_head =
        sp.oaccum + split * sp.o_split_stride + first_row + int64_t(head) * sp.o_head_stride + slice * kHeadDim;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < size<0>(tOrO_rc); ++r) {
      int const row = m_block * kBlockM + get<0>(tOcO_rc(r, 0));
      if (row >= seq.seqlen_q(params)) { continue; }
      float* const o_row = o_head + int64_t(row) * sp.o_row_stride;
      if constexpr (Policy::kFp8) {  // fp8.h's O layout: columns 4q..4q + 3 of each 16, interleaved
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(tOrO_rc); c += 4) {
          int const col = get<1>(tOcO_rc(r, c)) + 2 * (threadIdx.x % 4);  // 16 h + 4 q
          if (col < head_dim) {
            *reinterpret_cast<float4*>(o_row + col) =
                make_float4(tOrO_rc(r, c), tOrO_rc(r, c + 2), tOrO_rc(r, c + 1), tOrO_rc(r, c + 3));
          }
        }
        continue;
      }
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<1>(tOrO_rc); c += 2) {  // a thread holds columns in adjacent pairs
        int const col = get<1>(tOcO_rc(r, c));
        if (col < head_dim) { *reinterpret_cast<float2*>(o_row + col) = make_float2(tOrO_rc(r, c), tOrO_rc(r, c + 1)); }
      }
    }
    if (get<1>(tOcO_rc(0, 0)) == 0 && slice == 0) {  // one lane of each quad (and slice) holds a row's LSE
      float* lse_row = sp.lseaccum + split * sp.lse_split_stride;  // as the LSE's layout, per split
      if constexpr (Policy::kVarlen) {
        lse_row += int64_t(head) * params.varlen.total_q + seq.offset_q(params);
      } else {
        lse_row += (int64_t(batch) * params.heads_q + head) * params.seqlen_q;
      }
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < size(lse); ++r) {
        int const row = m_block * kBlockM + get<0>(tOcO_rc(r, 0));
        if (row < seq.seqlen_q(params)) { lse_row[row] = lse(r); }
      }
    }
  }

  // O goes registers -> shared memory (the O buffer, or this warpgroup's own Q rows, no longer
  // read) -> TMA store, which clips rows past seqlen_q and columns past the real head dim. LSE goes
  // straight out.
  template <typename Params, typename Seq, typename TensorO, typename TensorL>
  CUTLASS_DEVICE void store(Params const& params, Seq const& seq, SharedStorage& smem, TiledMmaPV const& tiled_mma_pv,
                            TensorO const& tOrO, TensorL const& lse, int m_block, int head, int batch, int mma_tidx,
                            int wg, int split = 0, int slice = 0) const {
    if constexpr (Policy::kSplit) {
      store_partial(params, seq, tiled_mma_pv, tOrO, lse, m_block, head, batch, split, mma_tidx, slice);
      return;
    }
    Tensor tOrO_out = make_tensor<Element>(tOrO.layout());
    convert_into(tOrO, tOrO_out);
    int const warp_idx_in_wg = (threadIdx.x / 32) % 4;
    if constexpr (kDirectO) {
      store_o_direct(params, seq, tiled_mma_pv, tOrO_out, m_block, head, batch, mma_tidx, slice);
    } else {
      if constexpr (kLazyStore) {
        // The previous O store of this warpgroup has read the buffer before anyone writes it.
        if (warp_idx_in_wg == 0 && cute::elect_one_sync()) { tma_store_wait<0>(); }
        cutlass::arch::NamedBarrier::sync(128, static_cast<int>(FwdNamedBarrier::kEpilogueWG1) + wg);
      }
      auto smem_tiled_copy_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, tiled_mma_pv);
      auto smem_thr_copy_o = smem_tiled_copy_o.get_thread_slice(mma_tidx);
      Element* const o_buffer = smem.o_data();
      Tensor sO = make_tensor(make_smem_ptr(o_buffer), SmemLayoutO{});
      Tensor taccOrO = smem_thr_copy_o.retile_S(tOrO_out);
      Tensor taccOsO = smem_thr_copy_o.partition_D(sO);
      copy(smem_tiled_copy_o, taccOrO, taccOsO);
      cutlass::arch::fence_view_async_shared();  // generic-proxy writes, seen by the TMA engine
      cutlass::arch::NamedBarrier::sync(128, static_cast<int>(FwdNamedBarrier::kEpilogueWG1) + wg);

      if (warp_idx_in_wg == 0 && cute::elect_one_sync()) {
        Tensor mO = params.tma_o.get_tma_tensor(shape_o(params))(_, _, head, batch);
        Tensor gO = local_tile(mO, Shape<_64, Int<kHeadDim>>{}, make_coord(m_block * kNumMmaWarpGroups + wg, _0{}));
        Tensor sOwg = make_tensor(make_smem_ptr(o_buffer + wg * 64 * kHeadDim), SmemLayoutO64{});
        auto [tOgO, tOsO] = tma_partition(params.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sOwg), group_modes<0, 2>(gO));
        copy(params.tma_o, tOsO, tOgO);
        tma_store_arrive();
        if constexpr (!kLazyStore) { tma_store_wait<0>(); }  // the store has read shared memory (Q's, or the O buffer)
        if constexpr (!kSeparateO) { smem.barrier_q_empty.arrive(); }  // the producer may refill Q
      }
    }

    // One lane of each quad (of the first O slice) holds a row's LSE.
    auto thr_mma_pv = tiled_mma_pv.get_thread_slice(mma_tidx);
    Tensor tOcO = thr_mma_pv.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    Tensor tOcO_rc = make_tensor(tOcO.data(), acc_layout_rowcol(tOcO.layout()));
    if (get<1>(tOcO_rc(0, 0)) == 0 && slice == 0) {
      float* lse_row;  // (batch, heads_q, seqlen_q), or varlen (heads_q, total_q)
      if constexpr (Policy::kVarlen) {
        lse_row = params.lse + int64_t(head) * params.varlen.total_q + seq.offset_q(params);
      } else {
        lse_row = params.lse + (int64_t(batch) * params.heads_q + head) * params.seqlen_q;
      }
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < size(lse); ++r) {
        int const row = m_block * kBlockM + get<0>(tOcO_rc(r, 0));
        if (row < seq.seqlen_q(params)) { lse_row[row] = lse(r); }
      }
    }
  }
};

}  // namespace flash
