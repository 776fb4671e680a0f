// Which (m_block, head, batch) tiles a CTA computes.
//
// Tile ids run m_block fastest, so CTAs working at the same time share a head and its K/V stay
// in L2. One CTA per tile (grid = (m_blocks, heads, batch)), or persistent: one CTA per SM
// striding over the tile ids, so a CTA's producer loads the next tile's K/V while its consumers
// are still busy with the current tile's epilogue. With a causal/local mask the heavier tiles
// (larger m_block) go first.
//
// Persistent with a causal/local mask, m_block fastest would be a trap: a CTA's tiles are
// id, id + grid, id + 2 grid ..., and when grid is a multiple of num_m_blocks (132 = 12 x 11, hdim
// 64 at 2k) every tile of a CTA has the same m_block, so some CTAs get only the heaviest tiles
// (measured: 0.64x cuDNN against 0.89x one CTA per tile). There the order is instead: groups of
// heads_per_group (batch x head)s, whose K/V fit in L2 together; inside a group m_block slowest,
// heaviest first, and the group's heads fastest. CTAs draw these ids from an atomic counter
// (FwdKernel::kDynamic), not by a static stride: a static order left CTAs idle (tile_size.h).
#pragma once

#include "kernel/config.h"

#include <type_traits>

#include <cutlass/cutlass.h>
#include <cutlass/fast_math.h>

namespace flash {

// decode's divisions by run-time values as cutlass::FastDivmod (a multiply-high and a shift,
// divisors prepared on the host) instead of ~25-instruction integer divisions; ncu at hdim 64
// causal 512 counted ~1040 instructions per consumer warp and tile outside the key-block loop.
// Measured with the relative mask (mask.h): causal +2-5 % x cuDNN, non-causal equal (2026-11-30).
// FLASH_FWD_DEV_FAST_DECODE=0 restores plain division. (Deleting the old paths changed the SASS a
// little, through the unreachable code after decode's first branch: left for a GPU-checked step.)
#ifndef FLASH_FWD_DEV_FAST_DECODE
#define FLASH_FWD_DEV_FAST_DECODE 1
#endif
constexpr bool kFwdFastDecode = FLASH_FWD_DEV_FAST_DECODE;

struct FwdTile {
  int m_block;
  int head;
  int batch;
};

template <bool kPersistent, bool kHeavyLast>
struct FwdTileScheduler {
  static constexpr bool kGrouped = kPersistent && kHeavyLast;
  // decode's divisors (kFwdFastDecode), built on the host into the kernel's parameters.
  struct FastDivisors {
    cutlass::FastDivmod m_blocks, heads, group_tiles, group;
  };
  struct NoDivisors {};
  using Divisors = std::conditional_t<kFwdFastDecode, FastDivisors, NoDivisors>;
  static Divisors divisors(int num_m_blocks, int heads, int heads_per_group) {
    if constexpr (kFwdFastDecode) {
      return {cutlass::FastDivmod(num_m_blocks), cutlass::FastDivmod(heads),
              cutlass::FastDivmod(num_m_blocks * heads_per_group), cutlass::FastDivmod(heads_per_group)};
    } else {
      return {};
    }
  }

  int num_m_blocks;
  int heads;
  int num_tiles;
  int head_batches;
  int group;  // (batch x head)s per group (kGrouped)

  CUTLASS_HOST_DEVICE FwdTileScheduler(int num_m_blocks_, int heads_, int batch, int heads_per_group_)
      : num_m_blocks(num_m_blocks_),
        heads(heads_),
        num_tiles(num_m_blocks_ * heads_ * batch),
        head_batches(heads_ * batch),
        group(heads_per_group_) {}

  // How many (batch x head)s kGrouped walks together: as many as keep their K/V within a share of
  // L2 (H100/H200: 50 MB; a third is kept for Q, O and the other heads' tails), whole GQA groups.
  static int heads_per_group(int heads, int q_per_kv, int batch, int64_t kv_bytes_per_head) {
    int64_t const budget = 16ll << 20;
    int64_t const kv_heads = kv_bytes_per_head > 0 ? budget / (2 * kv_bytes_per_head) : heads;
    int64_t const per_group = (kv_heads < 1 ? 1 : kv_heads) * q_per_kv;
    int64_t const all = int64_t(heads) * batch;
    return int(per_group < all ? per_group : all);
  }

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
  // The static order (kGrouped kernels draw from a counter instead and never call it).
  CUTLASS_DEVICE int next(int tile) const {
    static_assert(!kGrouped, "grouped (persistent causal/local) tiles are drawn dynamically");
    return kPersistent ? tile + int(gridDim.x) : num_tiles;
  }
  CUTLASS_DEVICE bool valid(int tile) const { return tile < num_tiles; }

  // div: the kernel parameters' divisors, read where they are (not copied into registers).
  CUTLASS_HOST_DEVICE FwdTile decode(int tile, Divisors const& div) const {
    if constexpr (kFwdFastDecode) {
      if constexpr (kGrouped) {
        int g, rest;
        div.group_tiles(g, rest, tile);
        int const first_hb = g * group;
        int const hbs = min(group, head_batches - first_hb);  // the last group may be smaller
        int q, r;
        if (hbs == group) {
          div.group(q, r, rest);
        } else {
          q = rest / hbs;
          r = rest - q * hbs;
        }
        int batch, head;
        div.heads(batch, head, first_hb + r);
        return {num_m_blocks - 1 - q, head, batch};
      } else {
        int head_batch, m, batch, head;
        div.m_blocks(head_batch, m, tile);
        div.heads(batch, head, head_batch);
        return {kHeavyLast ? num_m_blocks - 1 - m : m, head, batch};
      }
    }
    if constexpr (kGrouped) {
      int const group_tiles = num_m_blocks * group;
      int const g = tile / group_tiles;
      int const rest = tile - g * group_tiles;
      int const first_hb = g * group;
      int const hbs = min(group, head_batches - first_hb);  // the last group may be smaller
      int const head_batch = first_hb + rest % hbs;
      return {num_m_blocks - 1 - rest / hbs, head_batch % heads, head_batch / heads};
    } else {
      int const m = tile % num_m_blocks;
      int const head_batch = tile / num_m_blocks;
      return {kHeavyLast ? num_m_blocks - 1 - m : m, head_batch % heads, head_batch / heads};
    }
  }
};

}  // namespace flash
