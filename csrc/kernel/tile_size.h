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
// Persistent mode (one CTA per SM striding over the tiles) with O staged in its own buffer, so
// that the next tile's Q and K load while this tile's epilogue runs, for non-causal hdim <= 128
// (FLASH_FWD_PERSISTENT_NONCAUSAL=0 turns it off). Measured 2026-11-30 as variants, x cuDNN at
// 512/2k/8k: hdim 128 128x128 persistent+O 0.925/0.981/0.987 against 128x176 one CTA per tile
// 0.772/0.941/1.005; hdim 64 0.985/1.060/1.124 against 0.800/1.012/1.109. At hdim 128 the
// persistent tile is 128x128 (128x176 plus its own O does not fit), which loses to 128x176 once
// the keys are long, so kLongKeys (seqlen_k >= kFwdLongKeysFrom) picks 128x176 there: measured
// in one build 0.969/0.966/1.018. Causal persistent (heaviest-first grouped order,
// tile_scheduler.h) only pays at hdim 64 with short keys; at hdim 128 it measured 0.725-0.752
// against 0.933-1.007 at 2k/8k, the static schedule leaving CTAs idle.
#ifndef FLASH_FWD_PERSISTENT_NONCAUSAL
#define FLASH_FWD_PERSISTENT_NONCAUSAL 1
#endif
#ifndef FLASH_FWD_LONG_KEYS_FROM
#define FLASH_FWD_LONG_KEYS_FROM 4096
#endif
// Key-length classes of the tile choice: short keys, mid (from kFwdMidKeysFrom), long (from
// kFwdLongKeysFrom). A class whose tile equals the class below it costs no extra kernel.
constexpr int kFwdMidKeysFrom = 2048;
constexpr int kFwdLongKeysFrom = FLASH_FWD_LONG_KEYS_FROM;
enum FwdKeys : int { kShortKeys = 0, kMidKeys = 1, kLongKeys = 2 };

constexpr FwdKeys fwd_keys_class(int seqlen_k) {
  return seqlen_k >= kFwdLongKeysFrom ? kLongKeys : seqlen_k >= kFwdMidKeysFrom ? kMidKeys : kShortKeys;
}

template <int kHeadDim, bool kLocal, FwdKeys kKeys = kShortKeys>
constexpr FwdTileShape fwd_tile_table() {
#if defined(FLASH_FWD_DEV_BLOCK_M) && defined(FLASH_FWD_DEV_BLOCK_N)
  // Developer builds (tools/variants.py) sweep tiles without editing this table.
  return {FLASH_FWD_DEV_BLOCK_M, FLASH_FWD_DEV_BLOCK_N, FLASH_FWD_DEV_STAGES};
#endif
  constexpr bool kPersist = !kLocal && bool(FLASH_FWD_PERSISTENT_NONCAUSAL);  // and its own O buffer
  if constexpr (kHeadDim <= 64) {
    // Causal too below kFwdLongKeysFrom keys (x cuDNN at 512/2k: 0.731/0.903 against 0.617/0.884
    // one CTA per tile; at 8k 1.001 against 1.041), with 128x128 tiles for short keys (512/1k/2k:
    // 0.813/0.802/0.814 against 192x128's 0.725/0.762/0.920).
    constexpr bool kPersistCausal = kLocal && kKeys != kLongKeys && bool(FLASH_FWD_PERSISTENT_NONCAUSAL);
    if constexpr (kPersistCausal && kKeys == kShortKeys) { return {128, 128, 2, true, true}; }
    constexpr bool kPersist64 = kPersist || kPersistCausal;
    return {192, 128, 2, kPersist64, kPersist64};
  } else if constexpr (kHeadDim <= 96) {
    return {128, 128, 2};
  } else if constexpr (kHeadDim <= 128) {
    return kLocal || (kPersist && kKeys != kLongKeys) ? FwdTileShape{128, 128, 2, kPersist, kPersist}
                                                      : FwdTileShape{128, 176, 2};
  } else if constexpr (kHeadDim <= 192) {
    return {128, 112, 2};
  } else {
    return {128, 80, 2};
  }
}

// The table, with the developer overrides FLASH_FWD_PERSISTENT / FLASH_FWD_DEV_SEPARATE_O (0 or 1).
template <int kHeadDim, bool kLocal, FwdKeys kKeys = kShortKeys>
constexpr FwdTileShape fwd_tile() {
  FwdTileShape tile = fwd_tile_table<kHeadDim, kLocal, kKeys>();
#ifdef FLASH_FWD_PERSISTENT
  tile.persistent = bool(FLASH_FWD_PERSISTENT);
#endif
#ifdef FLASH_FWD_DEV_SEPARATE_O
  tile.own_o = bool(FLASH_FWD_DEV_SEPARATE_O);
#endif
  return tile;
}

constexpr bool same_tile(FwdTileShape a, FwdTileShape b) {
  return a.block_m == b.block_m && a.block_n == b.block_n && a.stages == b.stages &&
         a.persistent == b.persistent && a.own_o == b.own_o;
}

// Whether key-length class kKeys of (head dim, mask) has a tile of its own, unlike the class
// below it (one more kernel to compile).
template <int kHeadDim, bool kLocal, FwdKeys kKeys>
constexpr bool fwd_keys_class_differs() {
  return !same_tile(fwd_tile<kHeadDim, kLocal, kKeys>(), fwd_tile<kHeadDim, kLocal, FwdKeys(kKeys - 1)>());
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
