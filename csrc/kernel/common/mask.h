// Sequence-length, causal and window masks on a score tile, applied only to the key blocks that
// cross a boundary (block_range.h says which).
#pragma once

#include "kernel/common/config.h"

#include <cmath>
#include <type_traits>
#include <cute/tensor.hpp>

namespace flash {

using namespace cute;

// Row i (global) sees key j iff j < seqlen_k and, for local attention,
// i + diag - left <= j <= i + diag + right (causal: right = 0). check_lo: whether the left window
// edge can fall inside this block (BlockRange: n < n_unmasked_lo; never for causal masks).
template <bool kLocal, typename TensorS, typename TensorC>
CUTLASS_DEVICE void apply_mask(TensorS& s,         // (rows, cols) view of the score accumulator
                               TensorC const& c,   // same shape: (row, col) coordinates in the tile
                               int row0, int col0, int seqlen_k, int diag, int left, int right,
                               bool check_lo = true) {
  // Column offsets from this thread's first column are compile-time constants, so each element
  // compares a constant with a per-row bound taken relative to that column (no register per
  // column), and the left edge is tested only where it can fall in the block [D:011].
  int const col_base = get<1>(c(0, 0));
  auto mask_rows = [&](auto lo_too) CUTLASS_LAMBDA_FUNC_INLINE {
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < size<0>(s); ++r) {
      int hi = seqlen_k - col0 - col_base;  // exclusive, relative to this thread's first column
      int lo = 0;                           // inclusive
      if constexpr (kLocal) {
        int const diag_col = row0 + get<0>(c(r, 0)) + diag - col0 - col_base;
        hi = min(hi, diag_col + right + 1);
        lo = diag_col - left;
      }
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < size<1>(s); ++j) {
        int const offset = get<1>(c(r, j)) - col_base;
        bool masked = offset >= hi;
        if constexpr (decltype(lo_too)::value) { masked |= offset < lo; }
        if (masked) { s(r, j) = -INFINITY; }
      }
    }
  };
  if (kLocal && check_lo) {
    mask_rows(std::true_type{});
  } else {
    mask_rows(std::false_type{});
  }
}

}  // namespace flash
