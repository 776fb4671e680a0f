// Forward tile sizes per head dim: the one place to tune them.
//
// kBlockM rows of Q per CTA, split over kBlockM / 64 consumer warpgroups; kBlockN keys per
// pipeline stage. Bounded by shared memory (Q + kStages * (K + V) <= 227 KB) and by the
// consumer registers (S accumulator + P + O accumulator per thread).
#pragma once

#include <cstdint>
#include <type_traits>

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
// that the next tile's Q and K load while this tile's epilogue runs, for hdim <= 128 (causal:
// see below; the developer macro FLASH_FWD_PERSISTENT_NONCAUSAL=0, named before causal tiles
// joined, turns both off). Measured 2026-11-30 as variants, x cuDNN at
// 512/2k/8k: hdim 128 128x128 persistent+O 0.925/0.981/0.987 against 128x176 one CTA per tile
// 0.772/0.941/1.005; hdim 64 0.985/1.060/1.124 against 0.800/1.012/1.109. At hdim 128 the
// persistent tile is 128x128 (128x176 plus its own O does not fit), which loses to 128x176 once
// the keys are long, so kLongKeys (seqlen_k >= kFwdLongKeysFrom) picks 128x176 there: measured
// in one build 0.969/0.966/1.018. That 128x176 is persistent too, with O staged in Q's buffer:
// 1.036/1.048 at 8k/16k against one CTA per tile's 1.014/1.028 (same run; at 1k it lost, 0.84
// against 128x128's 0.92, so it stays a long-keys tile).
//
// Causal/local persistent tiles are scheduled dynamically: each CTA draws its next tile from an
// atomic counter, in the scheduler's heaviest-first, L2-grouped order (tile_scheduler.h). A
// static stride over that order left CTAs idle: at hdim 128 it measured 0.725-0.752x cuDNN at
// 2k/8k against 0.933-1.007 one CTA per tile. Dynamic, 128x128 + own O, at 512/1k/2k/8k/16k:
// 0.961/0.946/0.977/1.012/1.032 against one CTA per tile's 0.761/0.880/0.915/0.998/1.039 (and
// 0.961/1.004/1.026/1.034 in another run). At hdim 64 it pays with short keys (128x128:
// 0.894/0.919 at 512/1k against 0.802/0.787), ties static at 2k (192x128) and loses to one CTA
// per tile from 8k; at hdim 256 (no room for its own O) it lost everywhere (0.79-0.90 against
// 0.84-1.09).
#ifndef FLASH_FWD_PERSISTENT_NONCAUSAL
#define FLASH_FWD_PERSISTENT_NONCAUSAL 1
#endif
#ifndef FLASH_FWD_LONG_KEYS_FROM
#define FLASH_FWD_LONG_KEYS_FROM 4096
#endif
// Key-length classes of the tile choice: short keys, mid (from kFwdMidKeysFrom), long (from
// kFwdLongKeysFrom). A class whose tile equals the class below it costs no extra kernel.
constexpr int kFwdMidKeysFrom = 1024;
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
    // Causal too below kFwdLongKeysFrom keys, with 128x128 tiles (see above). Measured against
    // 192x128 (also dynamic, own O) at 2k keys: 0.960 against 0.932 x cuDNN (3 rounds); at 4k,
    // 0.969 against the long-keys tile's 0.954, but 0.992 against 1.067 at 8k.
    constexpr bool kPersistCausal = kLocal && kKeys != kLongKeys && bool(FLASH_FWD_PERSISTENT_NONCAUSAL);
    if constexpr (kPersistCausal) { return {128, 128, 2, true, true}; }
    return {192, 128, 2, kPersist, kPersist};  // non-causal, or causal with long keys (one CTA per tile)
  } else if constexpr (kHeadDim <= 96) {
    return {128, 128, 2};
  } else if constexpr (kHeadDim <= 128) {
    // Causal: dynamic persistent 128x128 at every length.
    constexpr bool kPersistCausal = kLocal && bool(FLASH_FWD_PERSISTENT_NONCAUSAL);
    if constexpr (kPersistCausal) { return {128, 128, 2, true, true}; }
    // Non-causal long keys: 128x176 persistent too, with no room for its own O (O stored straight
    // from registers, flash_fwd_kernel.h kDirectO); it runs only where it pads fewer keys than
    // 128x128 (fwd_keys_class_for, below).
    return kLocal || (kPersist && kKeys != kLongKeys) ? FwdTileShape{128, 128, 2, kPersist, kPersist}
                                                      : FwdTileShape{128, 176, 2, kPersist, false};
  } else if constexpr (kHeadDim <= 192) {
    return {128, 112, 2};
  } else {
    // 128x80 non-causal, 128x64 causal/local; persistent below kFwdLongKeysFrom keys (causal:
    // tiles from the counter), with no room for an own O buffer (O stored from registers,
    // flash_fwd_kernel.h kDirectO). The mid class takes the short class's tile: no extra kernel.
    // History, x cuDNN, 3 rounds unless said:
    // - Before kDirectO (O staged in Q's buffer), persistent paid only below 1k keys: non-causal
    //   at 512 / 768 / 1k / 2k, one CTA per tile against persistent, 0.905 / 0.922 / 0.979 /
    //   1.008 -> 0.954 / 0.979 / 0.982 / 1.010 (an earlier measurement lost from 1k); causal at
    //   512 / 1k / 2k, all key classes persistent, 0.951 / 1.007 / 1.043 -> 0.995 / 1.020 / 1.021.
    // - With kDirectO (twenty-fifth session), at 1k / 2k / 8k, persistent below 1k against every
    //   class persistent: non-causal 1.028 / 1.067 / 1.113 -> 1.090 / 1.080 / 1.100, causal
    //   1.006 / 1.055 / 1.104 -> 1.056 / 1.069 / 1.066: persistent up to the long-keys class.
    // - Causal/local 128x64 rather than 128x80 (with the lazy rescale, softmax.h) at 512 / 1k /
    //   2k / 4k / 16k: 0.853 / 0.949 / 0.993 / 1.050 / 1.182 -> 0.936 / 0.996 / 1.021 / 1.066 /
    //   1.170; before the lazy rescale, 8k: 1.023 -> 1.035.
    if constexpr (kLocal) {
      constexpr bool kPersistLocal = kKeys != kLongKeys && bool(FLASH_FWD_PERSISTENT_NONCAUSAL);
      return kPersistLocal ? FwdTileShape{128, 64, 2, true, false} : FwdTileShape{128, 64, 2};
    }
    return kPersist && kKeys != kLongKeys ? FwdTileShape{128, 80, 2, true, false} : FwdTileShape{128, 80, 2};
  }
}

