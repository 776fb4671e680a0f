// The SM90 forward kernel: one CTA computes O and LSE for kBlockM query rows of one head.
//
// Warpgroup 0 is the producer: after giving registers back (setmaxnreg), one elected thread
// issues TMA loads of the Q tile (once) and of K/V blocks into a kStages-deep shared-memory
// pipeline whose stages complete by mbarrier transaction counts. Warpgroups 1..kBlockM/64 are
// consumers: each owns 64 query rows, computes S = Q.K^T with WGMMA from shared memory, the
// online softmax in registers, and O += P.V with WGMMA taking P from registers. S(j) and
// P(j+1).V(j+1) are issued together, so the softmax of block j runs while the tensor cores
// still work on the previous block's P.V (intra-warpgroup overlap). The epilogue writes O
// through shared memory with a TMA store, or (persistent kernels with no room for an O buffer of
// their own, kDirectO) straight from registers in 16-byte stores.
#pragma once

#include "kernel/config.h"

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "kernel/mask.h"
#include "kernel/named_barriers.h"
#include "kernel/softmax.h"
#include "kernel/tile_scheduler.h"
#include "kernel/tile_size.h"
#include "kernel/utils.h"

namespace flash {

using namespace cute;

// FwdKernel::kDirectO: where O goes when it skips shared memory.
template <typename Element>
struct DirectOArgs {
  Element* ptr;
  int64_t row_stride, head_stride, batch_stride;
};
struct NoDirectO {};

// kPersistent: one CTA per SM striding over the tiles; kOwnO (persistent only): O is staged in its
// own shared-memory buffer, so the next tile's Q may load once this tile's last Q.K^T GEMM has read
// Q instead of after O's TMA store. tile_size.h picks both per head dim and mask.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, typename Element_, bool kLocal_,
          bool kPersistent_ = false, bool kOwnO_ = false>
struct FwdKernel {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr bool kLocal = kLocal_;

  static constexpr int kNumMmaWarpGroups = kBlockM / 64;
  static constexpr int kNumMmaThreads = 128 * kNumMmaWarpGroups;
  static constexpr int kNumThreads = kNumMmaThreads + 128;
  static_assert(kBlockM % 64 == 0 && kNumMmaWarpGroups >= 1 && kNumMmaWarpGroups <= 3);
  static_assert(kBlockN % 16 == 0 && kHeadDim % 16 == 0);

  // One consumer warpgroup (kBlockM = 64): two CTAs per SM where their shared memory fits, so
  // one CTA's prologue, softmax and epilogue overlap the other's GEMMs (the 64-row tile has no
  // ping-pong partner inside the CTA). kCtasPerSm, below, once the shared memory is known. Not past
  // head dim 128: ptxas then needs more than the 128 registers per thread two CTAs start with
  // for one P.V instruction (64 x 256 accumulators: "insufficient registers", asks for 158).
  // Measured against the table's tiles (NOTES.md, fifth session): slower except hdim 128 causal
  // at 512 keys, so no table entry has kBlockM = 64; developer builds can still pick it.
  static constexpr bool kMaybeTwoCtas = kNumMmaWarpGroups == 1 && kHeadDim <= 128;

  using TileShapeMNK = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;
  using AtomLayoutMNK = Layout<Shape<Int<kNumMmaWarpGroups>, _1, _1>>;
  // S = Q.K^T: both operands K-major in shared memory.
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, TileShapeMNK>(), AtomLayoutMNK{}));
  // O += P.V: P from registers, V^T read MN-major (V is stored as it arrives, head dim fastest).
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      AtomLayoutMNK{}));

  // The causal diagonal block (thirty-first session; causal/local 128-key tiles, hdim 64): a
  // warpgroup whose rows see at most the first half of the tile's first key block (the diagonal
  // block of the tile's upper 64 rows) masks and exponentiates only that half and sets the other
  // half of P to 0; one whose rows all see the first half whole masks only the second half. The
  // GEMMs stay full width: a run-time choice between two WGMMA shapes serializes them (ptxas
  // C7518, thirtieth session). hdim 64 causal x cuDNN 512 / 1k / 8k / 16k: 0.976 / 0.981 / 1.174 /
  // 1.218 -> 1.004 / 1.021 / 1.185 / 1.240; hdim 128 within the spread (-1.2 to +0.5 %): off.
  // FLASH_FWD_DEV_HALF_SOFTMAX=0/1 forces it.
#ifdef FLASH_FWD_DEV_HALF_SOFTMAX
  static constexpr bool kHalfSoftmax = bool(FLASH_FWD_DEV_HALF_SOFTMAX) && kLocal_ && kBlockN_ == 128;
#else
  static constexpr bool kHalfSoftmax = kHeadDim_ == 64 && kLocal_ && kBlockN_ == 128;
#endif
  using TiledMmaQKHalf = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<kBlockM>, Int<kBlockN / 2>, Int<kHeadDim>>>(),
      AtomLayoutMNK{}));

  using SmemAtom = decltype(smem_atom_k_major<Element, kHeadDim>());
  // Q tiles in row-major order of atoms so that each warpgroup's 64 rows form one contiguous
  // block laid out exactly like SmemLayoutO64: the epilogue reuses them for O.
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}, Step<_2, _1>{}));
  using SmemLayoutO64 = decltype(tile_to_shape(SmemAtom{}, Shape<_64, Int<kHeadDim>>{}, Step<_2, _1>{}));
  using SmemLayoutKV = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  // (head_dim, block_n, stages) view of V: the B operand of P.V.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{})));

  // Global tensors are (seqlen, head_dim, heads, batch) with a unit head_dim stride.
  using ShapeQKV = Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideQKV = Stride<int64_t, _1, int64_t, int64_t>;
  using TmaQ = decltype(make_tma_copy(
      SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQKV{}),
      SmemLayoutQ{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaKV = decltype(make_tma_copy(
      SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQKV{}),
      take<0, 2>(SmemLayoutKV{}), Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  using TmaO = decltype(make_tma_copy(
      SM90_TMA_STORE{}, make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)), ShapeQKV{}, StrideQKV{}),
      SmemLayoutO64{}, Shape<_64, Int<kHeadDim>>{}, _1{}));

  using Scheduler = FwdTileScheduler<kPersistent_, kLocal>;
  // Persistent causal/local CTAs take their next tile from an atomic counter (the scheduler's
  // heaviest-first order, grouped for L2) instead of a static stride, so a CTA that drew light
  // tiles takes more of them. The producer thread draws the id and hands it to the consumers
  // through a two-slot ring in shared memory.
  static constexpr bool kDynamic = fwd_dynamic_schedule(kPersistent_, kLocal);
  // The key-block loop split in three around its unmasked inner blocks (causal/local masks;
  // non-causal kernels mask only a partial last block and keep one loop). Measured x cuDNN,
  // causal at 512 / 2k / 8k: hdim 64 0.90 / 0.96 / 1.04 -> 0.90 / 0.98 / 1.07, hdim 128 0.96 /
  // 1.02 / 1.04 -> 0.99 / 1.08 / 1.10, hdim 256 0.82 / 0.93 / 1.03 -> 0.83 / 0.94 / 1.05 (its
  // single loop spilled: 14 local-memory instructions per iteration, the split inner loop 6).
  // FLASH_FWD_DEV_SPLIT_MASK=0/1 forces it.
