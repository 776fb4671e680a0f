// Which (m_block, head, batch) tiles a CTA computes.
//
// Tile ids run m_block fastest, so CTAs working at the same time share a head and its K/V stay
// in L2. One CTA per tile (grid = (m_blocks, heads, batch)), or persistent: one CTA per SM
// striding over the tile ids, so a CTA's producer loads the next tile's K/V while its consumers
// are still busy with the current tile's epilogue. With a causal/local mask the heavier tiles
// (larger m_block) go first.
#pragma once

#include "kernel/config.h"

#include <cutlass/cutlass.h>

namespace flash {

struct FwdTile {
  int m_block;
  int head;
  int batch;
};

template <bool kPersistent, bool kHeavyLast>
struct FwdTileScheduler {
  int num_m_blocks;
  int heads;
  int num_tiles;

  CUTLASS_HOST_DEVICE FwdTileScheduler(int num_m_blocks_, int heads_, int batch)
      : num_m_blocks(num_m_blocks_), heads(heads_), num_tiles(num_m_blocks_ * heads_ * batch) {}

  static dim3 grid(int num_m_blocks, int heads, int batch, int num_sms) {
    if constexpr (kPersistent) {
      long const tiles = long(num_m_blocks) * heads * batch;
      return dim3(unsigned(tiles < num_sms ? tiles : num_sms));
    } else {
      return dim3(num_m_blocks, heads, batch);
    }
  }

  CUTLASS_DEVICE int first() const {
    if constexpr (kPersistent) {
      return blockIdx.x;
    } else {
      return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    }
  }
  CUTLASS_DEVICE int next(int tile) const { return kPersistent ? tile + int(gridDim.x) : num_tiles; }
  CUTLASS_DEVICE bool valid(int tile) const { return tile < num_tiles; }

  CUTLASS_DEVICE FwdTile decode(int tile) const {
    int const m = tile % num_m_blocks;
    int const head_batch = tile / num_m_blocks;
    return {kHeavyLast ? num_m_blocks - 1 - m : m, head_batch % heads, head_batch / heads};
  }
};

}  // namespace flash
