// Every tile size and every per-head-dim / per-mask choice of the kernels, in one place, with the
// why in a line and the measurement in docs/decisions/ ([D:NNN] names the page). This is also the
// only header that reads developer overrides (docs/dev-knobs.md). Host-safe: the binding includes
// it to size workspaces.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cutlass/numeric_types.h>

#include "params/bwd_params.h"  // kBwdPadM, kBwdMinBlockM

namespace flash {

// The mask as a type, so that kernel names in a profiler say which one runs.
struct NoMask {
  static constexpr bool kLocal = false;
};
struct LocalMask {  // causal (bottom-right or top-left) or a sliding window
  static constexpr bool kLocal = true;
};
template <bool kLocal>
using MaskFor = std::conditional_t<kLocal, LocalMask, NoMask>;

// ------------------------------------------------------------------------------------------
// Forward
// ------------------------------------------------------------------------------------------

struct FwdTileShape {
  int block_m;              // query rows per CTA tile, 64 per consumer warpgroup
  int block_n;              // keys per pipeline stage
  int stages;               // K/V pipeline stages
  bool persistent = false;  // one CTA per SM striding over the tiles
  bool own_o = false;       // persistent only: O staged in its own buffer (and a second Q buffer)
};

// Key-length classes of the tile choice: short keys, mid (from kFwdMidKeysFrom), long (from
// kFwdLongKeysFrom). A class whose tile equals the class below it costs no extra kernel.
#ifndef FLASH_FWD_LONG_KEYS_FROM
#define FLASH_FWD_LONG_KEYS_FROM 4096
#endif
constexpr int kFwdMidKeysFrom = 1024;
constexpr int kFwdLongKeysFrom = FLASH_FWD_LONG_KEYS_FROM;
enum FwdKeys : int { kShortKeys = 0, kMidKeys = 1, kLongKeys = 2 };

// 1: in every forward kernel, the softmax of key blocks that no row of the tile sees masked without
// its -inf tests (FA3's Check_inf = false), the scale clamped positive (FwdPolicy::kUncheckedInf) [D:096].
#ifndef FLASH_FWD_DEV_UNCHECKED_INF
#define FLASH_FWD_DEV_UNCHECKED_INF 0
#endif
constexpr bool kFwdUncheckedInf = FLASH_FWD_DEV_UNCHECKED_INF;
// 1: the FP8 forward kernels stamp SM clocks at their producer / consumer events (an instrument,
// kernel/common/trace.h, which reads FLASH_KERNEL_TRACE) [D:100].
#ifndef FLASH_FWD_DEV_TRACE
#define FLASH_FWD_DEV_TRACE 0
#endif
#define FLASH_KERNEL_TRACE FLASH_FWD_DEV_TRACE
// 1: FP8 kernels issue a tile's first S GEMM and last P.V GEMM outside the ping-pong (FA3's); 2: that,
// and the final row factors computed while the last P.V runs; not yet measured [D:101].
#ifndef FLASH_FWD_DEV_FP8_ENDS
#define FLASH_FWD_DEV_FP8_ENDS 0
#endif
constexpr int kFwdFp8Ends = FLASH_FWD_DEV_FP8_ENDS;
// 1: in every FP8 kernel, a lazy row max that lags by at most the 0.8 (exp2 domain) e4m3 leaves past
// FA3's offset instead of the exact one (FwdPolicy::kFp8Slack) [D:097].
#ifndef FLASH_FWD_DEV_FP8_SLACK
#define FLASH_FWD_DEV_FP8_SLACK 0
#endif
constexpr bool kFwdFp8Slack = FLASH_FWD_DEV_FP8_SLACK;

constexpr FwdKeys fwd_keys_class(int seqlen_k) {
  return seqlen_k >= kFwdLongKeysFrom ? kLongKeys : seqlen_k >= kFwdMidKeysFrom ? kMidKeys : kShortKeys;
}

// The forward tile table. Bounded by shared memory (Q + stages * (K + V) [+ O + second Q] <= 227
// KB) and the consumers' registers (S + P + O accumulators per thread).
// - Persistent with an own O buffer where it fits (hdim <= 128), so the next tile's Q and K load
//   under this tile's epilogue [D:004]; causal/local persistent tiles are drawn
//   dynamically, heaviest first [D:005].
// - hdim 128 non-causal long keys: 128x176 (persistent, O stored from registers) where it pads
//   fewer keys than 128x128 [D:006].
// - hdim 256: 128x80 (causal/local 128x64), persistent below the long-keys class [D:016].
template <int kHeadDim, bool kLocal, FwdKeys kKeys = kShortKeys>
constexpr FwdTileShape fwd_tile_table() {
  if constexpr (kHeadDim <= 64) {
    if constexpr (kLocal && kKeys != kLongKeys) { return {128, 128, 2, true, true}; }
    return {192, 128, 2, !kLocal, !kLocal};  // non-causal, or causal with long keys (one CTA per tile)
  } else if constexpr (kHeadDim <= 96) {
    return {128, 128, 2};
  } else if constexpr (kHeadDim <= 128) {
    if constexpr (kLocal) { return {128, 128, 2, true, true}; }
    return kKeys != kLongKeys ? FwdTileShape{128, 128, 2, true, true} : FwdTileShape{128, 176, 2, true, false};
  } else if constexpr (kHeadDim <= 192) {
    return {128, 112, 2};
  } else {
    if constexpr (kLocal) {
      return kKeys != kLongKeys ? FwdTileShape{128, 64, 2, true, false} : FwdTileShape{128, 64, 2};
    }
    return kKeys != kLongKeys ? FwdTileShape{128, 80, 2, true, false} : FwdTileShape{128, 80, 2};
  }
}

// The table, or (developer builds sweeping tiles) FLASH_FWD_DEV_BLOCK_M / _BLOCK_N / _STAGES.
template <int kHeadDim, bool kLocal, FwdKeys kKeys = kShortKeys>
constexpr FwdTileShape fwd_tile() {
  FwdTileShape tile = fwd_tile_table<kHeadDim, kLocal, kKeys>();
#if defined(FLASH_FWD_DEV_BLOCK_M) && defined(FLASH_FWD_DEV_BLOCK_N) && defined(FLASH_FWD_DEV_STAGES)
  tile = {FLASH_FWD_DEV_BLOCK_M, FLASH_FWD_DEV_BLOCK_N, FLASH_FWD_DEV_STAGES};
#endif
  return tile;
}

// Split-KV kernels (decode: few query tiles, long keys): one CTA per (query tile, head, batch,
// split), each split a contiguous share of the tile's key blocks, partial O and LSE in float32
// for the combine kernel. Non-persistent 128-row tiles with the key block of the head dim's
// non-persistent tile.
// FLASH_FWD_DEV_SPLIT_STAGES (a decode measurement, default 2): K/V stages of these tiles (3 fit
// in shared memory at hdim <= 128 only).
#ifndef FLASH_FWD_DEV_SPLIT_STAGES
#define FLASH_FWD_DEV_SPLIT_STAGES 2
#endif
template <int kHeadDim>
constexpr FwdTileShape fwd_split_tile() {
  return {128, kHeadDim <= 128 ? 128 : kHeadDim <= 192 ? 112 : 80, FLASH_FWD_DEV_SPLIT_STAGES};
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
// pads fewer keys, its padded length weighted by FLASH_FWD_LONG_TILE_RATIO / 1000 (the long tile's
// speed advantage on whole key blocks; 0 = always the long tile) [D:006].
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

// What the forward kernel of (head dim, dtype, mask, tile, varlen, softcap, split) does beyond its
// tile.
template <int kHeadDim_, typename Element_, typename Mask_, FwdTileShape kTile_, bool kVarlen_ = false,
          bool kSoftcap_ = false, bool kSplit_ = false, bool kPaged_ = false, int kHeadDimV_ = 0>
struct FwdPolicy {
  using Element = Element_;
  using Mask = Mask_;
  // FP8 (e4m3) inputs (fp8.h): O in bf16 (FA3's convention), V transposed in shared memory for the
  // K-major P.V WGMMA, P quantized to e4m3.
  static constexpr bool kFp8 = cutlass::sizeof_bits<Element_>::value == 8;
  using OutElement = std::conditional_t<kFp8, cutlass::bfloat16_t, Element_>;
  static constexpr FwdTileShape kTile = kTile_;
  static constexpr int kHeadDim = kHeadDim_;
  // V's (and O's) head dim: kHeadDim, or (dv != d kernels, fwd_value_head_dim) narrower, or
  // (qv kernels, kWideV) wider.
  static constexpr int kHeadDimV = kHeadDimV_ ? kHeadDimV_ : kHeadDim_;
  // qv kernels (FA3's MLA decode, d 64 with dv 256 / 512): scores Q.K^T + Qv.V^T, Qv (M, dv) beside
  // Q (fwd_qv_tile, mainloop_qv.h). Past dv 256 one warpgroup's O would not fit its registers: the
  // two consumer warpgroups then share the tile's rows (kSharedRows), each computing the whole S
  // and its half of O's columns, kHeadDimO of them.
  static constexpr bool kWideV = kHeadDimV > kHeadDim_;
  static constexpr bool kSharedRows = kWideV && kHeadDimV > 256;
  static constexpr int kHeadDimO = kSharedRows ? kHeadDimV / 2 : kHeadDimV;
  static constexpr bool kLocal = Mask::kLocal;
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.stages;
  static constexpr bool kPersistent = kTile.persistent;
  // Variable-length batches: sequences packed along the rows, each tile's extent from SeqLenInfo.
  static constexpr bool kVarlen = kVarlen_;
  // Scores capped by softcap * tanh before the mask (softcap.h).
  static constexpr bool kSoftcap = kSoftcap_;
  // Split-KV: the tile's key blocks shared among FwdParams::num_splits CTAs, each storing its
  // partial O (float32, from registers) and LSE for the combine kernel.
  static constexpr bool kSplit = kSplit_;
  static_assert(!kSplit || !kTile_.persistent, "split-KV kernels are one CTA per tile and split");
  // Paged KV cache (varlen): the producer warpgroup gathers K/V rows page by page with cp.async
  // (paged_kv.h), one CTA per tile.
  static constexpr bool kPaged = kPaged_;
  static_assert(!kPaged || (kVarlen_ && !kTile_.persistent), "paged kernels are varlen, one CTA per tile");

  // Persistent with its own O buffer: O is staged there and a second Q buffer alternates with the
  // first, so the next tile's Q loads while this tile still reads its own [D:012]; the O
  // store's wait for its shared-memory read is deferred to the next tile's O [D:013].
  static constexpr bool kSeparateO = kPersistent && kTile.own_o;
  // Persistent without room for an own O: O goes from registers straight to global memory in
  // 16-byte stores, so Q is released after the tile's last Q.K^T GEMM all the same [D:015].
  // Varlen kernels always: a TMA store of a whole tile would write past the sequence's end.
  static constexpr bool kDirectO = (kPersistent && !kTile.own_o) || kVarlen || kSplit || kWideV || kFp8;
  // Q's buffer is released by the tile's last Q.K^T GEMM (not by the epilogue's O store).
  static constexpr bool kEarlyQ = kSeparateO || kDirectO;
  // Persistent causal/local: tiles drawn from an atomic counter, heaviest first [D:005].
  static constexpr bool kDynamic = fwd_dynamic_schedule(kPersistent, kLocal);
  // Varlen persistent kernels walk only the tiles that hold rows (tile_scheduler.h, VarlenTileWalk)
  // and hand them, with their sequences' extents, to the consumers through the tile ring.
  static constexpr bool kCompact = kVarlen && kPersistent;
  // The producer hands the consumers their tiles through shared memory (TileRing).
  static constexpr bool kRing = kDynamic || kCompact;
  // The dynamic ring carries decoded tiles at hdim 64 (at 128 / 256 the producer then spills)
  // [D:014]. Varlen persistent kernels' ring carries walked tiles with their extents (kernel.h).
  static constexpr bool kRingDecode = kHeadDim <= 64;
  // Causal/local, and FP8 calls without a mask too: the key-block loop in three parts around its
  // unmasked middle, which then carries no mask code [D:008, D:089].
  static constexpr bool kSplitMask = (kLocal || kFp8) && !kWideV;
  // hdim 64 causal/local 128-key tiles: the diagonal block's mask and softmax over the half each
  // warpgroup needs [D:017].
  static constexpr bool kHalfSoftmax = kHeadDim == 64 && kLocal && kBlockN == 128 && !kFp8;
  // Key blocks after the first full unmasked one skip the row-max search [D:010].
  // Not at hdim 256 with softcap [D:056] or paged (232 consumer registers [D:063]), where the
  // second S(n) spills.
  // FP8: every block searches its max (P must stay within e4m3's range, fp8.h).
  static constexpr bool kMaxFree = kWideV || kFp8 ? false :
      kHeadDim == 96 || (kHeadDim == 64 && (!kLocal || kBlockM == 192)) ||
      (!kLocal && (kHeadDim == 128 || kHeadDim == 192 || (kHeadDim == 256 && !kPersistent && !kSoftcap && !kPaged)));
  // FP8's dense 128-key tiles at hdim 128 / 256 (without softcap): a lazy row max within e4m3's range
  // and no -inf tests in the blocks no row sees masked, as measured together (+0-3 %); not the
  // 224-key hdim 128 tiles (-1-4.5 %) and, unmeasured, not the others [D:096, D:097]. The knobs
  // force either on in every kernel.
  static constexpr bool kFp8LazyTile = kFp8 && kHeadDim > 64 && kBlockN == 128 && !kVarlen && !kSoftcap && !kSplit;
  static constexpr bool kFp8Slack = kFp8 && (kFwdFp8Slack || kFp8LazyTile);
  static constexpr bool kUncheckedInf = kFwdUncheckedInf || kFp8LazyTile;
};

template <int kHeadDim, typename Element, bool kLocal, FwdKeys kKeys, bool kVarlen = false, bool kSoftcap = false,
          int kHeadDimV = 0>
using FwdPolicyFor = FwdPolicy<kHeadDim, Element, MaskFor<kLocal>,
                               fwd_tile<kHeadDim, kLocal, kKeys>(), kVarlen, kSoftcap,
                               false, false, kHeadDimV>;

template <int kHeadDim, typename Element, bool kLocal, bool kVarlen, int kHeadDimV = 0>
using FwdSplitPolicyFor =
    FwdPolicy<kHeadDim, Element, MaskFor<kLocal>, fwd_split_tile<kHeadDim>(), kVarlen, false, true, false, kHeadDimV>;

// dv != d: the V head dim with kernels of its own beside Q/K head dim kHeadDim (0: none; other
// pairs run on zero-padded copies, decision 061): 192 / 128 (DeepSeek-style MLA prefill).
template <int kHeadDim>
constexpr int fwd_value_head_dim() {
  return kHeadDim == 192 ? 128 : 0;
}
inline int fwd_value_head_dim(int head_dim_rounded) { return head_dim_rounded == 192 ? 128 : 0; }

// qv kernels (d 64, dv 256 / 512, FwdPolicy::kWideV): one CTA per tile (and split), and as many keys
// per stage as leave Q + Qv + two K/V stages within shared memory: 128 rows (a warpgroup's each)
// by 64 keys at dv 256 (160 KB); 64 rows (shared, kSharedRows) by 64 keys at dv 512 (216 KB) [D:079].
template <int kHeadDimV>
constexpr FwdTileShape fwd_qv_tile() {
  return kHeadDimV <= 256 ? FwdTileShape{128, 64, 2} : FwdTileShape{64, 64, 2};
}
template <typename Element, bool kLocal, bool kVarlen, bool kSoftcap, int kHeadDimV, bool kSplit = false,
          bool kPaged = false>
using FwdQvPolicyFor =
    FwdPolicy<64, Element, MaskFor<kLocal>, fwd_qv_tile<kHeadDimV>(), kVarlen, kSoftcap, kSplit, kPaged, kHeadDimV>;
// The qv kernels' V head dim for v's head dim dv (0: none).
inline int fwd_qv_head_dim_v(int dv) { return dv <= 64 ? 0 : dv <= 256 ? 256 : dv <= 512 ? 512 : 0; }

// FP8 kernels: Q + stages * (K + V as it lands + V^T) <= 227 KB; 192 rows at hdim 64;
// without softcap (which spills with them) from kFwdLongKeysFrom keys FA3's tiles, 160 keys per stage at
// hdim 64 and 224 at hdim 128 (below, 128 keys are faster) [D:080, D:083]. FLASH_FWD_DEV_FP8_BLOCK_N (a tile sweep): keys per stage of the latter, a multiple of 32.
#ifndef FLASH_FWD_DEV_FP8_BLOCK_N
#define FLASH_FWD_DEV_FP8_BLOCK_N 224
#endif
template <int kHeadDim, bool kLongKeys = false, bool kPersistent = false>
constexpr FwdTileShape fwd_fp8_tile() {
  return kHeadDim <= 64    ? FwdTileShape{192, kLongKeys ? 160 : 128, 2, kPersistent}
         : kHeadDim <= 128 ? FwdTileShape{128, kLongKeys ? FLASH_FWD_DEV_FP8_BLOCK_N : 128, 2, kPersistent}
                           : FwdTileShape{128, 128, 2, kPersistent};
}
// Dense calls without softcap stride over their tiles, one CTA per SM (causal / local ones draw them
// from a counter, the producer warpgroup reading each from the ring) on short keys (FwdFp8Dense::long_keys),
// and on long keys at hdim 128, masked hdim 64 and non-causal hdim 256; the others run one CTA per tile
// (non-causal hdim 64: the producer spills in the tile loop; masked hdim 256 at 16k: -8 % persistent,
// not understood) [D:084, D:085, D:090, D:093].
template <int kHeadDim, bool kLocal, bool kVarlen, bool kSoftcap, bool kLongKeys>
constexpr bool fwd_fp8_persistent() {
  return !kVarlen && !kSoftcap &&
         (!kLongKeys || (kHeadDim > 64 && kHeadDim <= 128) || (kHeadDim <= 64 && kLocal) || (kHeadDim > 128 && !kLocal));
}
template <int kHeadDim, bool kLocal, bool kVarlen, bool kSoftcap, bool kLongKeys = false>
using FwdFp8PolicyFor =
    FwdPolicy<kHeadDim, cutlass::float_e4m3_t, MaskFor<kLocal>,
              fwd_fp8_tile<kHeadDim, kLongKeys, fwd_fp8_persistent<kHeadDim, kLocal, kVarlen, kSoftcap, kLongKeys>()>(),
              kVarlen, kSoftcap>;
// The dense FP8 kernels fp8_launch.cuh picks between: the long-keys one where its tile differs from
// the short-keys one (not with softcap, which spills with it), from kFwdLongKeysFrom keys (varlen: the
// longest sequence's) [D:083, D:084].
template <int kHeadDim, bool kLocal, bool kVarlen, bool kSoftcap>
struct FwdFp8Dense {
  using Long = FwdFp8PolicyFor<kHeadDim, kLocal, kVarlen, kSoftcap, true>;
  using Short = FwdFp8PolicyFor<kHeadDim, kLocal, kVarlen, kSoftcap, false>;
  static constexpr bool kHasLong = !kSoftcap && !same_tile(Long::kTile, Short::kTile);
  // Masked hdim 256 calls stay on the persistent short-keys kernel below 16k keys [D:090], dense
  // non-causal hdim 64 ones below 8k [D:093].
  static constexpr bool long_keys(int seqlen_k) {
    return kHasLong && seqlen_k >= (kHeadDim > 128 && kLocal                 ? 16384
                                    : kHeadDim <= 64 && !kLocal && !kVarlen ? 8192
                                                                             : kFwdLongKeysFrom);
  }
  // Whether the kernel picked for seqlen_k draws its tiles from a counter.
  static constexpr bool dynamic(int seqlen_k) {
    return fwd_dynamic_schedule((long_keys(seqlen_k) ? Long::kTile : Short::kTile).persistent, kLocal);
  }
};
// For the binding: whether the dense FP8 call (FP8 head dim, mask, softcap, seqlen_k) needs a tile counter.
inline bool fwd_fp8_needs_tile_counter(int fp8_head_dim, bool local, bool softcap, int seqlen_k) {
  if (!local || softcap) { return false; }
  return fp8_head_dim <= 64    ? FwdFp8Dense<64, true, false, false>::dynamic(seqlen_k)
         : fp8_head_dim <= 128 ? FwdFp8Dense<128, true, false, false>::dynamic(seqlen_k)
                               : FwdFp8Dense<256, true, false, false>::dynamic(seqlen_k);
}
// FP8 over KV caches (varlen): paged (the producer warpgroup gathers K/V, paged_kv.h, and transposes
// V) and split-KV kernels, two consumer warpgroups (128 rows at every head dim); paged ones with 232
// registers each, where hdim 256's 128-key S spills: 96 keys there [D:081]. Three stages at hdim 128:
// a third K / V block in flight lifts the paged gather 5-6 % (hdim 64 unmeasured, 256 does not fit)
// [D:086], and the producer loads two blocks ahead of the V transpose [D:087].
template <int kHeadDim>
constexpr FwdTileShape fwd_fp8_split_tile() {
  return FwdTileShape{128, kHeadDim <= 128 ? 128 : 96, kHeadDim > 64 && kHeadDim <= 128 ? 3 : 2};
}
template <int kHeadDim, bool kLocal, bool kSoftcap, bool kSplit, bool kPaged>
using FwdFp8CachePolicyFor = FwdPolicy<kHeadDim, cutlass::float_e4m3_t, MaskFor<kLocal>, fwd_fp8_split_tile<kHeadDim>(),
                                       true, kSoftcap, kSplit, kPaged>;

// Paged KV kernels take the split tile (decode and chunked prefill over a cache), split or not.
template <int kHeadDim, typename Element, bool kLocal, bool kSoftcap, bool kSplit>
using FwdPagedPolicyFor =
    FwdPolicy<kHeadDim, Element, MaskFor<kLocal>, fwd_split_tile<kHeadDim>(), true, kSoftcap, kSplit, true>;

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

// ------------------------------------------------------------------------------------------
// Backward
// ------------------------------------------------------------------------------------------

// kBlockM query rows per step, kBlockN keys per CTA. Two consumer warpgroups split 128 keys up to
// hdim 128; past that dK + dV need too many registers, so 64 keys and the warpgroups split the head
// dim. 128-query steps at hdim <= 64 [D:035]. Q/dO stages: 2, one past hdim 192 (two would
// leave no shared memory to stage dQ in).
template <int kHeadDim>
constexpr FwdTileShape bwd_tile() {
  constexpr int kStages = kHeadDim > 192 ? 1 : 2;
  constexpr int kBlockM = kHeadDim <= 64 ? 128 : 64;
  return kHeadDim <= 128 ? FwdTileShape{kBlockM, 128, kStages} : FwdTileShape{kBlockM, 64, kStages};
}

// RS path (hdim <= 128): the dV GEMM issued after dS^T is in shared memory, FA3's order; not in
// deterministic mode at hdim 96 / 128 [D:036].
template <int kHeadDim, bool kLocal, bool kDeterministic>
constexpr bool bwd_dv_after_ds() {
  return bwd_tile<kHeadDim>().block_m == 128 || (kHeadDim <= 128 && !kDeterministic);
}

// Persistent (one CTA per SM) at hdim <= 128 in the default mode; causal/local ones draw their
// tiles from a counter, longest first [D:033, D:034]; varlen ones draw compact ids from a counter
// (tile_scheduler.h, VarlenTileWalk over the key blocks) [D:070].
template <int kHeadDim, bool kLocal, bool kDeterministic, bool kVarlen = false>
constexpr bool bwd_persistent() {
  return kHeadDim <= 128 && !kDeterministic;
}

// For the binding: whether the backward kernel for (rounded head dim, mask, mode, varlen) draws its
// tiles from a counter (persistent, and causal/local or varlen).
inline bool bwd_needs_tile_counter(int head_dim_rounded, bool local, bool deterministic, bool varlen) {
  if (!(local || varlen) || deterministic) { return false; }
  switch (head_dim_rounded) {
    case 64: return bwd_persistent<64, true, false>();
    case 96: return bwd_persistent<96, true, false>();
    case 128: return bwd_persistent<128, true, false>();
    case 192: return bwd_persistent<192, true, false>();
    default: return bwd_persistent<256, true, false>();
  }
}

// What the backward kernel of (head dim, dtype, mask, dV order, persistence, varlen, softcap) does
// beyond its tile. The default and deterministic modes share a kernel where these agree.
template <int kHeadDim_, typename Element_, typename Mask_, bool kDvAfterDs_, bool kPersistent_,
          bool kVarlen_ = false, bool kSoftcap_ = false>
struct BwdPolicy {
  using Element = Element_;
  using Mask = Mask_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kLocal = Mask::kLocal;
  static constexpr FwdTileShape kTile = bwd_tile<kHeadDim>();
  static constexpr int kBlockM = kTile.block_m;  // queries per step
  static constexpr int kBlockN = kTile.block_n;  // keys per CTA
  static constexpr int kStages = kTile.stages;
  // RS: P^T and dS^T stay in registers as the A operand of dV / dK (hdim <= 128); SS: through
  // shared memory.
  static constexpr bool kRS = kBlockN == 128;
  static constexpr bool kDvAfterDs = kDvAfterDs_;
  static constexpr bool kPersistent = kPersistent_;
  static constexpr bool kDynamic = kPersistent && (kLocal || kVarlen_);
  // Variable-length batches: sequences packed along the rows (SeqLenInfo); the key blocks that
  // cross a sequence's end are masked in every kernel, not only in causal/local ones.
  static constexpr bool kVarlen = kVarlen_;
  // Scores capped by softcap * tanh; dS^T times the cap's derivative (softcap.h), held through the
  // step in float32 in the persistent kernels and in fp16 in the others: the fewer spills in the
  // step loop of each, from the SASS [D:056].
  static constexpr bool kSoftcap = kSoftcap_;
  using SoftcapDerivative = std::conditional_t<kPersistent_, float, cutlass::half_t>;
  // v, dO and dv may be narrower than q (BwdParams::head_dim_v) where the forward has dv != d
  // kernels (fwd_value_head_dim); the other head dims keep one head dim and their code.
  static constexpr bool kNarrowV = fwd_value_head_dim<kHeadDim>() != 0;
  // SS with one Q/dO stage: Q and dO in two pipelines, so each stage is released as soon as its
  // GEMM has read it [D:041].
  static constexpr bool kSplitQdO = !kRS && kStages == 1;
  // RS causal/local: steps in alternating masked / unmasked loops; not in the dynamic hdim 128
  // kernel, where the two loops spill [D:042].
  static constexpr bool kSplitSteps = kHeadDim <= 64 || !kDynamic;
  // RS: each consumer warpgroup stages its half of the dQ block under its own barriers [D:038].
  static constexpr bool kDqPerWG = kRS && kHeadDim != 96;
  // With kDvAfterDs: the dV GEMM's first kDvFirstKBlocks K blocks go before the dP^T wait, so that
  // their exps overlap the dP^T GEMM [D:037]; where the rest goes: 0 before the warpgroups
  // meet for dQ, 1 after dQ and dK, 2 between them [D:037].
  static constexpr bool kDvSplit = kDvAfterDs && kHeadDim != 96;
  static constexpr int kDvFirstKBlocks = (kHeadDim == 64 && kLocal) ? 2 : 1;
  static constexpr int kDvLate = !kDvSplit ? 0 : kHeadDim == 128 ? 2 : (kHeadDim == 64 && kLocal) ? 1 : 0;
  // hdim 64: the 16-bit P^T for dV is made after dS^T (FA3's order), so that dS^T uses the float32
  // P^T without both copies live at once [D:039].
  static constexpr bool kLateP16 = kDvAfterDs && kHeadDim == 64;
  // 128-query steps: the dQ GEMM split over queries between the warpgroups (m64n64 WGMMAs).
  static constexpr bool kDqSplitQueries = kBlockM == 128;
  // hdim 128: dS stored keys-contiguous with transposing stmatrix [D:043].
  static constexpr bool kDsKMajor = kRS && kHeadDim == 128;
};

template <int kHeadDim, typename Element, bool kLocal, bool kDeterministic, bool kVarlen = false,
          bool kSoftcap = false>
using BwdPolicyFor = BwdPolicy<kHeadDim, Element, MaskFor<kLocal>, bwd_dv_after_ds<kHeadDim, kLocal, kDeterministic>(),
                               bwd_persistent<kHeadDim, kLocal, kDeterministic, kVarlen>(), kVarlen, kSoftcap>;

}  // namespace flash