#ifdef FLASH_FWD_DEV_SPLIT_MASK
  static constexpr bool kSplitMask = FLASH_FWD_DEV_SPLIT_MASK;
#else
  static constexpr bool kSplitMask = kLocal;
#endif
  struct MaskIfNeeded {};  // a block() argument: the range decides at run time
  // Max-free key blocks: after the tile's first full unmasked block (whose max is taken exactly),
  // a block skips the row-max search while no p exceeds the lazy rescale's slack (softmax.h,
  // block_without_max); a warpgroup in which some thread would exceed it computes S(n) again and
  // takes the max. Measured x cuDNN, off -> on (3 rounds, one run of
  // tools/device_plan_fwd_merge.sh, 2026-11-30), at 512 / 1025 / 2k / 8k:
  //   hdim 64 non-causal 1.034 / 1.250 / 1.121 / 1.165 -> 1.004 / 1.257 / 1.167 / 1.235,
  //           causal     0.946 / 0.998 / 1.010 / 1.124 -> 0.916 / 0.995 / 1.022 / 1.169 (on from
  //           4k, the 192-row kernel);
  //   hdim 96 (1025 / 2k / 8k) non-causal 1.061 / 1.054 / 1.123 -> 1.179 / 1.199 / 1.307,
  //           causal 1.033 / 1.082 / 1.210 -> 1.068 / 1.145 / 1.302;
  //   hdim 128 non-causal 1.026 / 1.079 / 1.026 / 1.092 -> 1.040 / 1.138 / 1.097 / 1.131,
  //           causal 1.018 / 1.074 / 1.120 / 1.157 -> 0.996 / 1.052 / 1.119 / 1.169 (off);
  //   hdim 192 (1025 / 2k / 8k) non-causal 1.129 / 1.056 / 1.101 -> 1.170 / 1.066 / 1.155,
  //           causal 0.979 / 1.021 / 1.149 -> 0.949 / 1.017 / 1.147 (off);
  //   hdim 256 non-causal 0.986 / 1.167 / 1.059 / 1.112 -> 0.770 / 1.169 / 1.065 / 1.100 (off
  //           in the short-keys persistent kernel), causal 0.955 / 1.032 / 1.040 / 1.117 ->
  //           0.909 / 1.006 / 1.011 / 1.116 (off).
  // Before the exact first max, key lengths just past a block multiple lost 25-37 % (the lazy
  // rule kept the max of the 1-key first block). FLASH_FWD_DEV_MAX_FREE=0/1 forces it off/on.
#ifdef FLASH_FWD_DEV_MAX_FREE
  static constexpr bool kMaxFreePolicy = bool(FLASH_FWD_DEV_MAX_FREE);
#else
  static constexpr bool kMaxFreePolicy =
      kHeadDim == 96 || (kHeadDim == 64 && (!kLocal || kBlockM == 192)) ||
      (!kLocal && (kHeadDim == 128 || kHeadDim == 192 || (kHeadDim == 256 && !kPersistent_)));
#endif
  static constexpr bool kMaxFree = kMaxFreePolicy && kLazyRescale;
  static_assert(!kMaxFree || kFwdVoteHwBarrier + kNumMmaWarpGroups <= 8, "vote barriers past CUTLASS's reserved ids");
  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;

  static constexpr uint32_t kBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kBytesKV = kBlockN * kHeadDim * sizeof(Element);

  struct NoO {};
  struct BufferO {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> o;
  };
  // Own-O persistent kernels: a second Q buffer, used by every other tile, so the producer loads
  // the next tile's Q while this tile still reads its own (with one buffer the next Q could start
  // only after this tile's last Q.K^T GEMM, and short tiles waited for it at their first GEMM).
  // With the lazy O-store wait below, measured x cuDNN at 512 / 1k / 2k (3 rounds, one run,
  // 2026-11-30): hdim 64 non-causal 0.989 / 1.022 / 1.125 -> 1.034 / 1.060 / 1.163, causal 0.936 /
  // 0.973 / 0.986 -> 0.956 / 0.981 / 0.993; hdim 128 causal 1.013 / 1.092 / 1.116 -> 1.009 /
  // 1.090 / 1.123 (equal). FLASH_FWD_DEV_Q2=0 turns it off.
#ifndef FLASH_FWD_DEV_Q2
#define FLASH_FWD_DEV_Q2 1
#endif
  static constexpr bool kQ2 = kPersistent_ && kOwnO_ && bool(FLASH_FWD_DEV_Q2);
  struct BufferOQ2 {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> o;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q2;
    alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_q2;
    alignas(16) cutlass::arch::ClusterBarrier barrier_q2_empty;
  };
  struct NoRing {};
  // At hdim 64 the ring carries the decoded tile (m_block, head, batch; m_block -1 ends the
  // loop), so the consumers decode nothing between tiles: +1-1.5 % at 512-1k causal keys, where
  // a tile is a few key blocks (sixteenth session). At hdim 128 / 256 it measured nothing, and
  // the producer then spills (84 / 32 B in 24 registers). FLASH_FWD_DEV_RING_DECODE=0 / 1 forces
  // it off / on for every head dim.
#ifdef FLASH_FWD_DEV_RING_DECODE
  static constexpr bool kRingDecode = bool(FLASH_FWD_DEV_RING_DECODE);
#else
  static constexpr bool kRingDecode = kHeadDim <= 64;