// The table, with the developer overrides FLASH_FWD_PERSISTENT / FLASH_FWD_DEV_SEPARATE_O (0 or 1)
// and FLASH_FWD_DEV_FORCE_STAGES (K/V stages of every tile; hdim 64 with 4 stages measured no gain,
// with 3 stages -7 % to +1 %, 2026-11-30).
template <int kHeadDim, bool kLocal, FwdKeys kKeys = kShortKeys>
constexpr FwdTileShape fwd_tile() {
  FwdTileShape tile = fwd_tile_table<kHeadDim, kLocal, kKeys>();
#ifdef FLASH_FWD_PERSISTENT
  tile.persistent = bool(FLASH_FWD_PERSISTENT);
#endif
#ifdef FLASH_FWD_DEV_SEPARATE_O
  tile.own_o = bool(FLASH_FWD_DEV_SEPARATE_O);
#endif
#ifdef FLASH_FWD_DEV_FORCE_STAGES
  tile.stages = FLASH_FWD_DEV_FORCE_STAGES;
#endif
  return tile;
}

// Persistent causal/local kernels take their tiles from a zeroed counter (FwdParams::tile_counter).
constexpr bool fwd_dynamic_schedule(bool persistent, bool local) { return persistent && local; }

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

// The key class that runs: a long-keys problem takes the mid-keys tile instead when that tile
// pads fewer keys, its padded key length weighted by FLASH_FWD_LONG_TILE_RATIO / 1000 (the long
// tile's speed advantage on whole key blocks; 0 = always the long tile). Only hdim 128
// non-causal has long and mid tiles of different widths (128x176 and 128x128). Measured
// 2026-11-30 (tools/device_plan_fwd_blockn.sh, 3 rounds, one build per variant), TFLOP/s of
// 128x176 / 128x128 everywhere / this rule at 1000, at 4096 / 8192 / 8448 / 10000 / 12288 /
// 16384 keys: 650 / 668 / 702 / 674 / 679 / 677 against 667 / 682 / 702 / 668 / 694 / 691 and
// 675 / 693 / 702 / 674 / 700 / 698. On whole blocks (8448) the two tiles tie, so the ratio is
// 1000: at 8192 the 176-key tile's last block holds 96 keys (a masked, partly wasted block).
#ifndef FLASH_FWD_LONG_TILE_RATIO
#define FLASH_FWD_LONG_TILE_RATIO 1000
#endif
template <int kHeadDim, bool kLocal>
inline FwdKeys fwd_keys_class_for(int seqlen_k) {
  FwdKeys const keys = fwd_keys_class(seqlen_k);
#if FLASH_FWD_LONG_TILE_RATIO
  if constexpr (fwd_keys_class_differs<kHeadDim, kLocal, kLongKeys>()) {
    if (keys == kLongKeys) {
      constexpr int kLongN = fwd_tile<kHeadDim, kLocal, kLongKeys>().block_n;
      constexpr int kMidN = fwd_tile<kHeadDim, kLocal, kMidKeys>().block_n;
      int64_t const padded_long = int64_t((seqlen_k + kLongN - 1) / kLongN) * kLongN;
      int64_t const padded_mid = int64_t((seqlen_k + kMidN - 1) / kMidN) * kMidN;
      if (padded_mid * FLASH_FWD_LONG_TILE_RATIO < padded_long * 1000) { return kMidKeys; }
    }
  }
#endif
  return keys;
}

