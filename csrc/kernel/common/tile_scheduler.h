// Which tiles a CTA computes: forward (m_block, head, batch), backward (key block, KV head, batch).
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
// [D:005]. There the order is instead: groups of
// heads_per_group (batch x head)s, whose K/V fit in L2 together; inside a group m_block slowest,
// heaviest first, and the group's heads fastest. CTAs draw these ids from an atomic counter
// (FwdPolicy::kDynamic), not by a static stride: a static order left CTAs idle [D:005].
#pragma once

#include "kernel/common/config.h"

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>
#include <cutlass/fast_math.h>

#include "kernel/common/block_range.h"
#include "kernel/common/seqlen.h"

namespace flash {

// decode divides by run-time values with cutlass::FastDivmod (a multiply-high and a shift, the
// divisors prepared on the host) instead of ~25-instruction integer divisions [D:011].
struct FwdTile {
  int m_block;
  int head;
  int batch;
};

template <bool kPersistent, bool kHeavyLast>
struct FwdTileScheduler {
  static constexpr bool kGrouped = kPersistent && kHeavyLast;
  // decode's divisors, built on the host into the kernel's parameters.
  struct Divisors {
    cutlass::FastDivmod m_blocks, heads, group_tiles, group;
  };
  static Divisors divisors(int num_m_blocks, int heads, int heads_per_group) {
    return {cutlass::FastDivmod(num_m_blocks), cutlass::FastDivmod(heads),
            cutlass::FastDivmod(num_m_blocks * heads_per_group), cutlass::FastDivmod(heads_per_group)};
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
};

// Varlen persistent kernels: ids that count only the tiles holding rows of their sequence,
// sequence-major in batch order, so that no CTA walks the longest sequence's grid once per
// sequence. kOrder, within a sequence: kBlocksFastest (the blocks of one head, then the next head),
// kHeavyFirst (per group of heads_per_group heads, heads fastest, the forward's heaviest m_block,
// the last, first), kLowFirst (the same with block 0 first: the causal backward's heaviest key
// block). kKeys: the tiles are key blocks of the KV heads (the backward), else query blocks of
// the query heads. A warp holds 32 sequences' tile counts (one per lane, with their inclusive
// prefix) and finds tile t's sequence by a ballot, moving the window forward only: a CTA's ids
// only grow (static stride or counter), as in FA3's varlen scheduler. Global reads happen only
// when the window moves. Every lane of the warp calls find with the same t.
enum class WalkOrder { kBlocksFastest, kHeavyFirst, kLowFirst };

// A walked forward tile with its sequence's extent, as the producer hands it to the consumers
// (m_block -1: past the last tile).
struct CompactTile {
  FwdTile tile;
  SeqExtent seq;
};

template <int kBlock, WalkOrder kOrder, bool kKeys = false>
struct VarlenTileWalk {
  int first_seq = -32;   // the window's first sequence (-32: none read yet)
  int tiles_before = 0;  // tiles of the sequences before the window
  int blocks = 0;        // this lane's sequence's blocks
  int upto = 0;          // tiles of the window's sequences up to this lane's, inclusive
  int heads_per_group = 1 << 30;  // kLowFirst / kHeavyFirst: heads walked together (sized for L2 by the caller)

  template <typename Params>
  CUTLASS_DEVICE static int heads(Params const& p) {
    if constexpr (kKeys) {
      return p.heads_kv;
    } else {
      return p.heads_q;
    }
  }