#endif
  struct TileRing {  // kDynamic: tile ids (kRingDecode: decoded tiles) from the producer to the consumers
    std::conditional_t<kRingDecode, FwdTile, int> ids[2];
    alignas(16) cutlass::arch::ClusterBarrier full[2];   // id written (1 arrival: the producer)
    alignas(16) cutlass::arch::ClusterBarrier empty[2];  // id read (every consumer thread)
  };
  template <bool kOwnO>
  struct Storage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;  // O reuses it unless kOwnO
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutKV>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutKV>> v;
    std::conditional_t<kOwnO, std::conditional_t<kQ2, BufferOQ2, BufferO>, NoO> o;
    alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_q;  // Q tile landed
    alignas(16) cutlass::arch::ClusterBarrier barrier_q_empty;       // Q may be overwritten
    alignas(16) typename Pipeline::SharedStorage pipeline_k;
    alignas(16) typename Pipeline::SharedStorage pipeline_v;
    std::conditional_t<kDynamic, TileRing, NoRing> ring;
  };
  static constexpr bool kSeparateO = kPersistent_ && kOwnO_;
  // Persistent kernels without room for an O buffer of their own (hdim 128 long keys 128x176,
  // hdim 256 below 4k keys) store O from registers straight to global memory (store_o_direct), so
  // that Q is released after the tile's last Q.K^T GEMM as with an own O buffer. Staged in Q's
  // buffer instead, the next tile's Q loaded only after this tile's O TMA store had read it, and
  // the next tile's first GEMM waited for that load. Measured x cuDNN (3 rounds, one run,
  // twenty-fifth session), staged -> direct: hdim 256 non-causal 512 / 768 0.971 / 1.020 -> 1.046
  // / 1.068, causal 0.997 / 1.018 -> 1.033 / 1.034; hdim 128 with 128x176 at 8k / 16k 643 / 672
  // -> 676 / 684 TFLOP/s. 4-byte stores (no transpose) lost 11-15 % at hdim 256.
  // FLASH_FWD_DEV_DIRECT_O=0 stages O in Q's buffer again.
#ifndef FLASH_FWD_DEV_DIRECT_O
#define FLASH_FWD_DEV_DIRECT_O 1
#endif
  static constexpr bool kDirectO = kPersistent_ && !kOwnO_ && bool(FLASH_FWD_DEV_DIRECT_O);
  // Q's buffer is released by the tile's last Q.K^T GEMM (not by its epilogue), and only by tiles
  // that loaded Q.
  static constexpr bool kEarlyQ = kSeparateO || kDirectO;
  // Own-O persistent kernels: the thread that issued a tile's O store waits for the store to have
  // read shared memory only when the next tile's O is about to be written there (one more
  // 128-thread barrier per tile), not right after issuing it, so the read overlaps the next
  // tile's GEMMs instead of holding the warpgroup at the next ping-pong barrier. Short tiles
  // (512-2k keys: one to sixteen key blocks) paid that wait often. Measured with the second Q
  // buffer above (alone: hdim 64 non-causal 512 / 1k 1.014 / 1.054, causal 0.960 / 1.004, both
  // about as much). FLASH_FWD_DEV_LAZY_STORE=0 turns it off.