// For the binding: whether the forward kernel that (rounded head dim, mask, seqlen_k) dispatches
// to needs a tile counter. A class that does not differ from the one below has the same tile, so
// fwd_tile of the key class itself is the tile that runs.
template <int kHeadDim, bool kLocal>
constexpr bool fwd_needs_tile_counter(FwdKeys keys) {
  FwdTileShape const tile = keys == kLongKeys  ? fwd_tile<kHeadDim, kLocal, kLongKeys>()
                            : keys == kMidKeys ? fwd_tile<kHeadDim, kLocal, kMidKeys>()
                                               : fwd_tile<kHeadDim, kLocal, kShortKeys>();
  return fwd_dynamic_schedule(tile.persistent, kLocal);
}

inline bool fwd_needs_tile_counter(int head_dim_rounded, bool local, int seqlen_k) {
  auto pick = [&](auto hdim) {
    constexpr int kD = decltype(hdim)::value;
    return local ? fwd_needs_tile_counter<kD, true>(fwd_keys_class_for<kD, true>(seqlen_k))
                 : fwd_needs_tile_counter<kD, false>(fwd_keys_class_for<kD, false>(seqlen_k));
  };
  switch (head_dim_rounded) {
    case 64: return pick(std::integral_constant<int, 64>{});
    case 96: return pick(std::integral_constant<int, 96>{});
    case 128: return pick(std::integral_constant<int, 128>{});
    case 192: return pick(std::integral_constant<int, 192>{});
    default: return pick(std::integral_constant<int, 256>{});
  }
}

// Backward: kBlockM query rows per step, kBlockN keys per CTA. Two consumer warpgroups split 128
// keys for head dims up to 128; past that dK + dV need too many registers, so 64 keys and the
// warpgroups split the head dim instead. Steps of 128 queries at head dims <= 64 (FA3's shape
// there: S^T and dP^T as m64n128 WGMMAs, dQ split by queries between the warpgroups; it needs
// dS^T from the 16-bit P^T and the dV GEMM after dS^T, see BwdKernel), 64 above. Measured at
// hdim 64 against 64-query steps (3 rounds, x cuDNN, 1k / 8k, eighteenth session): non-causal
// 0.989 / 0.998 -> 1.036 / 1.061, causal 1.023 / 1.000 -> 1.065 / 1.098.
// FLASH_BWD_DEV_BLOCK_M forces the step (flash_bwd_params.h).
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
#ifdef FLASH_BWD_DEV_BLOCK_M
  constexpr int kBlockM = FLASH_BWD_DEV_BLOCK_M;
#else
  constexpr int kBlockM = kHeadDim <= 64 ? 128 : 64;
#endif
  return kHeadDim <= 128 ? FwdTileShape{kBlockM, 128, kStages} : FwdTileShape{kBlockM, 64, kStages};
}

