// Which key blocks a forward query tile visits and which a backward key block's query blocks
// are, with the blocks that need a mask. Host and device: tests/host checks them on the CPU.
#pragma once

#include "kernel/common/config.h"

#include <cutlass/cutlass.h>

namespace flash {

CUTLASS_HOST_DEVICE int floor_div(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
CUTLASS_HOST_DEVICE int ceil_div_int(int a, int b) { return -floor_div(-a, b); }

// Which key blocks one query tile visits, and which of them need a mask. Blocks are visited
// from n_block_max - 1 down to n_block_min; block n needs the mask iff
// n >= n_unmasked_hi (seqlen end or right window edge) or n < n_unmasked_lo (left window edge).
template <int kBlockM, int kBlockN, bool kLocal>
struct BlockRange {
  int n_block_min;
  int n_block_max;  // exclusive; n_block_max <= n_block_min means the tile attends to nothing
  int n_unmasked_lo;
  int n_unmasked_hi;

  CUTLASS_HOST_DEVICE BlockRange(int m_block, int seqlen_q, int seqlen_k, int diag, int left, int right) {
    auto fdiv = [](int a) { return floor_div(a, kBlockN); };
    auto cdiv = [](int a) { return ceil_div_int(a, kBlockN); };
    n_block_min = 0;
    n_block_max = cdiv(seqlen_k);
    n_unmasked_lo = 0;
    n_unmasked_hi = seqlen_k / kBlockN;  // the partial last block needs the seqlen mask
    if constexpr (kLocal) {
      int const first_row = m_block * kBlockM;
      int const last_row = min((m_block + 1) * kBlockM, seqlen_q) - 1;
      n_block_max = min(n_block_max, max(0, cdiv(last_row + diag + right + 1)));
      n_unmasked_hi = min(n_unmasked_hi, max(0, fdiv(first_row + diag + right + 1)));
      n_block_min = max(0, fdiv(first_row + diag - left));
      n_unmasked_lo = max(0, cdiv(last_row + diag - left));
    }
  }

  CUTLASS_HOST_DEVICE bool empty() const { return n_block_max <= n_block_min; }
  CUTLASS_HOST_DEVICE bool needs_mask(int n) const { return n >= n_unmasked_hi || n < n_unmasked_lo; }

  // Split-KV: split `split` of `splits` keeps its contiguous share of the blocks (ceil(blocks /
  // splits) each, the last ones possibly fewer or none). The mask bounds stay absolute.
  CUTLASS_HOST_DEVICE void keep_split(int split, int splits) {
    int const blocks = max(0, n_block_max - n_block_min);
    int const per = (blocks + splits - 1) / splits;
    int const lo = n_block_min + split * per;
    n_block_max = min(n_block_max, lo + per);
    n_block_min = min(lo, n_block_max);
  }
};

// Query blocks that see key block n_block, and whether a block needs the causal/window mask.
template <int kBlockM, int kBlockN, bool kLocal>
struct BwdBlockRange {
  int m_block_min;
  int m_block_max;  // exclusive

  CUTLASS_HOST_DEVICE BwdBlockRange(int n_block, int seqlen_q, int diag, int left, int right) {
    m_block_min = 0;
    m_block_max = (seqlen_q + kBlockM - 1) / kBlockM;
    if constexpr (kLocal) {
      int const first_key = n_block * kBlockN;
      int const last_key = first_key + kBlockN - 1;
      // Query i sees key j iff i + diag - left <= j <= i + diag + right.
      m_block_min = max(m_block_min, floor_div(first_key - diag - right, kBlockM));
      m_block_max = min(m_block_max, floor_div(last_key - diag + left, kBlockM) + 1);
    }
  }
  CUTLASS_HOST_DEVICE int count() const { return max(0, m_block_max - m_block_min); }
};

}  // namespace flash