  // Tile t as (block, head, sequence); false past the last tile.
  template <typename Params>
  CUTLASS_DEVICE bool find(Params const& p, int t, FwdTile& out) {
    int const lane = int(threadIdx.x % 32);
    int const batch = p.varlen.batch;
    int window = __shfl_sync(0xffffffffu, upto, 31);
    while (first_seq < 0 || t >= tiles_before + window) {
      if (first_seq + 32 >= batch) { return false; }
      tiles_before += window;
      first_seq += 32;
      int const b = first_seq + lane;
      blocks = 0;
      if (b < batch) {
        int offset, length;
        if constexpr (kKeys) {
          VarSeqLen<Params>::key_segment(p.varlen.cu_seqlens_k, p.varlen.seqused_k, b, p.varlen.total_k, p.seqlen_k,
                                         offset, length);
        } else {
          VarSeqLen<Params>::segment(p.varlen.cu_seqlens_q, p.varlen.seqused_q, b, p.varlen.total_q, offset, length);
        }
        blocks = (length + kBlock - 1) / kBlock;
      }
      upto = blocks * heads(p);
      CUTLASS_PRAGMA_UNROLL
      for (int d = 1; d < 32; d *= 2) {
        int const x = __shfl_up_sync(0xffffffffu, upto, d);
        if (lane >= d) { upto += x; }
      }
      window = __shfl_sync(0xffffffffu, upto, 31);
    }
    int const i = __popc(__ballot_sync(0xffffffffu, tiles_before + upto <= t));  // sequences before t's
    int const n = __shfl_sync(0xffffffffu, blocks, i);
    int const start = tiles_before + __shfl_sync(0xffffffffu, upto, i) - n * heads(p);
    int const rem = t - start;
    if constexpr (kOrder != WalkOrder::kBlocksFastest) {
      // Per group of heads: block 0 of each, then 1, ... (kLowFirst), or the last block of each
      // first (kHeavyFirst).
      int const group = min(heads_per_group, heads(p));
      int const first = rem / (group * n) * group;
      int const size = min(group, heads(p) - first);  // the last group may be short
      int const in_group = rem - first * n;
      int const block = in_group / size;
      out = {kOrder == WalkOrder::kHeavyFirst ? n - 1 - block : block, first + in_group % size, first_seq + i};
    } else {
      out = {rem % n, rem / n, first_seq + i};
    }
    return true;
  }
};

// Tile items (ids, or decoded tiles) from the producer thread, which draws them from the
// scheduler's counter, to the other roles of the CTA, through two slots in shared memory. Item
// k goes to slot k % 2; the producer waits on empty with parity ((k / 2) & 1) ^ 1 before writing
// it, the readers on full with parity (k / 2) & 1 before reading it.
template <typename Item_>
struct TileRing {
  using Item = Item_;
  Item items[2];
  alignas(16) cutlass::arch::ClusterBarrier full[2];   // item written (1 arrival: the producer)
  alignas(16) cutlass::arch::ClusterBarrier empty[2];  // item read (every reader thread)

  CUTLASS_DEVICE void init(int readers) {
    for (int slot = 0; slot < 2; ++slot) {
      full[slot].init(1);
      empty[slot].init(readers);
    }
  }
};

// Backward tiles: (key block, KV head, batch). One CTA per tile (grid = (key blocks, KV heads,
// batch)); persistent non-causal: a static stride over the tiles, key blocks fastest
// [D:033]; persistent causal/local (kDynamic): tile ids drawn from an atomic counter, longest
// first [D:034]. Every role of the CTA walks the same tiles; the producer thread draws them and
// hands them on through the ring.
struct BwdProgress {
  int steps = 0;     // steps of the CTA's earlier tiles
  int kv_loads = 0;  // K/V blocks loaded for them (tiles without steps load none)
};

template <int kBlockM, int kBlockN, bool kLocal, bool kPersistent, bool kDynamic, bool kVarlen = false>
struct BwdTileScheduler {
  using Range = BwdBlockRange<kBlockM, kBlockN, kLocal>;
  // Varlen persistent kernels draw compact ids (VarlenTileWalk over the key blocks): causal/local
  // ones the heaviest key block (block 0) of every head first, the others a head's blocks together
  // (they stream the same Q / dO).
  static constexpr bool kCompact = kVarlen && kDynamic;
  using Walk = VarlenTileWalk<kBlockN, kLocal ? WalkOrder::kLowFirst : WalkOrder::kBlocksFastest, /*kKeys=*/true>;
  struct Tile {
    int n_block, head_kv, batch;
    Range range;
    int num_steps;
  };
  // Deterministic mode with a causal/local mask orders each dQ block's additions by descending key
  // block (dq_reducer.h, dq_turn), so those CTAs launch first (key_block_of_cta).
  static constexpr bool kDetDescending = kLocal;

