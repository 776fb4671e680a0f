// Online softmax of one consumer thread's rows, in the exp2 domain.
//
// Scores S = Q.K^T arrive unscaled. With c = softmax_scale * log2(e), the kernel keeps the
// running row max m (of the raw scores) and computes p = exp2(s * c - m * c): one FFMA and one
// MUFU.EX2 per element. O is rescaled only by the factor that the max moved, and only when it
// moved: next_block reports whether any of this thread's rows did, the kernel skips the
// multiplies when no thread of the warp needs them (a warp-uniform branch).
//
// kRescale (developer knob FLASH_FWD_DEV_RESCALE): 0 multiplies O every block; 1 skips when no
// row of the warp moved (exact: the factors are all 1); 2 also keeps a row's max where it is
// unless the new one exceeds it by more than kMaxSlack in the exp2 domain, so that p may reach
// 2^kMaxSlack: still exact maths (sum and O use the same stale max, LSE = max + log(sum)), and
// bf16 rounds p with the same relative error at any magnitude.
#pragma once

#include "kernel/config.h"

#include <cmath>
#include <cute/tensor.hpp>

#include "utils.h"

namespace flash {

using namespace cute;

#ifndef FLASH_FWD_DEV_RESCALE
#define FLASH_FWD_DEV_RESCALE 0
#endif
constexpr int kRescale = FLASH_FWD_DEV_RESCALE;
constexpr float kMaxSlack = 8.f;

template <int kRows>
struct OnlineSoftmax {
  Tensor<ArrayEngine<float, kRows>, Layout<Int<kRows>>> row_max;
  Tensor<ArrayEngine<float, kRows>, Layout<Int<kRows>>> row_sum;  // per-thread partial sums
  float const scale_log2;

  CUTLASS_DEVICE explicit OnlineSoftmax(float scale_log2_) : scale_log2(scale_log2_) {}

  // A row whose max is -inf has seen only masked scores: subtract 0 so exp2 gives 0, not NaN.
  CUTLASS_DEVICE float scaled_max(float m) const { return m == -INFINITY ? 0.f : m * scale_log2; }

  // First block of a tile: set max and sum, turn scores into unnormalised probabilities.
  template <typename TensorS>
  CUTLASS_DEVICE void first_block(TensorS& s /* (rows, cols) view of the accumulator */) {
    static_assert(decltype(size<0>(s))::value == kRows);
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float m = -INFINITY;
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<1>(s); ++c) { m = fmaxf(m, s(r, c)); }
      m = quad_allreduce(m, MaxOp{});
      row_max(r) = m;
      float const m_scaled = scaled_max(m);
      float sum = 0.f;
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<1>(s); ++c) {
        s(r, c) = exp2f(s(r, c) * scale_log2 - m_scaled);
        sum += s(r, c);
      }
      row_sum(r) = sum;
    }
  }

  // A later block: update the max; `rescale` receives the per-row factors for O. Returns whether
  // any factor differs from 1.
  template <typename TensorS, typename TensorR>
  CUTLASS_DEVICE bool next_block(TensorS& s, TensorR& rescale) {
    bool moved = false;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float m = row_max(r);
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<1>(s); ++c) { m = fmaxf(m, s(r, c)); }
      m = quad_allreduce(m, MaxOp{});
      if constexpr (kRescale == 2) {
        // Keep the old max unless the new one is more than kMaxSlack above it (an old max of
        // -inf is always replaced by a finite one; -inf - -inf is NaN: kept, p = 0).
        if (!(m * scale_log2 - row_max(r) * scale_log2 > kMaxSlack)) { m = row_max(r); }
      }
      float const m_scaled = scaled_max(m);
      // Nothing seen before (old max -inf): O and the sum are 0, so the factor is 0 (never inf*0).
      // Otherwise the new max is finite too and the factor is exp2 of a non-positive number.
      float const factor = row_max(r) == -INFINITY ? 0.f : exp2f(row_max(r) * scale_log2 - m_scaled);
      if constexpr (kRescale == 0) {
        rescale(r) = factor;
      } else {
        bool const row_moved = m != row_max(r);
        rescale(r) = row_moved ? factor : 1.f;
        moved |= row_moved;
      }
      row_max(r) = m;
      float sum = 0.f;
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<1>(s); ++c) {
        s(r, c) = exp2f(s(r, c) * scale_log2 - m_scaled);
        sum += s(r, c);
      }
      row_sum(r) = row_sum(r) * rescale(r) + sum;
    }
    return moved;
  }

  // Whether the warp has O to rescale: a warp-uniform answer, so that the branch around the
  // multiplies does not diverge.
  CUTLASS_DEVICE static bool warp_needs_rescale(bool moved) {
    if constexpr (kRescale == 0) {
      return true;
    } else {
      return __any_sync(0xffffffffu, moved);
    }
  }

  template <typename TensorO, typename TensorR>
  CUTLASS_DEVICE static void rescale_o(TensorO& o /* (rows, cols) */, TensorR const& rescale) {
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<1>(o); ++c) { o(r, c) *= rescale(r); }
    }
  }

  // End of the tile: normalise O, return the natural-log LSE per row (-inf for empty rows,
  // whose O becomes 0).
  template <typename TensorO, typename TensorL>
  CUTLASS_DEVICE void finalize(TensorO& o, float softmax_scale, TensorL& lse) {
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float const sum = quad_allreduce(row_sum(r), SumOp{});
      bool const empty = !(sum > 0.f);  // also catches NaN
      float const inv = empty ? 0.f : 1.f / sum;
      lse(r) = empty ? -INFINITY : row_max(r) * softmax_scale + logf(sum);
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<1>(o); ++c) { o(r, c) *= inv; }
    }
  }
};

}  // namespace flash