#ifndef FLASH_FWD_DEV_LAZY_STORE
#define FLASH_FWD_DEV_LAZY_STORE 1
#endif
  static constexpr bool kLazyStore = kSeparateO && bool(FLASH_FWD_DEV_LAZY_STORE);
  static_assert(!kSeparateO || sizeof(Storage<true>) <= 227 * 1024,
                "own O buffer: this tile leaves no shared memory for it");
  using SharedStorage = Storage<kSeparateO>;
  // Q buffer `slot` (always 0 without kQ2) and its barriers.
  CUTLASS_DEVICE static Element* q_data(SharedStorage& smem, int slot) {
    if constexpr (kQ2) { return slot ? smem.o.q2.data() : smem.q.data(); } else { return smem.q.data(); }
  }
  CUTLASS_DEVICE static cutlass::arch::ClusterTransactionBarrier& q_full(SharedStorage& smem, int slot) {
    if constexpr (kQ2) { return slot ? smem.o.barrier_q2 : smem.barrier_q; } else { return smem.barrier_q; }
  }
  CUTLASS_DEVICE static cutlass::arch::ClusterBarrier& q_empty(SharedStorage& smem, int slot) {
    if constexpr (kQ2) { return slot ? smem.o.barrier_q2_empty : smem.barrier_q_empty; } else { return smem.barrier_q_empty; }
  }
  static constexpr int kSharedStorageSize = sizeof(SharedStorage);
  static_assert(kSharedStorageSize <= 227 * 1024, "tile does not fit in shared memory");
  // 228 KB per SM, 1 KB of it reserved per CTA.
  static constexpr int kCtasPerSm = kMaybeTwoCtas && kSharedStorageSize <= 113 * 1024 ? 2 : 1;

  // setmaxnreg budgets: the producer keeps the minimum, consumers share the rest of the CTA's
  // launch pool (launch_register_pool: 168 x 384 with two consumer warpgroups, 64K with three,
  // 32K with two CTAs per SM: 24 + 232 per thread of the two warpgroups).
  // A consumer's count must not be below what the kernel starts with (65536 / threads per SM,
  // 256 for one warpgroup alone), since setmaxnreg.inc may only raise it.
  static constexpr int kProducerRegs = kNumMmaWarpGroups == 3 ? 32 : 24;
  static constexpr int kConsumerRegs =
      kNumMmaWarpGroups == 3 ? 160 : (kNumMmaWarpGroups == 2 ? 240 : (kCtasPerSm == 2 ? 232 : 256));
  static_assert(kProducerRegs * 128 + kConsumerRegs * kNumMmaThreads <= launch_register_pool(kNumThreads, kCtasPerSm),
                "setmaxnreg.inc would wait forever for registers the CTA does not hold");
  static_assert(kConsumerRegs >= 64 * 1024 / (kNumThreads * kCtasPerSm),
                "consumers would start above their setmaxnreg count");

  struct Params {
    TmaQ tma_q;
    TmaKV tma_k;
    TmaKV tma_v;
    TmaO tma_o;
    ShapeQKV shape_q;
    ShapeQKV shape_k;
    float* lse;  // (batch, heads_q, seqlen_q)
    int seqlen_q;
    int seqlen_k;
    int heads_q;
    int q_heads_per_kv_head;
    int num_m_blocks;
    int batch;
    int diag_offset;   // local attention (kLocal): see FwdParams
    int window_left;
    int window_right;
    float softmax_scale;
    float softmax_scale_log2;
    int heads_per_group;  // persistent causal/local order: (batch x head)s walked together (tile_scheduler.h)
    int* tile_counter;    // kDynamic: zeroed before the launch
    typename Scheduler::Divisors divisors;
    [[no_unique_address]] std::conditional_t<kDirectO, DirectOArgs<Element>, NoDirectO> direct_o;
  };

  CUTLASS_DEVICE void operator()(Params const& params, char* smem_buf) const {
    SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_buf);
    int const warp_group_idx = cutlass::canonical_warp_group_idx();
    int const warp_idx_in_wg = cutlass::canonical_warp_idx_sync() % 4;
    bool const lane_predicate = cute::elect_one_sync();

    if (warp_group_idx == 0 && warp_idx_in_wg == 0 && lane_predicate) {
      cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_o.get_tma_descriptor());
      smem.barrier_q.init(/*arrive_count=*/1);
      smem.barrier_q_empty.init(/*arrive_count=*/kNumMmaWarpGroups);
      if constexpr (kQ2) {
        smem.o.barrier_q2.init(/*arrive_count=*/1);
        smem.o.barrier_q2_empty.init(/*arrive_count=*/kNumMmaWarpGroups);
      }
      if constexpr (kDynamic) {
        for (int slot = 0; slot < 2; ++slot) {
          smem.ring.full[slot].init(1);
          smem.ring.empty[slot].init(kNumMmaThreads);
        }
      }
    }
    typename Pipeline::Params pipeline_params;
    pipeline_params.transaction_bytes = kBytesKV;
    pipeline_params.role = warp_group_idx == 0 ? Pipeline::ThreadCategory::Producer
                                               : Pipeline::ThreadCategory::Consumer;
    pipeline_params.is_leader = threadIdx.x == 0;
    pipeline_params.num_consumers = kNumMmaThreads;
    Pipeline pipeline_k(smem.pipeline_k, pipeline_params, Shape<_1, _1, _1>{});
    Pipeline pipeline_v(smem.pipeline_v, pipeline_params, Shape<_1, _1, _1>{});
    __syncthreads();  // barriers initialised before anyone waits on them

    Scheduler const scheduler(params.num_m_blocks, params.heads_q, params.batch, params.heads_per_group);
    auto decoded = [&](auto const& tile) {
      if constexpr (std::is_same_v<std::decay_t<decltype(tile)>, FwdTile>) {
        return tile;
      } else {
        return scheduler.decode(tile, params.divisors);
      }
    };
    auto range_of = [&](FwdTile const& t) {
      return BlockRange<kBlockM, kBlockN, kLocal>(t.m_block, params.seqlen_q, params.seqlen_k, params.diag_offset,
                                                  params.window_left, params.window_right);
    };

    if (warp_group_idx == 0) {
      cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
      if (warp_idx_in_wg == 0 && lane_predicate) {
        PipelineState state_k = cutlass::make_producer_start_state<Pipeline>();
        PipelineState state_v = cutlass::make_producer_start_state<Pipeline>();
        // Which release of the Q buffer to wait for before loading Q (-1: none). Without
        // kEarlyQ every tile releases it (a tile with nothing to attend writes its zero O
        // there too); with it only tiles that loaded Q do, so Q loads and releases pair up.
        int q_loads = 0;
        auto produce = [&](auto const& tile, int iteration) {  // a tile id, or (kRingDecode) a decoded tile
          FwdTile const t = decoded(tile);
          auto const range = range_of(t);
          // kQ2: load k into slot k % 2 waits for that slot's release number k / 2 - 1.
          int const wait_phase = kQ2        ? (q_loads > 1 ? ((q_loads >> 1) - 1) & 1 : -1)
                                 : kEarlyQ ? (q_loads > 0 ? (q_loads - 1) & 1 : -1)
                                              : (iteration > 0 ? (iteration - 1) & 1 : -1);
          if (range.empty()) {  // nothing to load: consumers write zeros
            if (!kEarlyQ && wait_phase >= 0) { smem.barrier_q_empty.wait(wait_phase); }
            return;
          }
          load(params, smem, pipeline_k, pipeline_v, state_k, state_v, t, range, wait_phase, kQ2 ? q_loads & 1 : 0);
          ++q_loads;
        };
        if constexpr (kDynamic) {
          int tile = scheduler.first();
          for (int iteration = 0;; ++iteration) {
            int const slot = iteration & 1;
            smem.ring.empty[slot].wait(((iteration >> 1) & 1) ^ 1);  // the consumers read its last id
            bool const valid = scheduler.valid(tile);
            auto const item = [&] {
              if constexpr (kRingDecode) {
                return valid ? scheduler.decode(tile, params.divisors) : FwdTile{-1, 0, 0};
              } else {
                return tile;
              }
            }();
            smem.ring.ids[slot] = item;
            smem.ring.full[slot].arrive();
            if (!valid) { break; }
            int const next = atomicAdd(params.tile_counter, 1) + int(gridDim.x);  // in flight meanwhile
            produce(item, iteration);
            tile = next;
          }
        } else {
          int iteration = 0;
          for (int tile = scheduler.first(); scheduler.valid(tile); tile = scheduler.next(tile), ++iteration) {
            produce(tile, iteration);
          }
        }
      }
    } else {
      cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
      int const wg = warp_group_idx - 1;
      scheduler_init(wg);
      PipelineState state_k;
      PipelineState state_v;
      int q_phase = 0;
      auto consume_tile = [&](auto const& tile) {  // a tile id, or (kRingDecode) a decoded tile
        FwdTile const t = decoded(tile);
        consume(params, smem, pipeline_k, pipeline_v, state_k, state_v, q_phase, t, range_of(t),
                threadIdx.x - 128, wg);
      };
      if constexpr (kDynamic) {
        for (int iteration = 0;; ++iteration) {
          int const slot = iteration & 1;
          smem.ring.full[slot].wait((iteration >> 1) & 1);
          auto const item = smem.ring.ids[slot];
          smem.ring.empty[slot].arrive();
          bool valid;
          if constexpr (kRingDecode) { valid = item.m_block >= 0; } else { valid = scheduler.valid(item); }
          if (!valid) { break; }
          consume_tile(item);
        }
      } else {
        for (int tile = scheduler.first(); scheduler.valid(tile); tile = scheduler.next(tile)) { consume_tile(tile); }
      }
      if constexpr (kLazyStore) {  // shared memory stays valid until the last O store has read it
        if (warp_idx_in_wg == 0 && lane_predicate) { tma_store_wait<0>(); }
      }
    }
  }

  // Producer: K(n_max-1), then Q once (after the previous tile released the Q buffer: persistent
  // mode), then K(n-1) ahead of V(n), matching the consumers' order.
  CUTLASS_DEVICE void load(Params const& params, SharedStorage& smem, Pipeline& pipeline_k,
                           Pipeline& pipeline_v, PipelineState& state_k, PipelineState& state_v,
                           FwdTile const& t, BlockRange<kBlockM, kBlockN, kLocal> const& range,
                           int q_empty_phase, int q_slot) const {
    int const m_block = t.m_block, head = t.head, batch = t.batch;
    int const head_kv = head / params.q_heads_per_kv_head;
    Tensor mQ = params.tma_q.get_tma_tensor(params.shape_q)(_, _, head, batch);     // (seqlen_q, d)
    Tensor mK = params.tma_k.get_tma_tensor(params.shape_k)(_, _, head_kv, batch);  // (seqlen_k, d)
    Tensor mV = params.tma_v.get_tma_tensor(params.shape_k)(_, _, head_kv, batch);
    Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, _0{}));  // (M, D)
    Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));  // (N, D, n)
    Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));  // (N, D, n)
    Tensor sQ = make_tensor(make_smem_ptr(q_data(smem, q_slot)), SmemLayoutQ{});  // (M, D)
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutKV{});   // (N, D, stages)
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), SmemLayoutKV{});   // (N, D, stages)

    auto [tQgQ, tQsQ] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    auto [tKgK, tKsK] = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto [tVgV, tVsV] = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));


    auto load_k = [&](int n) {
      pipeline_k.producer_acquire(state_k);
      copy(params.tma_k.with(*pipeline_k.producer_get_barrier(state_k)), tKgK(_, n), tKsK(_, state_k.index()));
      ++state_k;
    };
    auto load_v = [&](int n) {
      pipeline_v.producer_acquire(state_v);
      copy(params.tma_v.with(*pipeline_v.producer_get_barrier(state_v)), tVgV(_, n), tVsV(_, state_v.index()));
      ++state_v;
    };
    int n = range.n_block_max - 1;
    load_k(n);  // may stream in while the previous tile still holds the Q buffer
    // The Q buffer is free once the previous tile that used it released it (its epilogue's O
    // store has read it, or with kEarlyQ its last Q.K^T GEMM is done; with kQ2 that tile is
    // the one before the previous).
    if (q_empty_phase >= 0) { q_empty(smem, q_slot).wait(q_empty_phase); }
    q_full(smem, q_slot).arrive_and_expect_tx(kBytesQ);
    copy(params.tma_q.with(reinterpret_cast<uint64_t&>(q_full(smem, q_slot))), tQgQ, tQsQ);
    for (; n > range.n_block_min; --n) {
      load_k(n - 1);
      load_v(n);
    }
    load_v(range.n_block_min);
  }

  // Inter-warpgroup ping-pong: the consumer warpgroups take turns issuing GEMMs, so one
  // warpgroup's softmax runs while the tensor cores serve another's GEMMs.
  static constexpr bool kPingPong = kNumMmaWarpGroups >= 2;
  static constexpr int kSchedulerThreads = 2 * 128;

  CUTLASS_DEVICE static void scheduler_sync(int wg) {
    if constexpr (kPingPong) {
      cutlass::arch::NamedBarrier::sync(kSchedulerThreads, static_cast<int>(FwdNamedBarrier::kSchedulerWG1) + wg);
    }
  }
  CUTLASS_DEVICE static void scheduler_arrive(int wg) {
    if constexpr (kPingPong) {
      int const next = wg + 1 == kNumMmaWarpGroups ? 0 : wg + 1;
      cutlass::arch::NamedBarrier::arrive(kSchedulerThreads, static_cast<int>(FwdNamedBarrier::kSchedulerWG1) + next);
    }
  }
  // The first warpgroup's first turn needs no predecessor: it arrives on its own barrier.
  CUTLASS_DEVICE static void scheduler_init(int wg) {
    if constexpr (kPingPong) {
      if (wg == 0) {
        cutlass::arch::NamedBarrier::arrive(kSchedulerThreads, static_cast<int>(FwdNamedBarrier::kSchedulerWG1));
      }
    }
  }

  // Consumer warpgroup `wg` (0-based) owns rows [64 wg, 64 wg + 64) of the tile.
  CUTLASS_DEVICE void consume(Params const& params, SharedStorage& smem, Pipeline& pipeline_k,
                              Pipeline& pipeline_v, PipelineState& state_k, PipelineState& state_v,
                              int& q_phase, FwdTile const& t, BlockRange<kBlockM, kBlockN, kLocal> const& range,
                              int mma_tidx, int wg) const {
    int const m_block = t.m_block, head = t.head, batch = t.batch;
    TiledMmaQK tiled_mma_qk;
    TiledMmaPV tiled_mma_pv;
    auto thr_mma_qk = tiled_mma_qk.get_thread_slice(mma_tidx);
    // Operands through the warpgroup's first thread: Q's descriptors, which depend on the
    // warpgroup's rows, are then built in uniform registers (warpgroup_first_thread, utils.h).
    int const wg_thread = warpgroup_first_thread(mma_tidx);
    auto wg_mma_qk = tiled_mma_qk.get_thread_slice(wg_thread);
    auto wg_mma_pv = tiled_mma_pv.get_thread_slice(wg_thread);

    // kQ2: q_phase counts the tiles that loaded Q (slot = its low bit, phase = the next bit).
    int const q_slot = kQ2 ? q_phase & 1 : 0;
    Tensor sQ = make_tensor(make_smem_ptr(q_data(smem, q_slot)), SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutKV{});
    Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), SmemLayoutVt{});
    Tensor tSrQ = wg_mma_qk.partition_fragment_A(sQ);   // (MMA, MMA_M, MMA_K) descriptors
    Tensor tSrK = wg_mma_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stages)
    Tensor tOrV = wg_mma_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stages)

    Tensor tSrS = partition_fragment_C(tiled_mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});  // fp32
    Tensor tOrO = partition_fragment_C(tiled_mma_pv, Shape<Int<kBlockM>, Int<kHeadDim>>{});  // fp32
    Tensor tOrP = make_tensor<Element>(acc_layout_as_a_operand(tSrS.layout()));
    Tensor tSrS_rc = make_tensor(tSrS.data(), acc_layout_rowcol(tSrS.layout()));  // (rows, cols)
    Tensor tOrO_rc = make_tensor(tOrO.data(), acc_layout_rowcol(tOrO.layout()));
    Tensor tScS = thr_mma_qk.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
    Tensor tScS_rc = make_tensor(tScS.data(), acc_layout_rowcol(tScS.layout()));
    constexpr int kRows = decltype(size<0>(tSrS_rc))::value;

    OnlineSoftmax<kRows> softmax(params.softmax_scale_log2);
    Tensor lse = make_tensor<float>(Shape<Int<kRows>>{});
    int const row0 = m_block * kBlockM;
    auto mask = [&](int n) {
      if (range.needs_mask(n)) {
        apply_mask<kLocal>(tSrS_rc, tScS_rc, row0, n * kBlockN, params.seqlen_k, params.diag_offset,
                           params.window_left, params.window_right, n < range.n_unmasked_lo);
      }
    };

    // S(n) is final: K's stage is free, and after the tile's last block (n_block_min) Q's buffer.
    auto release_k = [&](int n) CUTLASS_LAMBDA_FUNC_INLINE {
      if (n == range.n_block_min) { release_q(smem, mma_tidx, q_slot); }
      pipeline_k.consumer_release(state_k);
      ++state_k;
    };

    if (!range.empty()) {
      if constexpr (kQ2) {
        q_full(smem, q_slot).wait((q_phase >> 1) & 1);
        ++q_phase;
      } else {
        smem.barrier_q.wait(q_phase);
        q_phase ^= 1;
      }

      int n = range.n_block_max - 1;
      scheduler_sync(wg);
      pipeline_k.consumer_wait(state_k);
      wgmma_async</*kZeroInit=*/true>(tiled_mma_qk, tSrQ, tSrK(_, _, _, state_k.index()), tSrS);
      scheduler_arrive(wg);
      warpgroup_wait<0>();
      release_k(n);
      if constexpr (kHalfSoftmax) {
        // This warpgroup's last row sees no key past the first half of block n (BlockRange's
        // bound, for this warpgroup's rows).
        int const wg_last_row = min(row0 + 64 * wg + 63, params.seqlen_q - 1);
        int const hi = min(params.seqlen_k, wg_last_row + params.diag_offset + params.window_right + 1);
        // Views of one half of S: the first kBlockN / 2 columns are the first half of the
        // accumulator's registers (column groups of 8 are the fragment's outermost value mode).
        TiledMmaQKHalf mma_half;
        auto const half_layout = partition_fragment_C(mma_half, Shape<Int<kBlockM>, Int<kBlockN / 2>>{}).layout();
        static_assert(decltype(size(half_layout))::value * 2 == decltype(size(tSrS))::value);
        Tensor c_half = mma_half.get_thread_slice(mma_tidx).partition_C(
            make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN / 2>>{}));
        Tensor c_half_rc = make_tensor(c_half.data(), acc_layout_rowcol(c_half.layout()));
        if (hi - n * kBlockN <= kBlockN / 2) {
          Tensor s_half_rc = make_tensor(tSrS.data(), acc_layout_rowcol(half_layout));
          if (range.needs_mask(n)) {
            apply_mask<kLocal>(s_half_rc, c_half_rc, row0, n * kBlockN, params.seqlen_k, params.diag_offset,
                               params.window_left, params.window_right, n < range.n_unmasked_lo);
          }
          softmax.first_block(s_half_rc);
          CUTLASS_PRAGMA_UNROLL
          for (int i = size(tSrS) / 2; i < size(tSrS); ++i) { tSrS(i) = 0.f; }
        } else {
          // A warpgroup whose rows all see the first half of block n whole masks only the second
          // half (the first half's coordinates, 64 columns on).
          int const wg_first_row = row0 + 64 * wg;
          bool const first_half_whole =
              min(params.seqlen_k, wg_first_row + params.diag_offset + params.window_right + 1) >=
                  n * kBlockN + kBlockN / 2 &&
              wg_last_row + params.diag_offset - params.window_left <= n * kBlockN;
          if (first_half_whole) {
            Tensor s_upper_rc = make_tensor(tSrS.data() + size(half_layout), acc_layout_rowcol(half_layout));
            if (range.needs_mask(n)) {
              apply_mask<kLocal>(s_upper_rc, c_half_rc, row0, n * kBlockN + kBlockN / 2, params.seqlen_k,
                                 params.diag_offset, params.window_left, params.window_right,
                                 n < range.n_unmasked_lo);
            }
          } else {
            mask(n);
          }
          softmax.first_block(tSrS_rc);
        }
      } else {
        mask(n);
        softmax.first_block(tSrS_rc);
      }
      convert_into(tSrS, tOrP);
      clear(tOrO);
      // Factor for O before P(n+1).V(n+1) is added; applied while S(n) runs on the tensor cores.
      Tensor rescale = make_tensor<float>(Shape<Int<kRows>>{});
      fill(rescale, 1.f);
      bool moved = false;  // some factor of `rescale` differs from 1

      // The first key block that every row of the tile sees whole (no mask); the blocks below
      // it may skip the max search (kMaxFree).
      int const n_free_from = min(range.n_block_max, range.n_unmasked_hi) - 1;
      // One K/V block after the first. masked: std::true_type (it crosses the sequence end or a
      // window edge), std::false_type (it does not), MaskIfNeeded (the range decides at run time).
      auto block = [&](int n, auto masked) CUTLASS_LAMBDA_FUNC_INLINE {  // inlined: its tensors stay in registers
        scheduler_sync(wg);
        pipeline_k.consumer_wait(state_k);
        wgmma_async</*kZeroInit=*/true>(tiled_mma_qk, tSrQ, tSrK(_, _, _, state_k.index()), tSrS);
        if (softmax.warp_needs_rescale(moved)) { softmax.rescale_o(tOrO_rc, rescale); }
        pipeline_v.consumer_wait(state_v);
        wgmma_async</*kZeroInit=*/false>(tiled_mma_pv, tOrP, tOrV(_, _, _, state_v.index()), tOrO);
        scheduler_arrive(wg);  // the next warpgroup's GEMMs queue behind ours while we do softmax
        warpgroup_wait<1>();   // S(n) is ready; P.V of the previous block still runs
        auto mask_block = [&]() CUTLASS_LAMBDA_FUNC_INLINE {
          if constexpr (std::is_same_v<decltype(masked), MaskIfNeeded>) {
            mask(n);
          } else if constexpr (decltype(masked)::value) {
            apply_mask<kLocal>(tSrS_rc, tScS_rc, row0, n * kBlockN, params.seqlen_k, params.diag_offset,
                               params.window_left, params.window_right, n < range.n_unmasked_lo);
          }
        };
        if constexpr (kMaxFree) {
          // Only blocks after a full unmasked one (n < n_free_from) go without the max search:
          // before that some row's max may stand on a few keys. Q and this K stage stay held
          // until the softmax knows it needs no second S(n).
          mask_block();
          bool done = false;
          if (n < n_free_from) {  // uniform over the warpgroup
            Tensor sums = make_tensor<float>(Shape<Int<kRows>>{});
            bool const fits = softmax.block_without_max(tSrS_rc, sums);
            if (named_barrier_all(fits, kFwdVoteHwBarrier + wg, 128)) {
              softmax.add_sums(sums);
              moved = false;
              done = true;
            } else {  // some p would exceed the slack (or a row has no max yet): S(n) again
              wgmma_async</*kZeroInit=*/true>(tiled_mma_qk, tSrQ, tSrK(_, _, _, state_k.index()), tSrS);
              warpgroup_wait<0>();
              mask_block();
            }
          }
          if (!done) { moved = softmax.next_block</*kExact=*/true>(tSrS_rc, rescale); }
          release_k(n);
        } else {
          release_k(n);
          mask_block();
          moved = softmax.next_block(tSrS_rc, rescale);
        }
        warpgroup_wait<0>();   // P.V done: V's stage and the P registers are free
        pipeline_v.consumer_release(state_v);
        ++state_v;
        convert_into(tSrS, tOrP);
      };
      // kSplitMask: three loops, as FA3, so that the long middle one carries no mask code or
      // registers: the blocks at the sequence end / right window edge (masked), the inner blocks,
      // the blocks past the left window edge (masked). Otherwise one loop masks where needed.
      if constexpr (kSplitMask) {
        for (--n; n >= range.n_block_min && n >= range.n_unmasked_hi; --n) { block(n, std::true_type{}); }
        for (; n >= range.n_block_min && n >= range.n_unmasked_lo; --n) { block(n, std::false_type{}); }
        if constexpr (kLocal) {
          for (; n >= range.n_block_min; --n) { block(n, std::true_type{}); }
        }
      } else {
        for (--n; n >= range.n_block_min; --n) { block(n, MaskIfNeeded{}); }
      }
      scheduler_sync(wg);
      if (softmax.warp_needs_rescale(moved)) { softmax.rescale_o(tOrO_rc, rescale); }
      pipeline_v.consumer_wait(state_v);
      wgmma_async</*kZeroInit=*/false>(tiled_mma_pv, tOrP, tOrV(_, _, _, state_v.index()), tOrO);
      scheduler_arrive(wg);
      warpgroup_wait<0>();
      pipeline_v.consumer_release(state_v);
      ++state_v;  // persistent mode: the next tile's first V is the next stage
      softmax.finalize(tOrO_rc, params.softmax_scale, lse);
    } else {
      clear(tOrO);
      fill(lse, -INFINITY);
    }
    epilogue(params, smem, tiled_mma_pv, tOrO, lse, m_block, head, batch, mma_tidx, wg, range.empty());
  }

  // kEarlyQ (own O buffer, or O stored from registers): this warpgroup's last Q.K^T GEMM of the
  // tile has completed, so the producer may load the next tile's Q; one arrival per warpgroup and
  // tile that loaded Q. Otherwise Q is released by the epilogue, after O's TMA store has read it.
  CUTLASS_DEVICE static void release_q(SharedStorage& smem, int mma_tidx, int q_slot) {
    if constexpr (kEarlyQ) {
      if (mma_tidx % 128 == 0) { q_empty(smem, q_slot).arrive(); }
    }
  }

  // kDirectO: O straight to global memory in 16-byte stores. A quad of lanes holds a row's 8-column
  // chunks in pairs (lane q: columns 2q, 2q + 1 of every chunk); a 4 x 4 transpose across the quad
  // (utils.h quad_transpose, two butterfly steps) leaves lane q the whole chunk 4g + q of each group of four
  // chunks. Rows past seqlen_q and chunks past the real head dim (a multiple of 8) are left out.
  template <typename TensorO>
  CUTLASS_DEVICE void store_o_direct(Params const& params, TiledMmaPV const& tiled_mma_pv, TensorO const& tOrO_out,
                                     int m_block, int head, int batch, int mma_tidx) const {
    static_assert(kHeadDim % 32 == 0, "groups of four 8-column chunks");
    auto thr_mma_pv = tiled_mma_pv.get_thread_slice(mma_tidx);
    Tensor tOcO = thr_mma_pv.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    Tensor tOcO_rc = make_tensor(tOcO.data(), acc_layout_rowcol(tOcO.layout()));
    Tensor tOrO_rc = make_tensor(tOrO_out.data(), acc_layout_rowcol(tOrO_out.layout()));
    constexpr int kCols = decltype(size<1>(tOrO_rc))::value;  // pairs of 2: kCols / 2 chunks
    static_assert(kCols % 8 == 0);
    int const head_dim = get<1>(params.shape_q);
    int const quad_lane = threadIdx.x % 4;
    Element* const o_head = params.direct_o.ptr + int64_t(batch) * params.direct_o.batch_stride +
                            int64_t(head) * params.direct_o.head_stride;
    auto pack = [&](int r, int c) {
      cutlass::Array<Element, 2> pair;
      pair[0] = tOrO_rc(r, c);
      pair[1] = tOrO_rc(r, c + 1);
      return reinterpret_cast<uint32_t const&>(pair);
    };
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < size<0>(tOrO_rc); ++r) {
      int const row = m_block * kBlockM + get<0>(tOcO_rc(r, 0));
      Element* const o_row = o_head + int64_t(row) * params.direct_o.row_stride;
      CUTLASS_PRAGMA_UNROLL
      for (int g = 0; g < kCols / 8; ++g) {
        uint32_t a[4];
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < 4; ++i) { a[i] = pack(r, 8 * g + 2 * i); }
        uint4 const chunk = quad_transpose(a, quad_lane);  // utils.h
        // Chunk 4g + q starts 8 q columns after chunk 4g, whose first column lane 0 holds.
        int const col = get<1>(tOcO_rc(r, 8 * g)) - 2 * quad_lane + 8 * quad_lane;
        if (row < params.seqlen_q && col < head_dim) { *reinterpret_cast<uint4*>(o_row + col) = chunk; }
      }
    }
  }

  // O goes registers -> shared memory (this warpgroup's own Q rows, no longer read) -> TMA store,
  // which clips rows past seqlen_q and columns past the real head dim. LSE goes straight out.
  template <typename TensorO, typename TensorL>
  CUTLASS_DEVICE void epilogue(Params const& params, SharedStorage& smem, TiledMmaPV const& tiled_mma_pv,
                               TensorO const& tOrO, TensorL const& lse, int m_block, int head,
                               int batch, int mma_tidx, int wg, bool tile_empty) const {
    Tensor tOrO_out = make_tensor<Element>(tOrO.layout());
    convert_into(tOrO, tOrO_out);
    int const warp_idx_in_wg = (threadIdx.x / 32) % 4;
    if constexpr (kDirectO) {
      store_o_direct(params, tiled_mma_pv, tOrO_out, m_block, head, batch, mma_tidx);
    } else {
      if constexpr (kLazyStore) {
        // The previous O store of this warpgroup has read the buffer before anyone writes it.
        if (warp_idx_in_wg == 0 && cute::elect_one_sync()) { tma_store_wait<0>(); }
        cutlass::arch::NamedBarrier::sync(128, static_cast<int>(FwdNamedBarrier::kEpilogueWG1) + wg);
      } else if constexpr (kPersistent_) {
        // O's buffer must have been read by this warpgroup's previous O store: its storing thread
        // waited for that before its next barrier. A tile with something to attend passed the
        // ping-pong barriers since (all 128 threads of the warpgroup take part); a tile with
        // nothing to attend, or a lone warpgroup, did not, so the warpgroup meets here first.
        if (tile_empty || !kPingPong) {
          cutlass::arch::NamedBarrier::sync(128, static_cast<int>(FwdNamedBarrier::kEpilogueWG1) + wg);
        }
      }
      auto smem_tiled_copy_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, tiled_mma_pv);
      auto smem_thr_copy_o = smem_tiled_copy_o.get_thread_slice(mma_tidx);
      Element* const o_buffer = [&] {
        if constexpr (kSeparateO) {
          return smem.o.o.data();
        } else {
          return smem.q.data();
        }
      }();
      Tensor sO = make_tensor(make_smem_ptr(o_buffer), SmemLayoutQ{});
      Tensor taccOrO = smem_thr_copy_o.retile_S(tOrO_out);
      Tensor taccOsO = smem_thr_copy_o.partition_D(sO);
      copy(smem_tiled_copy_o, taccOrO, taccOsO);
      cutlass::arch::fence_view_async_shared();  // generic-proxy writes, seen by the TMA engine
      cutlass::arch::NamedBarrier::sync(128, static_cast<int>(FwdNamedBarrier::kEpilogueWG1) + wg);

      if (warp_idx_in_wg == 0 && cute::elect_one_sync()) {
        Tensor mO = params.tma_o.get_tma_tensor(params.shape_q)(_, _, head, batch);
        Tensor gO = local_tile(mO, Shape<_64, Int<kHeadDim>>{}, make_coord(m_block * kNumMmaWarpGroups + wg, _0{}));
        Tensor sOwg = make_tensor(make_smem_ptr(o_buffer + wg * 64 * kHeadDim), SmemLayoutO64{});
        auto [tOgO, tOsO] = tma_partition(params.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sOwg), group_modes<0, 2>(gO));
        copy(params.tma_o, tOsO, tOgO);
        tma_store_arrive();
        if constexpr (!kLazyStore) { tma_store_wait<0>(); }  // the store has read shared memory (Q's, or the O buffer)
        if constexpr (!kSeparateO) { smem.barrier_q_empty.arrive(); }  // the producer may refill Q
      }
    }

    // One lane of each quad holds a row's LSE.
    auto thr_mma_pv = tiled_mma_pv.get_thread_slice(mma_tidx);
    Tensor tOcO = thr_mma_pv.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
    Tensor tOcO_rc = make_tensor(tOcO.data(), acc_layout_rowcol(tOcO.layout()));
    if (get<1>(tOcO_rc(0, 0)) == 0) {
      float* lse_row = params.lse + (int64_t(batch) * params.heads_q + head) * params.seqlen_q;
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < size(lse); ++r) {
        int const row = m_block * kBlockM + get<0>(tOcO_rc(r, 0));
        if (row < params.seqlen_q) { lse_row[row] = lse(r); }
      }
    }
  }
};

// The kernel of (head dim, dtype, mask, key-length class): the tile of tile_size.h's table.
template <int kHeadDim, typename Element, bool kLocal, FwdKeys kKeys>
using FwdKernelFor = FwdKernel<kHeadDim, fwd_tile<kHeadDim, kLocal, kKeys>().block_m,
                               fwd_tile<kHeadDim, kLocal, kKeys>().block_n, fwd_tile<kHeadDim, kLocal, kKeys>().stages,
                               Element, kLocal, fwd_tile<kHeadDim, kLocal, kKeys>().persistent,
                               fwd_tile<kHeadDim, kLocal, kKeys>().own_o>;

template <typename Kernel>
__global__ void __launch_bounds__(Kernel::kNumThreads, Kernel::kCtasPerSm)
    flash_fwd_kernel(CUTE_GRID_CONSTANT typename Kernel::Params const params) {
  extern __shared__ __align__(1024) char smem_buf[];
  Kernel{}(params, smem_buf);
}

}  // namespace flash