  // The CTA's tiles in order: its blockIdx one; (kPersistent, non-causal) tiles blockIdx.x,
  // + gridDim.x, ... of the (key blocks, KV heads, batch) grid, key blocks fastest; (kDynamic)
  // tile ids blockIdx.x, then from the counter, decoded by tile_coords. kDraws: the producer
  // thread, which draws the ids and writes them into the ring; every other role reads them there.
  // fn(tile, seq, progress): seq is the tile's sequence (seqlen.h). Varlen: the grid covers the
  // longest sequence; a key block past its own sequence's end has no steps.
  template <bool kDraws, typename Params, typename Storage, typename Fn>
  CUTLASS_DEVICE static void for_each_tile(Params const& params, Storage& smem, Fn&& fn) {
    BwdProgress progress;
    auto visit = [&](int n_block, int head_kv, int batch) {
      SeqLenFor<kVarlen, Params> const seq(params, batch);
      BwdBlockRange<kBlockM, kBlockN, kLocal> const range(n_block, seq.seqlen_q(params), seq.diag(params), params.window_left,
                                                          params.window_right);
      int num_steps = range.count() * params.q_heads_per_kv_head;
      if constexpr (kVarlen) {
        if (n_block * kBlockN >= seq.seqlen_k(params)) { num_steps = 0; }
      }
      Tile const tile{n_block, head_kv, batch, range, num_steps};
      fn(tile, seq, progress);
      progress.steps += tile.num_steps;
      progress.kv_loads += tile.num_steps > 0 ? 1 : 0;
    };
    int const n_blocks = (params.seqlen_k + kBlockN - 1) / kBlockN;
    int const tiles = n_blocks * params.heads_kv * num_batches(params);
    if constexpr (kCompact) {
      // Whole warps (the producer's too): ids from the counter, each warp finding its tiles by the
      // walk; one lane of the producer warp waits on and writes the ring and draws the next id.
      Walk walk;
      walk.heads_per_group = section_pairs(params, params.heads_kv);
      int const lane = int(threadIdx.x % 32);
      int tile = blockIdx.x;
      for (int iteration = 0;; ++iteration) {
        int const slot = iteration & 1;
        if constexpr (kDraws) {
          int next = 0;
          if (lane == 0) {
            smem.ring.empty[slot].wait(((iteration >> 1) & 1) ^ 1);  // every reader has read its last id
            smem.ring.items[slot] = tile;
            smem.ring.full[slot].arrive();
            next = atomicAdd(params.tile_counter, 1) + int(gridDim.x);  // in flight meanwhile
          }
          next = __shfl_sync(0xffffffffu, next, 0);
          FwdTile t;
          if (!walk.find(params, tile, t)) { break; }
          visit(t.m_block, t.head, t.batch);
          tile = next;
        } else {
          smem.ring.full[slot].wait((iteration >> 1) & 1);
          tile = smem.ring.items[slot];
          smem.ring.empty[slot].arrive();
          FwdTile t;
          if (!walk.find(params, tile, t)) { break; }
          visit(t.m_block, t.head, t.batch);
        }
      }
    } else if constexpr (kDynamic) {
      int tile = blockIdx.x;
      for (int iteration = 0;; ++iteration) {
        int const slot = iteration & 1;
        if constexpr (kDraws) {
          smem.ring.empty[slot].wait(((iteration >> 1) & 1) ^ 1);  // every reader has read its last id
          smem.ring.items[slot] = tile;
          smem.ring.full[slot].arrive();
          if (tile >= tiles) { break; }
          int const next = atomicAdd(params.tile_counter, 1) + int(gridDim.x);  // in flight meanwhile
          BwdCoords const c = tile_coords(params, tile, n_blocks);
          visit(c.n_block, c.head_kv, c.batch);
          tile = next;
        } else {
          smem.ring.full[slot].wait((iteration >> 1) & 1);
          tile = smem.ring.items[slot];
          smem.ring.empty[slot].arrive();
          if (tile >= tiles) { break; }
          BwdCoords const c = tile_coords(params, tile, n_blocks);
          visit(c.n_block, c.head_kv, c.batch);
        }
      }
    } else if constexpr (kPersistent) {
      for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        visit(t % n_blocks, (t / n_blocks) % params.heads_kv, t / (n_blocks * params.heads_kv));
      }
    } else {
      visit(key_block_of_cta(params), int(blockIdx.y), int(blockIdx.z));
    }
  }

