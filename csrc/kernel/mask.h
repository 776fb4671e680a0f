// Sequence-length and causal masks, applied only to the key blocks that cross a boundary.
#pragma once

#include "kernel/config.h"

#include <cmath>
#include <cute/tensor.hpp>

namespace flash {

using namespace cute;

// Causal is bottom-right aligned: query row i sees key j iff j <= i + (seqlen_k - seqlen_q).
template <bool kCausal, typename TensorS, typename TensorC>
CUTLASS_DEVICE void apply_mask(TensorS& s,         // (rows, cols) view of the score accumulator
                               TensorC const& c,   // same shape: (row, col) coordinates in the tile
                               int row0, int col0, int seqlen_k, int causal_offset) {
  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < size<0>(s); ++r) {
    int col_limit = seqlen_k - col0;  // exclusive, relative to this block
    if constexpr (kCausal) {
      col_limit = min(col_limit, row0 + get<0>(c(r, 0)) + causal_offset + 1 - col0);
    }
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < size<1>(s); ++j) {
      if (get<1>(c(r, j)) >= col_limit) { s(r, j) = -INFINITY; }
    }
  }
}

// Which key blocks one query tile visits, and from which block downwards no mask is needed.
template <int kBlockM, int kBlockN, bool kCausal>
struct BlockRange {
  int n_block_max;       // exclusive; 0 means the tile attends to nothing
  int n_block_unmasked;  // blocks n < this need no mask at all

  CUTLASS_DEVICE BlockRange(int m_block, int seqlen_q, int seqlen_k) {
    n_block_max = (seqlen_k + kBlockN - 1) / kBlockN;
    n_block_unmasked = seqlen_k / kBlockN;  // the partial last block needs the seqlen mask
    if constexpr (kCausal) {
      int const offset = seqlen_k - seqlen_q;
      // Exclusive key limit of the tile's last real row.
      int const last_row_limit = min((m_block + 1) * kBlockM, seqlen_q) + offset;
      n_block_max = min(n_block_max, last_row_limit <= 0 ? 0 : (last_row_limit + kBlockN - 1) / kBlockN);
      // Blocks entirely at or left of the first row's diagonal are unmasked.
      int const first_row_limit = m_block * kBlockM + offset + 1;
      n_block_unmasked = min(n_block_unmasked, first_row_limit <= 0 ? 0 : first_row_limit / kBlockN);
    }
  }
};

}  // namespace flash
