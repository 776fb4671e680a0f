// Forward tile sizes per head dim: the one place to tune them.
//
// kBlockM rows of Q per CTA, split over kBlockM / 64 consumer warpgroups; kBlockN keys per
// pipeline stage. Bounded by shared memory (Q + kStages * (K + V) <= 227 KB) and by the
// consumer registers (S accumulator + P + O accumulator per thread).
#pragma once

namespace flash {

struct FwdTileShape {
  int block_m;
  int block_n;
  int stages;
};

// kLocal: causal or sliding window (fewer keys per row, smaller key blocks waste less).
template <int kHeadDim, bool kLocal>
constexpr FwdTileShape fwd_tile() {
#if defined(FLASH_FWD_DEV_BLOCK_M) && defined(FLASH_FWD_DEV_BLOCK_N)
  // Developer builds (tools/variants.py) sweep tiles without editing this table.
  return {FLASH_FWD_DEV_BLOCK_M, FLASH_FWD_DEV_BLOCK_N, FLASH_FWD_DEV_STAGES};
#endif
  if constexpr (kHeadDim <= 64) {
    return {192, 128, 2};
  } else if constexpr (kHeadDim <= 96) {
    return {128, 128, 2};
  } else if constexpr (kHeadDim <= 128) {
    return kLocal ? FwdTileShape{128, 128, 2} : FwdTileShape{128, 176, 2};
  } else if constexpr (kHeadDim <= 192) {
    return {128, 112, 2};
  } else {
    return {128, 80, 2};
  }
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
  return kHeadDim <= 128 ? FwdTileShape{64, 128, kStages} : FwdTileShape{64, 64, kStages};
}

}  // namespace flash