  template <typename Params>
  CUTLASS_DEVICE static int num_batches(Params const& params) {
    if constexpr (kVarlen) {
      return params.varlen.batch;
    } else {
      return int(get<3>(params.shape_q));
    }
  }

  // kDynamic: tile id -> (key block, KV head, batch), longest first over all heads. The ids run in
  // sections of up to kLptBytes of Q, dO and dQ accumulator ((KV head, batch) pairs, a power of
  // two of them, as L2 reuse wants), key blocks major and pairs minor within a section: every
  // pair's key block 0 (which sees the most queries under a causal mask) comes before any pair's
  // block 1.
  struct BwdCoords {
    int n_block, head_kv, batch;
  };
  static constexpr int64_t kLptBytes = 40ll << 20;
  // (KV head, batch) pairs per section, of `pairs`: a power of two whose Q, dO (16-bit) and dQ
  // accumulator (float) fit kLptBytes (varlen: at the longest sequence's length).
  template <typename Params>
  CUTLASS_DEVICE static int section_pairs(Params const& params, int pairs) {
    int const rows = kVarlen ? params.seqlen_q : params.seqlen_q_padded;
    int64_t const bytes_per_pair = int64_t(rows) * params.q_heads_per_kv_head * params.head_dim * (2 * 2 + 4);
    int const fit = int(max(int64_t(1), min(int64_t(pairs), kLptBytes / max(bytes_per_pair, int64_t(1)))));
    return 1 << (31 - __clz(fit));  // a power of two <= fit
  }
  template <typename Params>
  CUTLASS_DEVICE static BwdCoords tile_coords(Params const& params, int tile, int n_blocks) {
    int const pairs = params.heads_kv * num_batches(params);
    int const section_pairs = BwdTileScheduler::section_pairs(params, pairs);
    int const section = tile / (section_pairs * n_blocks);
    int const first_pair = section * section_pairs;
    int const in_section = tile - first_pair * n_blocks;
    int const size = min(section_pairs, pairs - first_pair);  // the last section may be short
    int const pair = first_pair + in_section % size;
    return {in_section / size, pair % params.heads_kv, pair / params.heads_kv};
  }

  // Varlen, one CTA per key block of the longest sequence: whether this CTA's block lies past its
  // own sequence's keys. Such a CTA has nothing to write (its rows belong to the next sequence,
  // and no dQ turn counts it: dq_reducer.h), so the kernel returns before any setup: ~128k of the
  // ~133k CTAs at one 16k sequence among 64 short ones.
  template <typename Params>
  CUTLASS_DEVICE static bool cta_past_its_keys(Params const& params) {
    if constexpr (kVarlen && !kPersistent) {
      int offset, length;
      VarSeqLen<Params>::key_segment(params.varlen.cu_seqlens_k, params.varlen.seqused_k, int(blockIdx.z),
                                     params.varlen.total_k, params.seqlen_k, offset, length);
      return key_block_of_cta(params) * kBlockN >= length;
    } else {
      return false;
    }
  }

  // The key block of this CTA: blockIdx.x, reversed in deterministic descending mode so that the
  // key blocks a CTA waits for were launched before it.
  template <typename Params>
  CUTLASS_DEVICE static int key_block_of_cta(Params const& params) {
    if constexpr (kDetDescending) {
      if (params.dq_semaphore != nullptr) { return int(gridDim.x) - 1 - int(blockIdx.x); }
    }
    return blockIdx.x;
  }
};

}  // namespace flash
