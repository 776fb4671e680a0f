// Online softmax of one consumer thread's rows, in the exp2 domain.
//
// Scores S = Q.K^T arrive unscaled. With c = softmax_scale * log2(e), the kernel keeps the
// running row max m (of the raw scores) and computes p = exp2(s * c - m * c): one FFMA and one
// MUFU.EX2 per element. A row's max is moved only when a block's scores exceed it by more than
// kMaxSlack (exp2 domain), so p may reach 2^kMaxSlack: still exact maths (sum, O and LSE use the
// same max), and O is rescaled only when some row of the warp moved its max [D:009].
// Max-free blocks go further (block_without_max): after the tile's first full unmasked block, p
// is computed with the current max without searching the block's max; a warpgroup in which some
// p could exceed the slack computes S again and searches it [D:010].
#pragma once

#include "kernel/common/config.h"

#include <cfloat>
#include <cmath>
#include <cute/tensor.hpp>

#include "kernel/common/utils.h"

namespace flash {

using namespace cute;

constexpr float kMaxSlack = 8.f;

// kMaxOffset (FP8): p = exp2(s * c - m * c + kMaxOffset), so that P uses e4m3's range up to
// 2^kMaxOffset; the sum carries the same factor (it cancels in O) and the LSE drops it. The lazy
// slack is then what is left of the range: 2^(8 + 0.8) = 445.7 <= 448, e4m3's largest.
// kPositiveScale: the scale is clamped at FLT_MIN (see the constructor), which next_block's
// unchecked blocks need.
template <int kRows, int kMaxOffset = 0, bool kPositiveScale = false>
struct OnlineSoftmax {
  static constexpr float kSlack = kMaxOffset == 0 ? kMaxSlack : 0.8f;
  static_assert(kMaxOffset == 0 || kMaxOffset == 8, "kSlack is e4m3's range past 2^8");
  Tensor<ArrayEngine<float, kRows>, Layout<Int<kRows>>> row_max;
  Tensor<ArrayEngine<float, kRows>, Layout<Int<kRows>>> row_sum;  // per-thread partial sums
  float const scale_log2;

  // kPositiveScale: an FP8 descale of 0 (or a negative or NaN one) would make the scale 0 or worse;
  // clamped, a masked score's -inf * scale_log2 stays -inf (not NaN), which the unchecked blocks of
  // next_block rely on too.
  CUTLASS_DEVICE explicit OnlineSoftmax(float scale_log2_)
      : scale_log2(kPositiveScale ? fmaxf(scale_log2_, FLT_MIN) : scale_log2_) {}

  // A row whose max is -inf has seen only masked scores: subtract 0 so exp2 gives 0, not NaN.
  // kCheckInf = false: the caller knows m is finite.
  template <bool kCheckInf = true>
  CUTLASS_DEVICE float scaled_max(float m) const {
    float const scaled = kMaxOffset != 0 ? m * scale_log2 - float(kMaxOffset) : m * scale_log2;
    return kCheckInf && m == -INFINITY ? 0.f : scaled;
  }