// Backward, RS path (head dims <= 128): whether the dV GEMM is issued after dS^T is in shared
// memory rather than while dS^T is computed. Measured (3 rounds, x cuDNN at 512 / 2k / 8k), hdim
// 64 non-causal: 0.96 / 0.94 / 0.94 -> 1.01 / 0.99 / 0.98 by default (again in another run:
// 0.94 / 0.93 / 0.96 -> 0.98 / 0.98 / 1.01), but deterministic mode 0.81 / 0.79 / 0.87 ->
// 0.77 / 0.71 / 0.80; hdim 64 causal and hdim 128 default: within 2 %. Those were 64-query steps;
// hdim 64's 128-query steps take it in every mode (their registers need it, see bwd_tile). hdim
// 128, default mode, measured again on today's kernel (eighteenth session, x cuDNN, 1k / 8k):
// non-causal 1.012 / 1.025 -> 1.040 / 1.042, causal 1.019 / 1.034 -> 1.060 / 1.048; its
// deterministic mode keeps the old order (not measured). FLASH_BWD_DEV_DV_AFTER_DS=0/1 forces it.
template <int kHeadDim, bool kLocal, bool kDeterministic>
constexpr bool bwd_dv_after_ds() {
#ifdef FLASH_BWD_DEV_DV_AFTER_DS
  return kHeadDim <= 128 && FLASH_BWD_DEV_DV_AFTER_DS;
#else
  return bwd_tile<kHeadDim>().block_m == 128 || (kHeadDim <= 128 && !kDeterministic);
#endif
}

// Backward: whether the non-causal kernel is persistent (one CTA per SM striding over the
// tiles; the next tile's K/V load under the dK/dV epilogue). Measured (3 rounds, x cuDNN at
// 512 / 1k / 2k / 8k), default mode: hdim 64 1.00 / 0.99 / 0.99 / 1.00 -> 1.08 / 1.02 / 1.01 /
// 1.01, hdim 128 0.98 / 1.00 / 1.00 / 1.00 -> 1.03 / 1.02 / 1.01 / 1.01, hdim 256 0.97 / 0.95 /
// 0.93 / 0.98 -> 1.01 / 0.96 / 0.93 / 0.96 (before its split Q/dO pipelines; not taken there);
// deterministic mode: +12 % at 512, then -4 / -12 / -10 % (not taken there).
// FLASH_BWD_DEV_PERSISTENT=0/1 forces it (non-causal).
// Causal/local kernels at head dims <= 128 are persistent too, their tiles drawn from a counter
// longest first (BwdKernel::kDynamic). Measured (3 rounds, x cuDNN at 512 / 1k / 2k / 8k, causal,
// default mode): hdim 64 0.955 / 0.923 / 0.897 / 0.906 -> 1.024 / 0.983 / 0.944 / 0.944, hdim
// 128 0.934 / 0.939 / 0.941 / 0.959 -> 0.987 / 0.997 / 1.010 / 0.996. Default mode only: the
// deterministic mode's turns could wait on tiles no CTA has drawn yet.
// FLASH_BWD_DEV_CAUSAL_PERSISTENT=0/1 forces it (causal/local, default mode).
template <int kHeadDim, bool kLocal, bool kDeterministic>
constexpr bool bwd_persistent() {
  if constexpr (kLocal) {
#ifdef FLASH_BWD_DEV_CAUSAL_PERSISTENT
    return kHeadDim <= 128 && !kDeterministic && FLASH_BWD_DEV_CAUSAL_PERSISTENT;
#else
    return kHeadDim <= 128 && !kDeterministic;
#endif
  } else {
#ifdef FLASH_BWD_DEV_PERSISTENT
    return FLASH_BWD_DEV_PERSISTENT;
#else
    return kHeadDim <= 128 && !kDeterministic;
#endif
  }
}

// For the binding: whether the backward kernel for (rounded head dim, mask, mode) draws its tiles
// from a counter (persistent and causal/local).
inline bool bwd_needs_tile_counter(int head_dim_rounded, bool local, bool deterministic) {
  if (!local || deterministic) { return false; }
  switch (head_dim_rounded) {
    case 64: return bwd_persistent<64, true, false>();
    case 96: return bwd_persistent<96, true, false>();
    case 128: return bwd_persistent<128, true, false>();
    case 192: return bwd_persistent<192, true, false>();
    default: return bwd_persistent<256, true, false>();
  }
}

}  // namespace flash
