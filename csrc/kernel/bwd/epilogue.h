// The backward epilogue: dK (scaled) and dV of the CTA's key block from the consumers'
// accumulators to global memory.
#pragma once

#include "kernel/common/config.h"

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>

#include "kernel/common/utils.h"

namespace flash {

using namespace cute;

template <typename Policy, typename TiledMmadKV>
struct BwdEpilogue {
  using Element = typename Policy::Element;
  static constexpr int kHeadDim = Policy::kHeadDim;
  static constexpr int kBlockN = Policy::kBlockN;

  // dK (scaled) and dV from registers: each quad of lanes trades pieces so that every lane stores
  // a whole 16-byte chunk, a quad 64 contiguous bytes of a row (the accumulator's own layout gave
  // 4-byte pieces of 8 rows per store instruction). Rows past seqlen_k and columns past the real
  // head dim are dropped. dk and dv are allocated by the binding (contiguous, rows 16-byte
  // aligned). A CTA that no query sees writes zeros.
  template <typename Params, typename Seq, typename TensorAcc>
  CUTLASS_DEVICE void store(Params const& params, Seq const& seq, TiledMmadKV const& mma_dkv, TensorAcc& tdKrdK,
                            TensorAcc& tdVrdV, int n_block, int head_kv, int batch, int mma_tidx) const {
    auto thr_dkv = mma_dkv.get_thread_slice(mma_tidx);
    Tensor tc = thr_dkv.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
    Tensor tc_rc = make_tensor(tc.data(), acc_layout_rowcol(tc.layout()));
    Tensor dk_rc = make_tensor(tdKrdK.data(), acc_layout_rowcol(tdKrdK.layout()));
    Tensor dv_rc = make_tensor(tdVrdV.data(), acc_layout_rowcol(tdVrdV.layout()));
    constexpr int kCols = decltype(size<1>(dk_rc))::value;
    static_assert(kCols % 8 == 0, "groups of 4 chunks of 8 columns per row");
    int const lane_in_quad = mma_tidx % 4;
    int const n0 = n_block * kBlockN;
    int64_t const row_stride = int64_t(params.heads_kv) * params.head_dim;  // dk, dv are contiguous
    // This head's rows of the batch entry, or (varlen) of the sequence in the packed (total_k, ...).
    int64_t const base = [&] {
      if constexpr (Policy::kVarlen) {
        return int64_t(seq.offset_k(params)) * row_stride + int64_t(head_kv) * params.head_dim;
      } else {
        return (int64_t(batch) * params.seqlen_k) * row_stride + int64_t(head_kv) * params.head_dim;
      }
    }();
    // kNarrowV: dv's rows have v's head dim.
    int64_t const row_stride_v = int64_t(params.heads_kv) * params.head_dim_v;
    auto base_v = [&] {
      int64_t const first_key = Policy::kVarlen ? int64_t(seq.offset_k(params)) : int64_t(batch) * params.seqlen_k;
      return first_key * row_stride_v + int64_t(head_kv) * params.head_dim_v;
    };
    auto pack = [](float x, float y) {
      Element pair[2] = {Element(x), Element(y)};
      return *reinterpret_cast<uint32_t*>(pair);
    };
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < size<0>(dk_rc); ++r) {
      int const key = n0 + get<0>(tc_rc(r, 0));
      CUTLASS_PRAGMA_UNROLL
      for (int g = 0; g < kCols; g += 8) {
        uint32_t dk_words[4], dv_words[4];
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < 4; ++k) {
          dk_words[k] = pack(dk_rc(r, g + 2 * k) * params.softmax_scale, dk_rc(r, g + 2 * k + 1) * params.softmax_scale);
          dv_words[k] = pack(dv_rc(r, g + 2 * k), dv_rc(r, g + 2 * k + 1));
        }
        uint4 const dk_chunk = quad_transpose(dk_words, lane_in_quad);
        uint4 const dv_chunk = quad_transpose(dv_words, lane_in_quad);
        // Column g of this thread is 2 * lane_in_quad into the group's first chunk.
        int const col = get<1>(tc_rc(r, g)) - 2 * lane_in_quad + 8 * lane_in_quad;
        if constexpr (Policy::kNarrowV) {
          if (key < seq.seqlen_k(params)) {  // head dims are multiples of 8
            if (col < params.head_dim) {
              *reinterpret_cast<uint4*>(params.dk + base + int64_t(key) * row_stride + col) = dk_chunk;
            }
            if (col < params.head_dim_v) {
              *reinterpret_cast<uint4*>(params.dv + base_v() + int64_t(key) * row_stride_v + col) = dv_chunk;
            }
          }
        } else if (key < seq.seqlen_k(params) && col < params.head_dim) {  // head dims are multiples of 8
          int64_t const offset = base + int64_t(key) * row_stride + col;
          *reinterpret_cast<uint4*>(params.dk + offset) = dk_chunk;
          *reinterpret_cast<uint4*>(params.dv + offset) = dv_chunk;
        }
      }
    }
  }
};

}  // namespace flash