  // p = exp2(s * c - m_scaled) over row r of s, in place; returns the row's partial sum.
  template <typename TensorS>
  CUTLASS_DEVICE float exponentiate_row(TensorS& s, int r, float m_scaled) const {
    float sum = 0.f;
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < size<1>(s); ++c) {
      s(r, c) = exp2f(s(r, c) * scale_log2 - m_scaled);
      sum += s(r, c);
    }
    return sum;
  }

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
      row_sum(r) = exponentiate_row(s, r, scaled_max(m));
    }
  }

  // A later block: update the max; `rescale` receives the per-row factors for O. Returns whether
  // any factor differs from 1. kExact: take the block's max even when it moves by less than the
  // lazy slack (kernels with max-free blocks: those need a max close to the true one).
  // kCheckInf = false (a block that no row of the tile sees masked): every score is finite, so the
  // new max is, and an old max of -inf gives the factor exp2(-inf) = 0 without a test (FA3's);
  // it needs kPositiveScale.
  template <bool kExact = false, bool kCheckInf = true, typename TensorS, typename TensorR>
  CUTLASS_DEVICE bool next_block(TensorS& s, TensorR& rescale) {
    static_assert(kCheckInf || kPositiveScale, "unchecked blocks need a positive scale");
    bool moved = false;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float m = row_max(r);
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<1>(s); ++c) { m = fmaxf(m, s(r, c)); }
      m = quad_allreduce(m, MaxOp{});
      if constexpr (!kExact) {
        // Keep the old max unless the new one is more than kSlack above it (an old max of
        // -inf is always replaced by a finite one; -inf - -inf is NaN: kept, p = 0).
        if (!(m * scale_log2 - row_max(r) * scale_log2 > kSlack)) { m = row_max(r); }
      }
      float const m_scaled = scaled_max<kCheckInf>(m);
      // Nothing seen before (old max -inf): O and the sum are 0, so the factor is 0 (never inf*0).
      // Otherwise the new max is finite too and the factor is exp2 of a non-positive number.
      float const factor = kCheckInf && row_max(r) == -INFINITY ? 0.f
                           : kMaxOffset == 0                     ? exp2f(row_max(r) * scale_log2 - m_scaled)
                                                                 : exp2f((row_max(r) - m) * scale_log2);
      bool const row_moved = m != row_max(r);
      rescale(r) = row_moved ? factor : 1.f;
      moved |= row_moved;
      row_max(r) = m;
      row_sum(r) = row_sum(r) * rescale(r) + exponentiate_row(s, r, m_scaled);
    }
    return moved;
  }

  // A later block without the max search (kMaxFree): p = exp2(s * c - m * c) with every row's
  // current max m. That is the lazy rule's result whenever no p exceeds 2^kMaxSlack, which holds
  // if each thread's partial sum of each row is at most 2^kMaxSlack; rows without a finite max
  // never qualify. Returns whether that holds for this thread's rows; `sums` receives the
  // partial sums. The caller takes the verdict of the whole warpgroup (the WGMMA that computes S
  // again is a warpgroup instruction): if every thread fits, the max did not move (no rescale)
  // and add_sums completes the block; otherwise s holds garbage, S is computed again and goes
  // through next_block.
  template <typename TensorS, typename TensorSum>
  CUTLASS_DEVICE bool block_without_max(TensorS& s, TensorSum& sums) const {
    bool fits = true;
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float const sum = exponentiate_row(s, r, row_max(r) * scale_log2);
      sums(r) = sum;
      fits &= sum <= kMaxSum && row_max(r) != -INFINITY;  // false for NaN
    }
    return fits;
  }
  template <typename TensorSum>
  CUTLASS_DEVICE void add_sums(TensorSum const& sums) {
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) { row_sum(r) += sums(r); }
  }
  static constexpr float kMaxSum = 256.f;  // 2^kMaxSlack
  static_assert(kMaxSlack == 8.f);

  // Whether the warp has O to rescale: a warp-uniform answer, so that the branch around the
  // multiplies does not diverge.
  CUTLASS_DEVICE static bool warp_needs_rescale(bool moved) {
    return __any_sync(0xffffffffu, moved);
  }

  template <typename TensorO, typename TensorR>
  CUTLASS_DEVICE static void rescale_o(TensorO& o /* (rows, cols) */, TensorR const& rescale) {
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<1>(o); ++c) { o(r, c) *= rescale(r); }
    }
  }

  // finalize's LSE and O's per-row factors (o_scale / sum) without touching O: they need only the
  // sums, so a caller may compute them while the last P.V still runs and scale O after it. finalize
  // keeps its own copy of these rows: written through a shared helper, ptxas orders the default
  // kernels' epilogue differently (SASS of every forward kernel changes).
  template <typename TensorL, typename TensorF>
  CUTLASS_DEVICE void finalize_factors(float softmax_scale, TensorL& lse, float sink, TensorF& factor,
                                       float o_scale) {
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float const sum = quad_allreduce(row_sum(r), SumOp{});
      bool const empty = !(sum > 0.f);  // also catches NaN
      float inv = empty ? 0.f : o_scale / sum;
      float l = empty ? -INFINITY : row_max(r) * softmax_scale + logf(sum);
      if constexpr (kMaxOffset != 0) { l -= float(kMaxOffset) * float(M_LN2); }
      if (sink > -INFINITY) {
        float const hi = fmaxf(l, sink);
        float const with_sink = hi + log1pf(expf(-fabsf(l - sink)));
        inv *= expf(l - with_sink);  // 0 for an empty row (l = -inf)
        l = with_sink;
      }
      lse(r) = l;
      factor(r) = inv;
    }
  }

  // End of the tile: normalise O, return the natural-log LSE per row (-inf for empty rows,
  // whose O becomes 0). A learnable sink (natural log; -inf: none) is one more term e^{sink} in
  // every row's denominator that carries no value: LSE' = log(e^{LSE} + e^{sink}) and O is scaled
  // by e^{LSE - LSE'}; an empty row gets LSE' = sink. Per-row scalars only, under a branch uniform
  // over the tile, so the kernels without a sink keep their code.
  template <typename TensorO, typename TensorL>
  CUTLASS_DEVICE void finalize(TensorO& o, float softmax_scale, TensorL& lse, float sink = -INFINITY) {
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float const sum = quad_allreduce(row_sum(r), SumOp{});
      bool const empty = !(sum > 0.f);  // also catches NaN
      float inv = empty ? 0.f : 1.f / sum;
      float l = empty ? -INFINITY : row_max(r) * softmax_scale + logf(sum);
      if constexpr (kMaxOffset != 0) { l -= float(kMaxOffset) * float(M_LN2); }
      if (sink > -INFINITY) {
        float const hi = fmaxf(l, sink);
        float const with_sink = hi + log1pf(expf(-fabsf(l - sink)));
        inv *= expf(l - with_sink);  // 0 for an empty row (l = -inf)
        l = with_sink;
      }
      lse(r) = l;
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<1>(o); ++c) { o(r, c) *= inv; }
    }
  }
};

}  // namespace flash
