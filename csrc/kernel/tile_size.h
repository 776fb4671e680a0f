// Forward tile sizes per head dim: the one place to tune them.
//
// kBlockM rows of Q per CTA, split over kBlockM / 64 consumer warpgroups; kBlockN keys per
// pipeline stage. Bounded by shared memory (Q + kStages * (K + V) <= 227 KB) and by the
// consumer registers (S accumulator + P + O accumulator per thread).
#pragma once

namespace flash {

struct FwdTile {
  int block_m;
  int block_n;
  int stages;
};

template <int kHeadDim, bool kCausal>
constexpr FwdTile fwd_tile() {
  if constexpr (kHeadDim <= 64) {
    return {192, 128, 2};
  } else if constexpr (kHeadDim <= 96) {
    return {128, 128, 2};
  } else if constexpr (kHeadDim <= 128) {
    return kCausal ? FwdTile{128, 128, 2} : FwdTile{128, 176, 2};
  } else if constexpr (kHeadDim <= 192) {
    return {128, 112, 2};
  } else {
    return {128, 80, 2};
  }
}

}  // namespace flash
