// Forward tile sizes per head dim: the one place to tune them.
//
// kBlockM rows of Q per CTA, split over kBlockM / 64 consumer warpgroups; kBlockN keys per
// pipeline stage. Bounded by shared memory (Q + kStages * (K + V) <= 227 KB) and by the
// consumer registers (S accumulator + P + O accumulator per thread).
#pragma once

#include "flash_bwd_params.h"  // kBwdBlockM

namespace flash {

struct FwdTileShape {
  int block_m;
  int block_n;
  int stages;
  bool persistent = false;  // one CTA per SM striding over the tiles (forward only)
  bool own_o = false;       // persistent only: O staged in its own buffer, not in Q's
};

// kLocal: causal or sliding window (fewer keys per row, smaller key blocks waste less).
//
// FLASH_FWD_PERSISTENT_NONCAUSAL=1 runs non-causal hdim <= 128 persistent with its own O buffer,
// so the next tile's Q and K load while this tile's epilogue runs. Measured 2026-11-30 as
// variants (same kernels), x cuDNN at 512/2k/8k: hdim 128 128x128 persistent+O 0.925/0.981/0.987
// against today's 128x176 one-CTA-per-tile 0.772/0.941/1.005; hdim 64 0.985/1.060/1.124 against
// 0.800/1.012/1.109. Off by default until the full GPU test suite has run on it (the variants'
// checks passed, multi-tile CTAs included). Causal stays one CTA per tile: persistent measured
// slower there (hdim 64 causal 2k 0.64 vs 0.89x); the heavy-first order matters more.
#ifndef FLASH_FWD_PERSISTENT_NONCAUSAL
#define FLASH_FWD_PERSISTENT_NONCAUSAL 0
#endif
template <int kHeadDim, bool kLocal>
constexpr FwdTileShape fwd_tile_table() {
#if defined(FLASH_FWD_DEV_BLOCK_M) && defined(FLASH_FWD_DEV_BLOCK_N)
  // Developer builds (tools/variants.py) sweep tiles without editing this table.
  return {FLASH_FWD_DEV_BLOCK_M, FLASH_FWD_DEV_BLOCK_N, FLASH_FWD_DEV_STAGES};
#endif
  constexpr bool kPersist = !kLocal && bool(FLASH_FWD_PERSISTENT_NONCAUSAL);  // and its own O buffer
  if constexpr (kHeadDim <= 64) {
    return {192, 128, 2, kPersist, kPersist};
  } else if constexpr (kHeadDim <= 96) {
    return {128, 128, 2};
  } else if constexpr (kHeadDim <= 128) {
    return kLocal || kPersist ? FwdTileShape{128, 128, 2, kPersist, kPersist} : FwdTileShape{128, 176, 2};
  } else if constexpr (kHeadDim <= 192) {
    return {128, 112, 2};
  } else {
    return {128, 80, 2};
  }
}

// The table, with the developer overrides FLASH_FWD_PERSISTENT / FLASH_FWD_DEV_SEPARATE_O (0 or 1).
template <int kHeadDim, bool kLocal>
constexpr FwdTileShape fwd_tile() {
  FwdTileShape tile = fwd_tile_table<kHeadDim, kLocal>();
#ifdef FLASH_FWD_PERSISTENT
  tile.persistent = bool(FLASH_FWD_PERSISTENT);
#endif
#ifdef FLASH_FWD_DEV_SEPARATE_O
  tile.own_o = bool(FLASH_FWD_DEV_SEPARATE_O);
#endif
  return tile;
}

// Backward: kBlockM = 64 query rows per step (flash_bwd_params.h), kBlockN keys per CTA. Two
// consumer warpgroups split 128 keys for head dims up to 128; past that dK + dV need too many
// registers, so 64 keys and the warpgroups split the head dim instead.
// Q/dO stages: 2, but 1 past head dim 192, where two would leave no shared memory to stage dQ in
// (measured at hdim 256: one stage + dQ through shared memory 1.5-1.7x faster than two stages +
// dQ atomics). FLASH_BWD_DEV_STAGES overrides it (developer builds, tools/variants.py).
template <int kHeadDim>
constexpr FwdTileShape bwd_tile() {
#ifdef FLASH_BWD_DEV_STAGES
  constexpr int kStages = FLASH_BWD_DEV_STAGES;
#else
  constexpr int kStages = kHeadDim > 192 ? 1 : 2;
#endif
  return kHeadDim <= 128 ? FwdTileShape{kBwdBlockM, 128, kStages} : FwdTileShape{kBwdBlockM, 64, kStages};
}

}  // namespace flash
