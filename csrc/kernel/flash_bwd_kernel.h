// The SM90 backward kernel: one CTA owns kBlockN keys of one KV head and loops over every
// (query head of its group, query block) that sees them, accumulating dK and dV in registers
// and adding each query block's dQ contribution into a float32 buffer.
//
// With S = Q.K^T (unscaled), P = exp2(S * scale * log2e - LSE2), D = rowsum(dO * O):
//   S^T  = K  . Q^T     dP^T = V . dO^T        (WGMMA, all operands in shared memory)
//   dS^T = P^T * (dP^T - D)                     (registers)
//   dV  += P^T  . dO    dK  += dS^T . Q         (A = P^T, dS^T written to shared memory)
//   dQ   = dS   . K     (added into a float32 buffer; scaled by softmax_scale afterwards, as is dK)
// Computing the transposes keeps the keys on the MMA's M side, so dK and dV accumulate in the
// same threads for the whole loop. Warpgroup 0 is the producer (TMA: K and V once; Q, dO, LSE2
// and D per query block through a kStages pipeline); two consumer warpgroups do the maths.
//
// Two variants, chosen by the tile:
// - kBlockN == 128 (head dims <= 128, "RS"): each consumer warpgroup owns 64 keys for every
//   GEMM but dQ, so P^T and dS^T go from the S^T/dP^T accumulators straight into the A operand of
//   the dV/dK WGMMAs (registers); only dS goes to shared memory, for dQ. The dV GEMM runs while
//   dS is computed, the dK GEMM while dQ is staged.
// - kBlockN == 64 (head dims 192, 256, "SS"): the warpgroups split the queries for S^T/dP^T and
//   the head dim for dK/dV, so P^T and dS^T go through shared memory.
// dQ: each step's dQ block goes to shared memory in the accumulator's register order (kDqStages
// buffers; with kDqPerWG one buffer, each warpgroup staging its half under its own barriers), and
// warp 1 of the producer warpgroup adds it to the float32 accumulator with bulk reduce-adds
// (cp.reduce.async.bulk; one per block, or per half); the accumulator therefore holds each block
// in that order (dq_staged_offset), which the dQ postprocess kernel (flash_bwd_prepost.h) undoes.
#pragma once

#include "kernel/config.h"

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "kernel/mask.h"  // floor_div
#include "kernel/named_barriers.h"
#include "kernel/utils.h"

namespace flash {

using namespace cute;

// Query blocks that see key block n_block, and whether a block needs the causal/window mask.
template <int kBlockM, int kBlockN, bool kLocal>
struct BwdBlockRange {
  int m_block_min;
  int m_block_max;  // exclusive

  CUTLASS_HOST_DEVICE BwdBlockRange(int n_block, int seqlen_q, int diag, int left, int right) {
    m_block_min = 0;
    m_block_max = (seqlen_q + kBlockM - 1) / kBlockM;
    if constexpr (kLocal) {
      int const first_key = n_block * kBlockN;
      int const last_key = first_key + kBlockN - 1;
      // Query i sees key j iff i + diag - left <= j <= i + diag + right.
      m_block_min = max(m_block_min, floor_div(first_key - diag - right, kBlockM));
      m_block_max = min(m_block_max, floor_div(last_key - diag + left, kBlockM) + 1);
    }
  }
  CUTLASS_HOST_DEVICE int count() const { return max(0, m_block_max - m_block_min); }
};

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_, typename Element_, bool kLocal_,
          bool kDvAfterDs_ = false, bool kPersistent_ = false>
struct BwdKernel {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // queries per step
  static constexpr int kBlockN = kBlockN_;  // keys per CTA
  static constexpr int kStages = kStages_;
  static constexpr bool kLocal = kLocal_;

  static constexpr int kNumMmaWarpGroups = 2;
  static constexpr int kNumMmaThreads = 128 * kNumMmaWarpGroups;
  static constexpr int kNumThreads = kNumMmaThreads + 128;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static_assert(kProducerRegs * 128 + kConsumerRegs * kNumMmaThreads <= launch_register_pool(kNumThreads, 1),
                "setmaxnreg.inc would wait forever for registers the CTA does not hold");
  // 128 query rows per step (tile_size.h, bwd_tile): RS head dims <= 64 only, where S^T and dP^T
  // of 64 keys x 128 queries still leave registers for dK and dV.
  static_assert(kBlockM == 64 || (kBlockM == 128 && kBlockN_ == 128 && kHeadDim_ <= 64),
                "64 query rows per step (128 only for head dims <= 64)");
  static_assert(kBlockN == 64 || kBlockN == 128);
  static constexpr bool kRS = kBlockN == 128;
  // Persistent (tile_size.h, bwd_persistent, says where), non-causal: one CTA per SM
  // striding over the (key block, KV head, batch) tiles, key blocks fastest, so that the next
  // tile's K, V and first Q/dO blocks load while this tile's dK/dV epilogue runs (every tile of a
  // non-causal problem has the same work, so a static stride balances). Deterministic mode would
  // stay correct: a CTA's tiles come in increasing index order and each waits only on lower key
  // blocks, i.e. lower indices.
  static constexpr bool kPersistent = kPersistent_;
  // Persistent causal/local kernels (default mode only) take their tiles from an atomic counter
  // (BwdParams::tile_counter, zeroed by the preprocess kernel), longest first in L2-sized sections of (KV head, batch) pairs (tile_coords), so that a CTA that drew short
  // tiles takes more of them. The producer thread draws the ids and hands them to the consumers
  // and the dQ reducer warp through a two-slot ring in shared memory.
  static constexpr bool kDynamic = kPersistent_ && kLocal_;
  // SS path with one Q/dO stage (head dims > 192): Q (+ LSE) and dO (+ D) in two pipelines, and
  // the step's GEMMs ordered dK, dV, dQ, so that Q's stage is released once dK has read it and
  // dO's once dV has: the next step's Q loads under dV and dQ, its dO under dQ and the next S^T
  // (one pipeline made every load wait for the whole step). Measured at hdim 256, x cuDNN at
  // 512 / 2k / 8k, default mode: non-causal 0.97 / 0.92 / 0.96 -> 1.14 / 1.09 / 1.15, causal
  // 0.96 / 0.94 / 0.91 -> 1.04 / 1.04 / 1.02; deterministic mode unchanged (within 1.5 %).
  static constexpr bool kSplitQdO = !kRS && kStages_ == 1;
  // RS path, causal/local: the steps in alternating masked / unmasked loops (consume_rs).
  // Measured x cuDNN, causal, at 1k / 8k: hdim 64 0.905 / 0.901 -> 0.935 / 0.952, hdim 128
  // 0.961 / 1.018 -> 0.962 / 1.026. Not in the persistent causal kernel at hdim 128: there the
  // two loops spill (~50 spill instructions in each step loop, none with one loop).
  // FLASH_BWD_DEV_SPLIT_STEPS=0/1 forces it.
#ifdef FLASH_BWD_DEV_SPLIT_STEPS
  static constexpr bool kSplitSteps = FLASH_BWD_DEV_SPLIT_STEPS;
#else
  static constexpr bool kSplitSteps = kHeadDim_ <= 64 || !kDynamic;
#endif
  // RS path: the dV GEMM issued after dS^T is in shared memory (FA3's order) instead of while dS^T
  // is computed (tile_size.h, bwd_dv_after_ds, says where).
  static constexpr bool kDvAfterDs = kDvAfterDs_;
  static_assert(kRS || !kDvAfterDs);
  // RS path: each consumer warpgroup stages its own half of the dQ block (FA3's scheme), with a
  // full / empty barrier pair of its own shared with the reducer warp (160 threads, one buffer),
  // and the reducer adds each half as soon as it is there: the warpgroups no longer meet at the
  // staging buffer (one 288-thread barrier pair and two buffers before). Measured (nineteenth
  // session, 3 rounds, x cuDNN; non-causal, then causal): hdim 64, 1k / 8k: 1.049 / 1.061, 1.070
  // / 1.136 -> 1.065 / 1.072, 1.084 / 1.139 (without kDvSplit); hdim 128: see kDvSplit (alone,
  // -6 to +4 %); hdim 96 (with kDvSplit) within 1 % either way, not taken.
  // FLASH_BWD_DEV_DQ_PER_WG=0 / 1 forces it (2: on the SS path too, an experiment).
#ifdef FLASH_BWD_DEV_DQ_PER_WG
  static constexpr bool kDqPerWG = (kRS || FLASH_BWD_DEV_DQ_PER_WG == 2) && bool(FLASH_BWD_DEV_DQ_PER_WG);
#else
  static constexpr bool kDqPerWG = kRS && kHeadDim != 96;
#endif
  // With kDvAfterDs, the dV GEMM's first kDvFirstKBlocks K blocks (16 queries each) are issued
  // before the dP^T wait and the rest after dS^T, so that their exps precede that wait. In one
  // piece, ptxas hoisted the wait above all but 1 of the 32 MUFUs (hdim 128; 8 of 64 at hdim 64),
  // so the exps did not overlap the dP^T GEMM (FA3's loop has ~15 of 32 before it). Measured with
  // kDqPerWG (nineteenth session, 3 rounds, x cuDNN; non-causal 1k / 8k, then causal 1k / 8k):
  // - hdim 128, half the K blocks first (22 MUFUs before the wait): 1.058 / 1.038, 1.069 / 1.069
  //   -> 1.074 / 1.051, 1.096 / 1.094 (2k / 16k in another run: 1.064 / 1.013, 1.072 / 1.046 ->
  //   1.076 / 1.055, 1.093 / 1.083); without kDqPerWG it lost 1-2 %.
  // - hdim 128, 1 / 2 / 3 K blocks first: 1.067 / 1.063, 1.076 / 1.106; 1.066 / 1.048, 1.081 /
  //   1.093; 1.054 / 1.040, 1.061 / 1.090.
  // - hdim 64, 0 / 1 / 2 of 8 K blocks first: 1.075 / 1.047, 1.105 / 1.108; 1.081 / 1.060, 1.119
  //   / 1.141; 1.080 / 1.068, 1.112 / 1.122 (deterministic 0.879 / 1.015, 1.042 / 1.084; 0.887 /
  //   1.017, 1.049 / 1.114; 0.895 / 1.027, 1.063 / 1.130). Half (61 MUFUs before the wait) lost
  //   2-8 % without kDqPerWG and was even with it.
  // So one K block at head dims 64 and 128; hdim 96 (with kDqPerWG, half): within 1 %, not taken.
  // FLASH_BWD_DEV_DV_SPLIT=0 / 1 forces it, FLASH_BWD_DEV_DV_SPLIT_BLOCKS=k the K blocks first.
#ifdef FLASH_BWD_DEV_DV_SPLIT
  static constexpr bool kDvSplit = kDvAfterDs && bool(FLASH_BWD_DEV_DV_SPLIT);
#else
  static constexpr bool kDvSplit = kDvAfterDs && kHeadDim != 96;
#endif
  // Causal / local kernels at hdim 64 issue two K blocks first: with kLateP16 their step loops
  // then do not spill (see kLateP16).
#ifdef FLASH_BWD_DEV_DV_SPLIT_BLOCKS
  static constexpr int kDvFirstKBlocks = FLASH_BWD_DEV_DV_SPLIT_BLOCKS;
#else
  static constexpr int kDvFirstKBlocks = (kHeadDim == 64 && kLocal_) ? 2 : 1;
#endif
  static_assert(!kDvSplit || (kDvFirstKBlocks > 0 && kDvFirstKBlocks < kBlockM / 16));
  // kDvSplit: where the rest of the dV GEMM is issued. 0: before the warpgroups meet for dQ; 1:
  // after the meeting, behind dQ and dK; 2: between them. Moving it behind dQ lets dQ, whose
  // staging the next step's S^T waits for, run first. (The dK GEMM moved the other way, before the
  // meeting, lost 2.5-3.6 % at hdim 128 and 1-2 % at hdim 64: twenty-first session.) Measured
  // (twenty-first session, 3 rounds, x cuDNN; non-causal 1k / 8k, then causal 1k / 8k):
  // - hdim 128 (default mode; the deterministic kernel has no split): 0: 1.075 / 1.085, 1.083 /
  //   1.134; 1: 1.036 / 1.086, 0.990 / 1.114; 2: 1.083 / 1.096, 1.072 / 1.154. 2 taken.
  // - hdim 64: 0: 1.129 / 1.166, 1.101 / 1.165 (deterministic 0.930 / 1.052, 1.091 / 1.130); 1:
  //   1.107 / 1.144, 1.189 / 1.189 (0.909 / 1.020, 1.095 / 1.164). 1 taken in causal / local
  //   kernels only.
  // FLASH_BWD_DEV_DV_LATE=0 / 1 / 2 forces it.
#ifdef FLASH_BWD_DEV_DV_LATE
  static constexpr int kDvLate = kDvSplit ? FLASH_BWD_DEV_DV_LATE : 0;
#else
  static constexpr int kDvLate = !kDvSplit ? 0 : kHeadDim == 128 ? 2 : (kHeadDim == 64 && kLocal_) ? 1 : 0;
#endif
  // Steps of 128 queries compute dS^T from the 16-bit P^T made for the dV GEMM, so that the
  // float32 P^T's registers are free by then (with it in float32 the step loops spilled 116-232
  // B); FLASH_BWD_DEV_DS_FROM_16BIT_P=0 / 1 forces it.
  // kLateP16 (hdim 64): the 16-bit P^T for the dV GEMM is made after dS^T (FA3's order; only
  // the split's first K blocks before the dP^T wait), so that dS^T uses the float32 P^T (one
  // rounding less) without both copies held at once; it turns kDsFrom16BitP off. Local SASS
  // (nineteenth session): non-causal step loop 759 -> 609 instructions (the widening of the
  // 16-bit P^T was ~150 of them; FA3's loop 709), no spills; the causal loops spilled 6-15 LDL
  // per step with one K block of the dV GEMM first and none with two (1041 / 629 instructions
  // per masked / unmasked step, against 1208 / 774). Measured (twentieth session, 3 rounds, x
  // cuDNN; non-causal 1k / 8k, then causal 1k / 8k): 1.076 / 1.054, 1.119 / 1.126 -> 1.131 /
  // 1.141 (non-causal, one K block first), 1.133 / 1.143 (causal, two); with one K block first
  // the causal kernels read 1.049 / 1.103. Deterministic: 0.910 / 0.999, 1.049 / 1.058 -> 0.936
  // / 1.050, 1.086 / 1.136 (two K blocks first everywhere). hdim 128's SASS is unchanged by it
  // (ptxas already orders it so). FLASH_BWD_DEV_LATE_P16=0 / 1 (non-causal kernels) / 2 (every
  // kernel) forces it.
#ifdef FLASH_BWD_DEV_LATE_P16
  static constexpr bool kLateP16 = kDvAfterDs && FLASH_BWD_DEV_LATE_P16 && (FLASH_BWD_DEV_LATE_P16 == 2 || !kLocal_);
#else
  static constexpr bool kLateP16 = kDvAfterDs && kHeadDim == 64;
#endif
#ifdef FLASH_BWD_DEV_DS_FROM_16BIT_P
  static constexpr bool kDsFrom16BitP = bool(FLASH_BWD_DEV_DS_FROM_16BIT_P);
#else
  static constexpr bool kDsFrom16BitP = kBlockM_ > 64 && !kLateP16;
#endif
  static_assert(!(kLateP16 && kDsFrom16BitP), "a late 16-bit P^T does not exist when dS^T is computed");

  // The two consumer warpgroups split the keys when there are 128 of them, else the other
  // dimension (queries for S^T/dP^T, head dim for dK/dV).
  static constexpr int kKeyWGs = kBlockN / 64;
  static constexpr int kOtherWGs = kNumMmaWarpGroups / kKeyWGs;
  using AtomLayoutKeys = Layout<Shape<Int<kKeyWGs>, Int<kOtherWGs>, _1>>;

  // S^T, dP^T: (keys, queries), K = head dim; A = K or V, B = Q or dO, both K-major.
  // Experiment (not yet measured): FLASH_BWD_DEV_KV_REGS=1 keeps this warpgroup's K and V rows in
  // registers for the whole loop (RS, head dims <= 64 only: 32 more registers), halving the
  // shared-memory reads of the S^T and dP^T GEMMs, which otherwise run at the 128 B/clk limit.
#if defined(FLASH_BWD_DEV_KV_REGS) && FLASH_BWD_DEV_KV_REGS
  static constexpr bool kKVRegs = kRS && kHeadDim <= 64;
#else
  static constexpr bool kKVRegs = false;
#endif
  using SdPShape = Shape<_64, Int<kBlockM / kOtherWGs>, Int<kHeadDim>>;
  using TiledMmaSdP = decltype(make_tiled_mma(
      std::conditional_t<kKVRegs, decltype(GMMA::rs_op_selector<Element, Element, float, SdPShape>()),
                         decltype(GMMA::ss_op_selector<Element, Element, float, SdPShape>())>{},
      AtomLayoutKeys{}));
  // dV, dK: (keys, head dim), K = queries; A = P^T or dS^T (K-major: registers in RS, shared
  // memory in SS), B = dO^T or Q^T (MN-major).
  using MmadKVShape = Shape<_64, Int<kHeadDim / kOtherWGs>, Int<kBlockM>>;
  using MmadKVAtom = std::conditional_t<
      kRS, decltype(GMMA::rs_op_selector<Element, Element, float, MmadKVShape, GMMA::Major::K, GMMA::Major::MN>()),
      decltype(GMMA::ss_op_selector<Element, Element, float, MmadKVShape, GMMA::Major::K, GMMA::Major::MN>())>;
  using TiledMmadKV = decltype(make_tiled_mma(MmadKVAtom{}, AtomLayoutKeys{}));
  // dQ: (queries, head dim), K = keys; A = dS (MN-major view of dS^T), B = K^T (MN-major).
  // The warpgroups split the head dim (64-query steps), or (kDqSplitQueries: 128-query steps, as
  // FA3 at hdim 64) the queries: m64n64 WGMMAs rather than twice as many m64n32 ones, each
  // warpgroup reading only its half of dS. FLASH_BWD_DEV_DQ_SPLIT_M=0 / 1 forces it.
#ifdef FLASH_BWD_DEV_DQ_SPLIT_M
  static constexpr bool kDqSplitQueries = bool(FLASH_BWD_DEV_DQ_SPLIT_M) && kBlockM_ == 128;
#else
  static constexpr bool kDqSplitQueries = kBlockM_ == 128;
#endif
  static constexpr int kDqWGsM = kDqSplitQueries ? 2 : 1;
  // RS path, hdim 128 (FLASH_BWD_DEV_DS_KMAJOR): dS stored keys-contiguous (queries x keys,
  // FA3's layout) with transposing stmatrix, instead of dS^T queries-contiguous. A warp's four
  // stmatrix of a step then land 16 query rows apart, whole swizzle periods, so their addresses
  // are one base plus constants; with dS^T they sit 16 queries apart inside a 128-byte row and
  // every step recomputed four swizzled 64-bit addresses (~25 instructions and register pairs at
  // hdim 128; the compiler rematerializes them in the loop even when they are computed once
  // before it). dQ then reads dS K-major.
  // Measured (twenty-first session, 3 rounds, x cuDNN; non-causal 1k / 8k, then causal 1k / 8k):
  // hdim 128 1.060 / 1.078, 1.051 / 1.093 -> 1.069 / 1.085, 1.074 / 1.102 (deterministic 0.896 /
  // 0.975, 0.944 / 0.994 -> 0.907 / 0.974, 0.948 / 1.033): taken at hdim 128. hdim 64 (step
  // loops 609 -> 561 instructions) lost 2-3 % non-causal (1.144 / 1.147 -> 1.112 / 1.122) and
  // moved causal by -1.6 to +1.7 %: not taken. FLASH_BWD_DEV_DS_KMAJOR=0 / 1 forces it.
#ifdef FLASH_BWD_DEV_DS_KMAJOR
  static constexpr bool kDsKMajor = kRS && bool(FLASH_BWD_DEV_DS_KMAJOR);
#else
  static constexpr bool kDsKMajor = kRS && kHeadDim == 128;
#endif
  static constexpr GMMA::Major kDsMajor = kDsKMajor ? GMMA::Major::K : GMMA::Major::MN;
  using TiledMmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim * kDqWGsM / 2>, Int<kBlockN>>, kDsMajor,
                           GMMA::Major::MN>(),
      Layout<Shape<Int<kDqWGsM>, Int<2 / kDqWGsM>, _1>>{}));
  // The dQ accumulator tile: (queries, head dim).
  using DqTileShape = Shape<Int<kBlockM>, Int<kHeadDim>>;

  // The MN-major views (Q^T, dO^T, K^T) are cut in two along the head dim for dQ (and for
  // dK/dV when the warpgroups split it), so the swizzle must fit half a head dim.
  using SmemAtom = decltype(smem_atom_k_major<Element, kHeadDim / 2>());
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Step<_2, _1>{})));
  // P^T and dS^T: (keys, queries, 2 buffers), queries contiguous.
  using SmemAtomPdS = decltype(smem_atom_k_major<Element, kBlockM>());
  using SmemLayoutPdSt = decltype(tile_to_shape(SmemAtomPdS{}, Shape<Int<kBlockN>, Int<kBlockM>, _2>{}));
  using SmemLayoutdS = decltype(composition(
      SmemLayoutPdSt{}, make_ordered_layout(Shape<Int<kBlockM>, Int<kBlockN>, _2>{}, Step<_2, _1, _3>{})));
  // kDsKMajor: dS (queries, keys, 2), keys contiguous, and its (keys, queries, 2) view for stmatrix.
  using SmemAtomdSK = decltype(smem_atom_k_major<Element, kBlockN>());
  using SmemLayoutdSK = decltype(tile_to_shape(SmemAtomdSK{}, Shape<Int<kBlockM>, Int<kBlockN>, _2>{}));
  using SmemLayoutdStK = decltype(composition(
      SmemLayoutdSK{}, make_ordered_layout(Shape<Int<kBlockN>, Int<kBlockM>, _2>{}, Step<_2, _1, _3>{})));
  static_assert(cosize_v<SmemLayoutdSK> == cosize_v<SmemLayoutPdSt>);
  // The stores' constant offsets rest on whole 1 KB swizzle atoms (8 query rows of 64 keys): a
  // warp's stores sit 16 query rows apart, and a buffer is kBlockM * 256 bytes.
  static_assert(!kDsKMajor || std::is_same_v<SmemAtomdSK, GMMA::Layout_K_SW128_Atom<Element>>);

  using ShapeQKV = Shape<int32_t, int32_t, int32_t, int32_t>;  // (seqlen, d, heads, batch)
  using StrideQKV = Stride<int64_t, _1, int64_t, int64_t>;
  using TmaQ = decltype(make_tma_copy(
      SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQKV{}),
      take<0, 2>(SmemLayoutQ{}), Shape<Int<kBlockM>, Int<kHeadDim>>{}, _1{}));
  using TmaK = decltype(make_tma_copy(
      SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQKV{}),
      SmemLayoutK{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;
  static constexpr uint32_t kBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kBytesK = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kBytesRow = kBlockM * sizeof(float);  // LSE2 or D of one query block
  static constexpr uint32_t kBytesDq = kBlockM * kHeadDim * sizeof(float);
  // One dQ block in shared memory (and in the float32 accumulator): the accumulator's elements in
  // pairs, pair j of consumer thread t at pair index j * threads + t (kDqPerWG: warpgroup w's half
  // of the block first, pair j of its thread u at j * 128 + u within it), so that each store is one
  // conflict-free 8-byte store. (16-byte stores, FA3's STS.128, measured -3 to +2 % with the shared
  // staging in the eighteenth session and -2.5 to +3 % with the per-warpgroup one at hdim 128 in
  // the nineteenth: not taken; the knob's code is at commit cc7457d.)
  static constexpr int kDqAccPerThread = kBlockM * kHeadDim / kNumMmaThreads;
  static_assert(kDqAccPerThread % 2 == 0);
  // Where consumer thread t's accumulator element i sits in a dQ block (float offset).
  CUTLASS_HOST_DEVICE static constexpr int dq_staged_offset(int i, int t) {
    if constexpr (kDqPerWG) {  // warpgroup w's half first, each half in its threads' pair order
      return (t / 128) * (kBlockM * kHeadDim / 2) + (i / 2) * (128 * 2) + (t % 128) * 2 + i % 2;
    } else {
      return (i / 2) * (kNumMmaThreads * 2) + t * 2 + i % 2;
    }
  }

  // P^T and dS^T buffers (SS), or dS alone (RS).
  struct SmemSS {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutPdSt>> pt;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutPdSt>> dst;
  };
  struct SmemRS {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutPdSt>> dst;
  };
  template <int kBuffers>
  struct SmemDq {
    alignas(1024) cute::array_aligned<float, kBuffers * kBlockM * kHeadDim> dq;
  };
  struct NoRing {};
  struct TileRing {  // kDynamic: tile ids from the producer to the consumers and the dQ reducer
    int ids[2];
    alignas(16) cutlass::arch::ClusterBarrier full[2];   // id written (1 arrival: the producer)
    alignas(16) cutlass::arch::ClusterBarrier empty[2];  // id read (every consumer thread, the reducer warp)
  };
  template <int kDqBuffers>
  struct Storage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> dout;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> v;
    std::conditional_t<kRS, SmemRS, SmemSS> pds;
    SmemDq<kDqBuffers> dq;
    alignas(16) float lse2[kStages][kBlockM];
    alignas(16) float dsum[kStages][kBlockM];
    alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_kv;
    alignas(16) cutlass::arch::ClusterBarrier barrier_kv_empty;  // persistent: consumers done with K, V
    std::conditional_t<kDynamic, TileRing, NoRing> ring;
    alignas(16) typename Pipeline::SharedStorage pipeline_qdo;
    alignas(16) typename Pipeline::SharedStorage pipeline_do;  // kSplitQdO: dO and D (Q and LSE in pipeline_qdo)
  };
  static constexpr int kSmemLimit = 227 * 1024;
  // Two dQ staging buffers where they fit, else one; FLASH_BWD_DEV_DQ_STAGES overrides.
  // (kDqPerWG: one buffer, whose two halves take the barrier ids of two buffers.)
#ifdef FLASH_BWD_DEV_DQ_STAGES
  static constexpr int kDqStages = FLASH_BWD_DEV_DQ_STAGES;
#else
  static constexpr int kDqStages = kDqPerWG ? 1 : (sizeof(Storage<2>) <= kSmemLimit ? 2 : 1);
#endif
  static_assert(kDqStages == 1 || kDqStages == 2);
  static_assert(!kDqPerWG || kDqStages == 1, "per-warpgroup dQ staging uses the barrier ids of two buffers");
  using SharedStorage = Storage<kDqStages>;
  static constexpr int kSharedStorageSize = sizeof(SharedStorage);
  static_assert(kSharedStorageSize <= kSmemLimit,
                "backward tile (with a dQ staging buffer) does not fit in shared memory: fewer Q/dO stages");

  struct Params {
    TmaQ tma_q;
    TmaQ tma_do;
    TmaK tma_k;
    TmaK tma_v;
    ShapeQKV shape_q;
    ShapeQKV shape_k;
    Element* dk;
    Element* dv;
    float* dq_accum;
    float const* lse_log2;
    float const* dsum;
    int* dq_semaphore;  // non-null: deterministic dQ
    int* tile_counter;  // kDynamic: zeroed before the launch
    int seqlen_q;
    int seqlen_q_padded;
    int seqlen_k;
    int heads_q;
    int q_heads_per_kv_head;
    int head_dim;
    int heads_kv;
    float softmax_scale;
    float softmax_scale_log2;
    int diag_offset;
    int window_left;
    int window_right;
  };

  CUTLASS_DEVICE void operator()(Params const& params, char* smem_buf) const {
    SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_buf);
    int const warp_group_idx = cutlass::canonical_warp_group_idx();
    int const warp_idx_in_wg = cutlass::canonical_warp_idx_sync() % 4;
    bool const lane_predicate = cute::elect_one_sync();

    if (warp_group_idx == 0 && warp_idx_in_wg == 0 && lane_predicate) {
      cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_do.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
      smem.barrier_kv.init(/*arrive_count=*/1);
      smem.barrier_kv_empty.init(/*arrive_count=*/kNumMmaThreads);
      if constexpr (kDynamic) {
        for (int slot = 0; slot < 2; ++slot) {
          smem.ring.full[slot].init(1);
          smem.ring.empty[slot].init(kNumMmaThreads + 32);
        }
      }
    }
    typename Pipeline::Params pipeline_params;
    // Q, dO, LSE2, D of one query block (kSplitQdO: Q and LSE2 here, dO and D in pipeline_do)
    pipeline_params.transaction_bytes = kSplitQdO ? kBytesQ + kBytesRow : 2 * kBytesQ + 2 * kBytesRow;
    pipeline_params.role = warp_group_idx == 0 ? Pipeline::ThreadCategory::Producer
                                               : Pipeline::ThreadCategory::Consumer;
    pipeline_params.is_leader = threadIdx.x == 0;
    pipeline_params.num_consumers = kNumMmaThreads;
    Pipeline pipeline(smem.pipeline_qdo, pipeline_params, Shape<_1, _1, _1>{});
    Pipeline pipeline_do(smem.pipeline_do, pipeline_params, Shape<_1, _1, _1>{});  // used with kSplitQdO
    __syncthreads();

    // Every role walks the same tiles; Progress counts the steps and K/V loads before each tile
    // (the dQ staging buffers, the dS^T buffers and the K/V barrier phases run on across tiles).
    if (warp_group_idx == 0) {
      cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
      if (warp_idx_in_wg == 0 && lane_predicate) {
        PipelineState state = cutlass::make_producer_start_state<Pipeline>();
        for_each_tile</*kDraws=*/true>(params, smem, [&](BwdTile const& tile, Progress const& progress) {
          load(params, smem, pipeline, pipeline_do, state, progress, tile.range, tile.num_steps, tile.n_block,
               tile.head_kv, tile.batch);
        });
      }
      if (warp_idx_in_wg == 1) {
        bool const leader = cute::elect_one_sync();
        for_each_tile</*kDraws=*/false>(params, smem, [&](BwdTile const& tile, Progress const& progress) {
          reduce_dq(params, smem, progress, leader, tile.range, tile.num_steps, tile.n_block, tile.head_kv,
                    tile.batch);
        });
        if (leader) { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
      }
    } else {
      cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
      PipelineState state;
      for_each_tile</*kDraws=*/false>(params, smem, [&](BwdTile const& tile, Progress const& progress) {
        if constexpr (kRS) {
          consume_rs(params, smem, pipeline, state, progress, tile.range, tile.num_steps, tile.n_block,
                     tile.head_kv, tile.batch, threadIdx.x - 128);
        } else {
          consume(params, smem, pipeline, pipeline_do, state, progress, tile.range, tile.num_steps, tile.n_block,
                  tile.head_kv, tile.batch, threadIdx.x - 128);
        }
      });
    }
  }

  struct BwdTile {
    int n_block, head_kv, batch;
    BwdBlockRange<kBlockM, kBlockN, kLocal> range;
    int num_steps;
  };
  struct Progress {
    int steps = 0;     // steps of the CTA's earlier tiles
    int kv_loads = 0;  // K/V blocks loaded for them (tiles without steps load none)
  };

  // The CTA's tiles in order: its blockIdx one; (kPersistent, non-causal) tiles blockIdx.x,
  // + gridDim.x, ... of the (key blocks, KV heads, batch) grid, key blocks fastest; (kDynamic)
  // tile ids blockIdx.x, then from the counter, decoded by tile_coords. kDraws: the producer
  // thread, which draws the ids and writes them into the ring; every other role reads them there.
  template <bool kDraws, typename Fn>
  CUTLASS_DEVICE static void for_each_tile(Params const& params, SharedStorage& smem, Fn&& fn) {
    Progress progress;
    auto visit = [&](int n_block, int head_kv, int batch) {
      BwdBlockRange<kBlockM, kBlockN, kLocal> const range(n_block, params.seqlen_q, params.diag_offset,
                                                          params.window_left, params.window_right);
      BwdTile const tile{n_block, head_kv, batch, range, range.count() * params.q_heads_per_kv_head};
      fn(tile, progress);
      progress.steps += tile.num_steps;
      progress.kv_loads += tile.num_steps > 0 ? 1 : 0;
    };
    int const n_blocks = (params.seqlen_k + kBlockN - 1) / kBlockN;
    int const tiles = n_blocks * params.heads_kv * int(get<3>(params.shape_q));
    if constexpr (kDynamic) {
      int tile = blockIdx.x;
      for (int iteration = 0;; ++iteration) {
        int const slot = iteration & 1;
        if constexpr (kDraws) {
          smem.ring.empty[slot].wait(((iteration >> 1) & 1) ^ 1);  // every reader has read its last id
          smem.ring.ids[slot] = tile;
          smem.ring.full[slot].arrive();
          if (tile >= tiles) { break; }
          int const next = atomicAdd(params.tile_counter, 1) + int(gridDim.x);  // in flight meanwhile
          BwdCoords const c = tile_coords(params, tile, n_blocks);
          visit(c.n_block, c.head_kv, c.batch);
          tile = next;
        } else {
          smem.ring.full[slot].wait((iteration >> 1) & 1);
          tile = smem.ring.ids[slot];
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

  // kDynamic: tile id -> (key block, KV head, batch), longest first over all heads. The ids run in
  // sections of up to kLptBytes of Q, dO and dQ accumulator ((KV head, batch) pairs, a power of
  // two of them, as L2 reuse wants), key blocks major and pairs minor within a section: every
  // pair's key block 0 (which sees the most queries under a causal mask) comes before any pair's
  // block 1.
  struct BwdCoords {
    int n_block, head_kv, batch;
  };
  static constexpr int64_t kLptBytes = 40ll << 20;
  CUTLASS_DEVICE static BwdCoords tile_coords(Params const& params, int tile, int n_blocks) {
    int const pairs = params.heads_kv * int(get<3>(params.shape_q));
    int64_t const bytes_per_pair = int64_t(params.seqlen_q_padded) * params.q_heads_per_kv_head * params.head_dim *
                                   (2 * 2 + 4);  // Q + dO (16-bit) + dQ (float)
    int const fit = int(max(int64_t(1), min(int64_t(pairs), kLptBytes / bytes_per_pair)));
    int const section_pairs = 1 << (31 - __clz(fit));  // a power of two <= fit
    int const section = tile / (section_pairs * n_blocks);
    int const first_pair = section * section_pairs;
    int const in_section = tile - first_pair * n_blocks;
    int const size = min(section_pairs, pairs - first_pair);  // the last section may be short
    int const pair = first_pair + in_section % size;
    return {in_section / size, pair % params.heads_kv, pair / params.heads_kv};
  }

  CUTLASS_DEVICE void load(Params const& params, SharedStorage& smem, Pipeline& pipeline, Pipeline& pipeline_do,
                           PipelineState& state, Progress const& progress,
                           BwdBlockRange<kBlockM, kBlockN, kLocal> const& range, int num_steps, int n_block,
                           int head_kv, int batch) const {
    if (num_steps == 0) { return; }
    // The consumers' last GEMMs of the previous tile have read K and V.
    if (progress.kv_loads > 0) { smem.barrier_kv_empty.wait((progress.kv_loads - 1) & 1); }
    Tensor mK = params.tma_k.get_tma_tensor(params.shape_k)(_, _, head_kv, batch);
    Tensor mV = params.tma_v.get_tma_tensor(params.shape_k)(_, _, head_kv, batch);
    Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(n_block, _0{}));
    Tensor gV = local_tile(mV, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(n_block, _0{}));
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), SmemLayoutK{});
    auto [tKgK, tKsK] = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto [tVgV, tVsV] = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    smem.barrier_kv.arrive_and_expect_tx(2 * kBytesK);
    copy(params.tma_k.with(reinterpret_cast<uint64_t&>(smem.barrier_kv)), tKgK, tKsK);
    copy(params.tma_v.with(reinterpret_cast<uint64_t&>(smem.barrier_kv)), tVgV, tVsV);

    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(smem.dout.data()), SmemLayoutQ{});
    Walk walk(params, range, n_block);
    for (int step = 0; step < num_steps; ++step, walk.advance()) {
      int const head = head_kv * params.q_heads_per_kv_head + walk.head_offset;
      int const m_block = walk.m_block;
      Tensor mQ = params.tma_q.get_tma_tensor(params.shape_q)(_, _, head, batch);
      Tensor mdO = params.tma_do.get_tma_tensor(params.shape_q)(_, _, head, batch);
      Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, _0{}));
      Tensor gdO = local_tile(mdO, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(m_block, _0{}));
      auto [tQgQ, tQsQ] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
      auto [tdOgdO, tdOsdO] =
          tma_partition(params.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
      int64_t const row = (int64_t(batch) * params.heads_q + head) * params.seqlen_q_padded + m_block * kBlockM;
      pipeline.producer_acquire(state);
      uint64_t* const full = reinterpret_cast<uint64_t*>(pipeline.producer_get_barrier(state));
      copy(params.tma_q.with(*pipeline.producer_get_barrier(state)), tQgQ, tQsQ(_, state.index()));
      SM90_BULK_COPY_G2S::copy(params.lse_log2 + row, full, smem.lse2[state.index()], kBytesRow);
      if constexpr (kSplitQdO) {  // the two pipelines advance together: one state serves both
        pipeline_do.producer_acquire(state);
        uint64_t* const full_do = reinterpret_cast<uint64_t*>(pipeline_do.producer_get_barrier(state));
        copy(params.tma_do.with(*pipeline_do.producer_get_barrier(state)), tdOgdO, tdOsdO(_, state.index()));
        SM90_BULK_COPY_G2S::copy(params.dsum + row, full_do, smem.dsum[state.index()], kBytesRow);
      } else {
        copy(params.tma_do.with(*pipeline.producer_get_barrier(state)), tdOgdO, tdOsdO(_, state.index()));
        SM90_BULK_COPY_G2S::copy(params.dsum + row, full, smem.dsum[state.index()], kBytesRow);
      }
      ++state;
    }
  }

  // The shared-memory views both consumer paths read.
  CUTLASS_DEVICE static auto smem_views(SharedStorage& smem) {
    return cute::make_tuple(make_tensor(make_smem_ptr(smem.q.data()), SmemLayoutQ{}),        // sQ (M, D, stages)
                            make_tensor(make_smem_ptr(smem.q.data()), SmemLayoutQt{}),       // sQt (D, M, stages)
                            make_tensor(make_smem_ptr(smem.dout.data()), SmemLayoutQ{}),     // sdO
                            make_tensor(make_smem_ptr(smem.dout.data()), SmemLayoutQt{}),    // sdOt
                            make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutK{}),        // sK (N, D)
                            make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutKt{}),       // sKt (D, N)
                            make_tensor(make_smem_ptr(smem.v.data()), SmemLayoutK{}),        // sV
                            make_tensor(make_smem_ptr(smem.pds.dst.data()),
                                        std::conditional_t<kDsKMajor, SmemLayoutdStK, SmemLayoutPdSt>{}),  // sdSt (N, M, 2)
                            make_tensor(make_smem_ptr(smem.pds.dst.data()),
                                        std::conditional_t<kDsKMajor, SmemLayoutdSK, SmemLayoutdS>{}));  // sdS (M, N, 2)
  }

  CUTLASS_DEVICE void consume(Params const& params, SharedStorage& smem, Pipeline& pipeline, Pipeline& pipeline_do,
                              PipelineState& state, Progress const& progress,
                              BwdBlockRange<kBlockM, kBlockN, kLocal> const& range, int num_steps, int n_block,
                              int head_kv, int batch, int mma_tidx) const {
    TiledMmaSdP mma_sdp;
    TiledMmadKV mma_dkv;
    TiledMmadQ mma_dq;
    auto thr_sdp = mma_sdp.get_thread_slice(mma_tidx);
    int const wg_thread = warpgroup_first_thread(mma_tidx);  // operands: uniform descriptors
    auto wg_sdp = mma_sdp.get_thread_slice(wg_thread);
    auto wg_dkv = mma_dkv.get_thread_slice(wg_thread);
    auto wg_dq = mma_dq.get_thread_slice(wg_thread);

    auto [sQ, sQt, sdO, sdOt, sK, sKt, sV, sdSt, sdS] = smem_views(smem);
    Tensor sPt = make_tensor(make_smem_ptr(smem.pds.pt.data()), SmemLayoutPdSt{});  // (N, M, 2)

    // Operand descriptors.
    Tensor tSrK = wg_sdp.partition_fragment_A(sK);
    Tensor tSrV = wg_sdp.partition_fragment_A(sV);
    Tensor tSrQ = wg_sdp.partition_fragment_B(sQ);     // (..., stages)
    Tensor tSrdO = wg_sdp.partition_fragment_B(sdO);
    Tensor tdVrPt = wg_dkv.partition_fragment_A(sPt);  // (..., 2)
    Tensor tdKrdSt = wg_dkv.partition_fragment_A(sdSt);
    Tensor tdVrdOt = wg_dkv.partition_fragment_B(sdOt);  // (..., stages)
    Tensor tdKrQt = wg_dkv.partition_fragment_B(sQt);
    Tensor tdQrdS = wg_dq.partition_fragment_A(sdS);   // (..., 2)
    Tensor tdQrKt = wg_dq.partition_fragment_B(sKt);

    // Accumulators.
    Tensor tdVrdV = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
    Tensor tdKrdK = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
    clear(tdVrdV);
    clear(tdKrdK);

    // (key, query) coordinates of this thread's S^T elements, as (rows, cols).
    Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{}));
    Tensor tScS_rc = make_tensor(tScS.data(), acc_layout_rowcol(tScS.layout()));
    constexpr int kCols = decltype(size<1>(tScS_rc))::value;

    auto smem_copy_pds = make_tiled_copy_C(Copy_Atom<DefaultCopy, Element>{}, mma_sdp);
    auto smem_thr_copy_pds = smem_copy_pds.get_thread_slice(mma_tidx);
    Tensor tPsPt = smem_thr_copy_pds.partition_D(sPt);    // (CPY, CPY_N, CPY_M, 2)
    Tensor tPsdSt = smem_thr_copy_pds.partition_D(sdSt);

    int const n0 = n_block * kBlockN;
    if (num_steps > 0) { smem.barrier_kv.wait(progress.kv_loads & 1); }

    Walk walk(params, range, n_block);
    for (int step = 0; step < num_steps; ++step, walk.advance()) {
      int const m_block = walk.m_block;
      int const m0 = m_block * kBlockM;
      int const buf = (progress.steps + step) & 1;

      pipeline.consumer_wait(state);
      Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
      Tensor tSrdP = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
      wgmma_async</*kZeroInit=*/true>(mma_sdp, tSrK, tSrQ(_, _, _, state.index()), tSrS);
      if constexpr (kSplitQdO) { pipeline_do.consumer_wait(state); }
      wgmma_async</*kZeroInit=*/true>(mma_sdp, tSrV, tSrdO(_, _, _, state.index()), tSrdP);

      // Per-query LSE (log2 domain) and D for this thread's columns, read while the GEMMs run.
      float lse2[kCols];
      float dsum[kCols];
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < kCols; ++c) {
        int const query = get<1>(tScS_rc(0, c));
        lse2[c] = smem.lse2[state.index()][query];
        dsum[c] = smem.dsum[state.index()][query];
      }

      Tensor tSrS_rc = make_tensor(tSrS.data(), acc_layout_rowcol(tSrS.layout()));
      Tensor tSrdP_rc = make_tensor(tSrdP.data(), acc_layout_rowcol(tSrdP.layout()));
      warpgroup_wait<1>();  // S^T ready
      bool const needs_mask = block_needs_mask(m0, n0, params);
      StepMask const step_mask(params, n0, m0);
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < size<0>(tSrS_rc); ++r) {
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < kCols; ++c) {
          float s = tSrS_rc(r, c) * params.softmax_scale_log2 - lse2[c];
          if (needs_mask && step_mask.hides(get<0>(tScS_rc(r, c)), get<1>(tScS_rc(r, c)))) { s = -INFINITY; }
          tSrS_rc(r, c) = exp2f(s);  // P^T
        }
      }
      warpgroup_wait<0>();  // dP^T ready
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < size<0>(tSrdP_rc); ++r) {
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < kCols; ++c) { tSrdP_rc(r, c) = tSrS_rc(r, c) * (tSrdP_rc(r, c) - dsum[c]); }  // dS^T
      }

      // P^T and dS^T to shared memory: the next GEMMs read them from both warpgroups.
      Tensor tPrP = make_tensor<Element>(tSrS.layout());
      Tensor tPrdS = make_tensor<Element>(tSrdP.layout());
      convert_into(tSrS, tPrP);
      convert_into(tSrdP, tPrdS);
      copy(smem_copy_pds, smem_thr_copy_pds.retile_S(tPrP), tPsPt(_, _, _, buf));
      copy(smem_copy_pds, smem_thr_copy_pds.retile_S(tPrdS), tPsdSt(_, _, _, buf));
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::NamedBarrier::sync(kNumMmaThreads, static_cast<int>(BwdNamedBarrier::kPdSReady));

      Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
      if constexpr (kSplitQdO) {
        wgmma_async</*kZeroInit=*/false>(mma_dkv, tdKrdSt(_, _, _, buf), tdKrQt(_, _, _, state.index()), tdKrdK);
        wgmma_async</*kZeroInit=*/false>(mma_dkv, tdVrPt(_, _, _, buf), tdVrdOt(_, _, _, state.index()), tdVrdV);
        wgmma_async</*kZeroInit=*/true>(mma_dq, tdQrdS(_, _, _, buf), tdQrKt, tdQrdQ);
        warpgroup_wait<2>();  // dK done: Q's stage is free
        pipeline.consumer_release(state);
        warpgroup_wait<1>();  // dV done: dO's stage is free
        pipeline_do.consumer_release(state);
        warpgroup_wait<0>();
      } else {
        wgmma_async</*kZeroInit=*/false>(mma_dkv, tdVrPt(_, _, _, buf), tdVrdOt(_, _, _, state.index()), tdVrdV);
        wgmma_async</*kZeroInit=*/false>(mma_dkv, tdKrdSt(_, _, _, buf), tdKrQt(_, _, _, state.index()), tdKrdK);
        wgmma_async</*kZeroInit=*/true>(mma_dq, tdQrdS(_, _, _, buf), tdQrKt, tdQrdQ);
        warpgroup_wait<0>();
        pipeline.consumer_release(state);
      }
      ++state;

      stage_dq(smem, tdQrdQ, progress.steps + step, mma_tidx);
    }
    // Persistent: K and V are free for the next tile once the last step's GEMMs are done.
    if (kPersistent && num_steps > 0) { smem.barrier_kv_empty.arrive(); }
    epilogue(params, mma_dkv, tdKrdK, tdVrdV, n_block, head_kv, batch, mma_tidx);
  }

  // dQ of one step to staging buffer step % kDqStages, in register order (dq_staged_offset),
  // for the reducer warp; first wait until it has read what that buffer held. kDqPerWG: one
  // buffer, each warpgroup writing its own half under its own barrier pair (128 + 32 threads).
  template <typename TensorAcc>
  CUTLASS_DEVICE void stage_dq(SharedStorage& smem, TensorAcc const& tdQrdQ, int step, int mma_tidx) const {
    static_assert(decltype(size(tdQrdQ))::value == kDqAccPerThread);
    int const buffer = step % kDqStages;
    int const pair = kDqPerWG ? mma_tidx / 128 : buffer;  // which empty / full barriers
    constexpr int kThreads = (kDqPerWG ? 128 : kNumMmaThreads) + 32;
    if (step >= kDqStages) {
      cutlass::arch::NamedBarrier::sync(kThreads, static_cast<int>(BwdNamedBarrier::kDqEmpty0) + pair);
    }
    float* const sdq = smem.dq.dq.data() + buffer * (kBlockM * kHeadDim);
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kDqAccPerThread / 2; ++j) {
      *reinterpret_cast<float2*>(sdq + dq_staged_offset(2 * j, mma_tidx)) =
          make_float2(tdQrdQ(2 * j), tdQrdQ(2 * j + 1));
    }
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::arrive(kThreads, static_cast<int>(BwdNamedBarrier::kDqFull0) + pair);
  }

  // RS variant (kBlockN == 128): warpgroup w owns keys [64 w, 64 w + 64) for S^T, dP^T, dV, dK.
  CUTLASS_DEVICE void consume_rs(Params const& params, SharedStorage& smem, Pipeline& pipeline,
                                 PipelineState& state, Progress const& progress,
                                 BwdBlockRange<kBlockM, kBlockN, kLocal> const& range, int num_steps, int n_block,
                                 int head_kv, int batch, int mma_tidx) const {
    TiledMmaSdP mma_sdp;
    TiledMmadKV mma_dkv;
    TiledMmadQ mma_dq;
    auto thr_sdp = mma_sdp.get_thread_slice(mma_tidx);
    int const wg_thread = warpgroup_first_thread(mma_tidx);  // operands: uniform descriptors
    auto wg_sdp = mma_sdp.get_thread_slice(wg_thread);
    auto wg_dkv = mma_dkv.get_thread_slice(wg_thread);
    auto wg_dq = mma_dq.get_thread_slice(wg_thread);

    auto [sQ, sQt, sdO, sdOt, sK, sKt, sV, sdSt, sdS] = smem_views(smem);

    Tensor tSrK = wg_sdp.partition_fragment_A(sK);  // descriptors, or registers with kKVRegs
    Tensor tSrV = wg_sdp.partition_fragment_A(sV);
    Tensor tSrQ = wg_sdp.partition_fragment_B(sQ);       // (..., stages)
    Tensor tSrdO = wg_sdp.partition_fragment_B(sdO);
    Tensor tdVrdOt = wg_dkv.partition_fragment_B(sdOt);  // (..., stages)
    Tensor tdKrQt = wg_dkv.partition_fragment_B(sQt);
    // dQ's operands: A = dS (..., 2 buffers), B = K^T.
    Tensor tdQrA = wg_dq.partition_fragment_A(sdS);
    Tensor tdQrB = wg_dq.partition_fragment_B(sKt);

    Tensor tdVrdV = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
    Tensor tdKrdK = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
    clear(tdVrdV);
    clear(tdKrdK);

    Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{}));
    Tensor tScS_rc = make_tensor(tScS.data(), acc_layout_rowcol(tScS.layout()));
    constexpr int kCols = decltype(size<1>(tScS_rc))::value;

    // dS^T to shared memory with stmatrix (rows = keys, 16-byte runs of queries).
    auto smem_copy_ds = make_tiled_copy_C(
        Copy_Atom<std::conditional_t<kDsKMajor, SM90_U16x8_STSM_T, SM90_U32x4_STSM_N>, Element>{}, mma_sdp);
    auto smem_thr_copy_ds = smem_copy_ds.get_thread_slice(mma_tidx);
    Tensor tdSsdSt = smem_thr_copy_ds.partition_D(sdSt);  // (CPY, CPY_N, CPY_M, 2)
    // kDsKMajor: one stmatrix per (atom repeat, copy n, copy m); this thread's first row address
    // in buffer 0, plus per-store offsets taken from thread 0's layout (whole swizzle periods apart,
    // so the same for every thread), plus the buffer.
    static_assert(decltype(rank<0>(tdSsdSt))::value == 2 || !kDsKMajor);
    constexpr int kDsAtoms = kDsKMajor ? decltype(size<0, 1>(tdSsdSt))::value : 1;
    constexpr int kDsCopyN = decltype(size<1>(tdSsdSt))::value;
    constexpr int kDsCopies = kDsAtoms * kDsCopyN * decltype(size<2>(tdSsdSt))::value;
    [[maybe_unused]] uint32_t ds_base = 0;
    if constexpr (kDsKMajor) {
      ds_base = cute::cast_smem_ptr_to_uint(raw_pointer_cast(&tdSsdSt(make_coord(0, 0), 0, 0, 0)));
    }
    // Store i's (atom repeat, copy n, copy m), and its byte offset from store 0 (a constant).
    auto ds_store = [](auto i) {
      constexpr int k = decltype(i)::value;
      return make_coord(Int<k % kDsAtoms>{}, Int<(k / kDsAtoms) % kDsCopyN>{}, Int<k / (kDsAtoms * kDsCopyN)>{});
    };
    auto ds_offset = [&](auto store) {
      Tensor t0 = smem_copy_ds.get_thread_slice(0).partition_D(sdSt);
      int const off = int(t0.layout()(make_coord(make_coord(_0{}, get<0>(store)), get<1>(store), get<2>(store), _0{}))) -
                      int(t0.layout()(make_coord(make_coord(_0{}, _0{}), _0{}, _0{}, _0{})));
      return uint32_t(off * int(sizeof(Element)));
    };

    int const n0 = n_block * kBlockN;
    if (num_steps > 0) {
      smem.barrier_kv.wait(progress.kv_loads & 1);
      if constexpr (kKVRegs) {  // this warpgroup's K and V rows into registers, once (ldmatrix)
        auto smem_copy_a = make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma_sdp);
        auto thr_copy_a = smem_copy_a.get_thread_slice(mma_tidx);
        copy(smem_copy_a, thr_copy_a.partition_S(sK), thr_copy_a.retile_D(tSrK));
        copy(smem_copy_a, thr_copy_a.partition_S(sV), thr_copy_a.retile_D(tSrV));
      }
    }

    // One step; masked: std::true_type where the step's block crosses the diagonal or a window
    // edge, std::false_type where it does not, or a bool decided at run time. kSplitSteps
    // (causal/local): the steps run in alternating masked / unmasked loops, so that the unmasked
    // steps carry no mask code (as the forward's split key-block loop); otherwise every
    // causal/local step tests its block at run time.
    auto step_body = [&](int step, int m_block, auto masked) CUTLASS_LAMBDA_FUNC_INLINE {
      int const m0 = m_block * kBlockM;
      int const buf = (progress.steps + step) & 1;
      int const stage = state.index();
      bool mask_on;  // a compile-time constant where masked is std::true_type / std::false_type
      if constexpr (std::is_same_v<decltype(masked), bool>) {
        mask_on = masked;
      } else {
        mask_on = decltype(masked)::value;
      }

      pipeline.consumer_wait(state);
      Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
      Tensor tSrdP = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
      wgmma_async</*kZeroInit=*/true>(mma_sdp, tSrK, tSrQ(_, _, _, stage), tSrS);
      wgmma_async</*kZeroInit=*/true>(mma_sdp, tSrV, tSrdO(_, _, _, stage), tSrdP);

      Tensor tSrS_rc = make_tensor(tSrS.data(), acc_layout_rowcol(tSrS.layout()));
      Tensor tSrdP_rc = make_tensor(tSrdP.data(), acc_layout_rowcol(tSrdP.layout()));
      warpgroup_wait<1>();  // S^T ready
      StepMask const step_mask(params, n0, m0);
      // Where the step decides at run time, the mask writes -inf into S^T in a loop of its own
      // under a uniform branch, so that unmasked steps skip it (-inf * scale - lse2 is -inf: lse2
      // is +inf, never -inf, for rows that see nothing). A select per element fused into the exp
      // loop was if-converted into every step (~96 of 633 instructions per step at hdim 128).
      // Measured causal at hdim 128, 2k-16k: the separate loop +1-4 %, with the step walk +2-6 %.
      constexpr bool kPrepass = std::is_same_v<decltype(masked), bool>;
      if constexpr (kPrepass) {
        if (mask_on) {
          CUTLASS_PRAGMA_UNROLL
          for (int c = 0; c < kCols; ++c) {
            CUTLASS_PRAGMA_UNROLL
            for (int r = 0; r < size<0>(tSrS_rc); ++r) {
              if (step_mask.hides(get<0>(tScS_rc(r, c)), get<1>(tScS_rc(0, c)))) { tSrS_rc(r, c) = -INFINITY; }
            }
          }
        }
      }
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < kCols; ++c) {
        int const query = get<1>(tScS_rc(0, c));
        float const lse2 = smem.lse2[stage][query];
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < size<0>(tSrS_rc); ++r) {
          float s = tSrS_rc(r, c) * params.softmax_scale_log2 - lse2;
          if (!kPrepass && mask_on && step_mask.hides(get<0>(tScS_rc(r, c)), query)) { s = -INFINITY; }
          tSrS_rc(r, c) = exp2f(s);  // P^T
        }
      }
      // dV += P^T . dO with P^T from registers; it runs while dS^T is computed, or (kDvAfterDs)
      // while dS^T is written and the warpgroups meet before dQ, or (kDvSplit) its first
      // kDvFirstKBlocks K blocks while dS^T is computed and the rest from there.
      Tensor tdVrP = make_tensor<Element>(acc_layout_as_a_operand(tSrS.layout()));
      Tensor tSrS_a = make_tensor(tSrS.data(), acc_layout_as_a_operand(tSrS.layout()));  // kLateP16
      constexpr int kDvKBlocks = decltype(size<2>(tdVrP))::value;
      if constexpr (!kLateP16) {
        convert_into(tSrS, tdVrP);
      } else if constexpr (kDvSplit) {
        convert_k_blocks<0, kDvFirstKBlocks>(tSrS_a, tdVrP);
      }
      if constexpr (!kDvAfterDs) { wgmma_async</*kZeroInit=*/false>(mma_dkv, tdVrP, tdVrdOt(_, _, _, stage), tdVrdV); }
      if constexpr (kDvSplit) {
        wgmma_async_k_range<0, kDvFirstKBlocks, /*kZeroInit=*/false>(mma_dkv, tdVrP, tdVrdOt(_, _, _, stage), tdVrdV);
      }

      warpgroup_wait<(kDvAfterDs && !kDvSplit) ? 0 : 1>();  // dP^T ready (the dV GEMM, or its first half, may still run)
      // dS^T = P^T (dP^T - D), with P^T in float32, or (kDsFrom16BitP: 128-query steps, which ran
      // out of registers) its 16-bit copy made for the dV GEMM, so that the float32 P^T is dead
      // by now.
      Tensor tPrP_rc = make_tensor(tdVrP.data(), tSrS_rc.layout());  // same element order as tSrS
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < kCols; ++c) {
        float const dsum = smem.dsum[stage][get<1>(tScS_rc(0, c))];
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < size<0>(tSrdP_rc); ++r) {
          float const p = kDsFrom16BitP ? float(tPrP_rc(r, c)) : tSrS_rc(r, c);
          tSrdP_rc(r, c) = p * (tSrdP_rc(r, c) - dsum);
        }
      }
      if constexpr (kLateP16) { convert_k_blocks<kDvSplit ? kDvFirstKBlocks : 0, kDvKBlocks>(tSrS_a, tdVrP); }
      Tensor tdKrdS = make_tensor<Element>(acc_layout_as_a_operand(tSrdP.layout()));
      convert_into(tSrdP, tdKrdS);

      // dS^T (both warpgroups' keys) to shared memory for dQ = dS . K.
      Tensor tdSrdS = make_tensor(tdKrdS.data(), tSrdP.layout());  // the same registers, C layout
      if constexpr (kDsKMajor) {
        Tensor src = smem_thr_copy_ds.retile_S(tdSrdS);  // ((8 values, atoms), CPY_N, CPY_M)
        uint32_t const buf_base = ds_base + uint32_t(buf) * uint32_t(kBlockN * kBlockM * sizeof(Element));
        cute::for_each(cute::make_int_sequence<kDsCopies>{}, [&](auto i) {
          auto const store = ds_store(i);
          Tensor words = recast<uint32_t>(src(make_coord(_, get<0>(store)), get<1>(store), get<2>(store)));
          static_assert(decltype(size(words))::value == 4);
          asm volatile("stmatrix.sync.aligned.x4.trans.m8n8.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                           buf_base + ds_offset(store)),
                       "r"(words(0)), "r"(words(1)), "r"(words(2)), "r"(words(3)));
        });
      } else {
        copy(smem_copy_ds, smem_thr_copy_ds.retile_S(tdSrdS), tdSsdSt(_, _, _, buf));
      }
      cutlass::arch::fence_view_async_shared();
      auto dv_rest = [&] {  // kDvSplit: the dV GEMM's K blocks after the first kDvFirstKBlocks
        if constexpr (kDvSplit) {
          wgmma_async_k_range<kDvFirstKBlocks, kDvKBlocks, /*kZeroInit=*/false>(mma_dkv, tdVrP,
                                                                              tdVrdOt(_, _, _, stage), tdVrdV);
        }
      };
      if constexpr (kDvSplit) {
        if constexpr (kDvLate == 0) { dv_rest(); }
      } else if constexpr (kDvAfterDs) {
        wgmma_async</*kZeroInit=*/false>(mma_dkv, tdVrP, tdVrdOt(_, _, _, stage), tdVrdV);
      }
      cutlass::arch::NamedBarrier::sync(kNumMmaThreads, static_cast<int>(BwdNamedBarrier::kPdSReady));

      // dQ first, then dK, so that dQ is staged while dK still runs. With dK first, staging began
      // only after every GEMM of the step: the same speed by default, but deterministic mode (its
      // reducer waits for each block's addition) was 4-9 % slower at hdim 128 non-causal.
      Tensor tdQrdQ = partition_fragment_C(mma_dq, DqTileShape{});
      wgmma_async</*kZeroInit=*/true>(mma_dq, tdQrA(_, _, _, buf), tdQrB, tdQrdQ);
      if constexpr (kDvLate == 2) { dv_rest(); }
      wgmma_async</*kZeroInit=*/false>(mma_dkv, tdKrdS, tdKrQt(_, _, _, stage), tdKrdK);
      if constexpr (kDvLate == 1) { dv_rest(); }
      // dQ done, and every part of dV issued before it; dK (and with kDvLate the rest of dV) may
      // still read Q's (dO's) stage until the wait below.
      warpgroup_wait<kDvLate ? 2 : 1>();
      stage_dq(smem, tdQrdQ, progress.steps + step, mma_tidx);
      warpgroup_wait<0>();
      pipeline.consumer_release(state);
      ++state;
    };
    if constexpr (kLocal && kSplitSteps) {
      // The walk (no rotation in causal/local problems: see first_m_block) split into masked
      // and unmasked runs.
      Walk walk(params, range, n_block);
      for (int step = 0; step < num_steps;) {
        for (; step < num_steps && block_needs_mask(walk.m_block * kBlockM, n0, params); ++step, walk.advance()) {
          step_body(step, walk.m_block, std::true_type{});
        }
        for (; step < num_steps && !block_needs_mask(walk.m_block * kBlockM, n0, params); ++step, walk.advance()) {
          step_body(step, walk.m_block, std::false_type{});
        }
      }
    } else {
      Walk walk(params, range, n_block);
      for (int step = 0; step < num_steps; ++step, walk.advance()) {
        int const m_block = walk.m_block;
        if constexpr (kLocal) {
          step_body(step, m_block, block_needs_mask(m_block * kBlockM, n0, params));
        } else {
          step_body(step, m_block, std::false_type{});
        }
      }
    }
    // Persistent: K and V are free for the next tile once the last step's GEMMs are done.
    if (kPersistent && num_steps > 0) { smem.barrier_kv_empty.arrive(); }
    epilogue(params, mma_dkv, tdKrdK, tdVrdV, n_block, head_kv, batch, mma_tidx);
  }

  // Warp 1 of the producer warpgroup: adds each step's dQ block from shared memory into
  // the float32 accumulator with one bulk reduce-add (kDqPerWG: one per warpgroup half, in
  // reduce_dq_per_wg). Deterministic mode takes the block's turn first and waits for the
  // addition to complete before passing the turn on.
  // progress.steps + step is the CTA-wide step (buffers run on across tiles); the caller waits for
  // the last reductions.
  CUTLASS_DEVICE void reduce_dq(Params const& params, SharedStorage& smem, Progress const& progress, bool leader,
                                BwdBlockRange<kBlockM, kBlockN, kLocal> const& range, int num_steps, int n_block,
                                int head_kv, int batch) const {
    Walk walk(params, range, n_block);
    for (int step = 0; step < num_steps; ++step, walk.advance()) {
      int const head = head_kv * params.q_heads_per_kv_head + walk.head_offset;
      int const m_block = walk.m_block;
      int const global_step = progress.steps + step;
      if constexpr (kDqPerWG) {
        reduce_dq_per_wg(params, smem, leader, global_step, head, m_block, n_block, batch);
        continue;
      }
      int const buffer = global_step % kDqStages;
      // The consumers may fill this step's buffer: step - kDqStages, its last reader, has read it
      // (the wait_group.read after the previous step). Signalled when the step is known to exist,
      // so that no arrival is left pending when the CTA's tiles end.
      if (global_step >= kDqStages) {
        cutlass::arch::NamedBarrier::arrive(kNumMmaThreads + 32,
                                            static_cast<int>(BwdNamedBarrier::kDqEmpty0) + buffer);
      }
      int64_t const row_base = (int64_t(batch) * params.heads_q + head) * params.seqlen_q_padded;
      float* const gdq = params.dq_accum + (row_base + int64_t(m_block) * kBlockM) * kHeadDim;
      float const* const sdq = smem.dq.dq.data() + buffer * (kBlockM * kHeadDim);
      cutlass::arch::NamedBarrier::sync(kNumMmaThreads + 32, static_cast<int>(BwdNamedBarrier::kDqFull0) + buffer);
      if (leader) {
        int* const semaphore = params.dq_semaphore != nullptr ? take_dq_turn(params, row_base, m_block, n_block) : nullptr;
        bulk_reduce_add<kBytesDq>(gdq, sdq);
        if (semaphore != nullptr) {
          pass_dq_turn(semaphore);
        } else {
          // All but the newest kDqStages - 1 reductions have read their buffers.
          asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(kDqStages - 1) : "memory");
        }
      }
      __syncwarp();
    }
  }

  // One bulk reduce-add of kBytes from shared memory into the float32 accumulator, committed as a
  // bulk group of its own.
  template <uint32_t kBytes>
  CUTLASS_DEVICE static void bulk_reduce_add(float* gdq, float const* sdq) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
                 :: "l"(gdq), "r"(cute::cast_smem_ptr_to_uint(sdq)), "n"(kBytes) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  }

  // Deterministic mode: wait until dQ block m_block's counter reaches this key block's turn (the
  // reduce-adds after it then see the earlier blocks' additions); returns the counter.
  CUTLASS_DEVICE static int* take_dq_turn(Params const& params, int64_t row_base, int m_block, int n_block) {
    int* const semaphore = params.dq_semaphore + (row_base / kBlockM) + m_block;
    int const turn = dq_turn(m_block, n_block, params);
    while (load_acquire(semaphore) != turn) {}
    asm volatile("fence.proxy.async.global;" ::: "memory");
    return semaphore;
  }

  // Deterministic mode: once this step's reduce-adds are complete, pass the turn on.
  CUTLASS_DEVICE static void pass_dq_turn(int* semaphore) {
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");  // the additions are done
    __threadfence();
    atomicAdd(semaphore, 1);
  }

  // kDqPerWG: the reducer's share of one step. Each warpgroup's half of the block goes to the
  // accumulator as soon as that warpgroup has staged it. Deterministic mode waits for both halves
  // before it takes the block's turn, so that the turn is held no longer than with one buffer.
  CUTLASS_DEVICE void reduce_dq_per_wg(Params const& params, SharedStorage& smem, bool leader, int global_step,
                                       int head, int m_block, int n_block, int batch) const {
    constexpr int kHalf = kBlockM * kHeadDim / 2;
    int64_t const row_base = (int64_t(batch) * params.heads_q + head) * params.seqlen_q_padded;
    float* const gdq = params.dq_accum + (row_base + int64_t(m_block) * kBlockM) * kHeadDim;
    auto reduce_half = [&](int wg) { bulk_reduce_add<kBytesDq / 2>(gdq + wg * kHalf, smem.dq.dq.data() + wg * kHalf); };
    auto full = [](int wg) { return static_cast<int>(BwdNamedBarrier::kDqFull0) + wg; };
    // The previous step's reads of both halves are complete (the wait below): release both at
    // once, so that neither warpgroup waits for the other's staging.
    if (global_step >= 1) {
      CUTLASS_PRAGMA_UNROLL
      for (int wg = 0; wg < 2; ++wg) {
        cutlass::arch::NamedBarrier::arrive(128 + 32, static_cast<int>(BwdNamedBarrier::kDqEmpty0) + wg);
      }
    }
    if (params.dq_semaphore != nullptr) {
      cutlass::arch::NamedBarrier::sync(128 + 32, full(0));
      cutlass::arch::NamedBarrier::sync(128 + 32, full(1));
      if (leader) {
        int* const semaphore = take_dq_turn(params, row_base, m_block, n_block);
        reduce_half(0);
        reduce_half(1);
        pass_dq_turn(semaphore);
      }
    } else {
      CUTLASS_PRAGMA_UNROLL
      for (int wg = 0; wg < 2; ++wg) {
        cutlass::arch::NamedBarrier::sync(128 + 32, full(wg));
        if (leader) { reduce_half(wg); }
        __syncwarp();
      }
      if (leader) { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }  // both halves read
    }
    __syncwarp();
  }

  // The steps' query blocks and query-head offsets, one step at a time: a tile's steps visit its
  // query block range once per query head of the KV head, starting at first_m_block and wrapping.
  // Advancing by one (rather than `step % count` and `step / count`, a run-time division per step
  // in the producer, the reducer and the consumers) measured +0.5-3.5 % causal at hdim 128, 2k-16k.
  struct Walk {
    int lo, hi, first, m_block, head_offset;
    CUTLASS_DEVICE Walk(Params const& params, BwdBlockRange<kBlockM, kBlockN, kLocal> const& range, int n_block)
        : lo(range.m_block_min),
          hi(range.m_block_max),
          first(range.count() > 0 ? first_m_block(params, range, n_block) : range.m_block_min),
          m_block(first),
          head_offset(0) {}
    CUTLASS_DEVICE void advance() {
      m_block = m_block + 1 == hi ? lo : m_block + 1;
      head_offset += m_block == first ? 1 : 0;  // a full round of the range: the next query head
    }
  };

  // The first step's query block. Were every key block's CTA to start at the first query block,
  // all CTAs of a non-causal head would add into the same dQ block at once; so CTA n_block starts
  // at query block n_block (modulo the range) and wraps (measured at hdim 256, 8k: 278 -> 340
  // TFLOP/s; hdim 64 even). Not in causal or windowed problems, whose ranges start at the diagonal
  // already (rotating them measured 2-5 % slower), nor in deterministic mode, whose turns assume
  // the key order. FLASH_BWD_DEV_ROTATE=0 turns it off for comparison.
  CUTLASS_DEVICE static int first_m_block(Params const& params, BwdBlockRange<kBlockM, kBlockN, kLocal> const& range,
                                          int n_block) {
    int index = 0;
#if !defined(FLASH_BWD_DEV_ROTATE) || FLASH_BWD_DEV_ROTATE
    if constexpr (!kLocal) {
      if (params.dq_semaphore == nullptr) { index = n_block % range.count(); }
    }
#endif
    return range.m_block_min + index;
  }

  // Deterministic mode: the turn of key block n_block among those adding into dQ block m_block.
  // Non-causal: ascending key blocks. Causal/windowed: descending key blocks. There CTA n walks
  // its query blocks upward from its diagonal, kBlockN / kBlockM blocks further on than CTA n - 1
  // (two at hdim 128, one at hdim 64); in ascending order CTA n would wait on every block for CTA
  // n - 1, which reaches it that many steps later: a wavefront (measured 0.50-0.57x of cuDNN at
  // hdim 128 causal 2k/8k). In
  // descending order each CTA waits for CTAs that got there first (measured 0.79-0.91x, within
  // 3-5 % of the non-deterministic kernel). Query block m's last key block holds key
  // (m + 1) * kBlockM - 1 + diag + right. Its CTAs wait on higher key blocks, so those launch
  // first (key_block_of_cta), or a head with more CTAs than fit on the GPU at once could deadlock.
  // tests/host/schedule_checks.cu checks, on random shapes, windows and both alignments, that
  // the turns of each dQ block's key blocks are 0..k-1 in this order.
  static constexpr bool kDetDescending = kLocal;

  CUTLASS_HOST_DEVICE static int dq_turn(int m_block, int n_block, Params const& params) {
    if constexpr (kDetDescending) {
      int const num_n_blocks = (params.seqlen_k + kBlockN - 1) / kBlockN;
      int const last = min(num_n_blocks - 1,
                           floor_div((m_block + 1) * kBlockM - 1 + params.diag_offset + params.window_right, kBlockN));
      return last - n_block;
    } else {
      return n_block;
    }
  }

  // The key block of this CTA: blockIdx.x, reversed in deterministic descending mode so that the
  // key blocks a CTA waits for were launched before it.
  CUTLASS_DEVICE static int key_block_of_cta(Params const& params) {
    if constexpr (kDetDescending) {
      if (params.dq_semaphore != nullptr) { return int(gridDim.x) - 1 - int(blockIdx.x); }
    }
    return blockIdx.x;
  }

  // Whether the mask hides a key of a step's (key block n0, query block m0) from a query, given
  // their offsets in the blocks: x = key - diag_key is > window_right or < -window_left, i.e.
  // x + window_left, taken as unsigned, exceeds window_left + window_right (both windows lie in
  // [0, seqlen_q + seqlen_k]). One add and one compare per element: against cuDNN, hdim 128 causal
  // at 512 / 2k / 8k, 1.001 / 1.017 / 1.008 -> 1.015 / 1.028 / 1.017 (two compares before).
  struct StepMask {
    uint32_t base, width;
    CUTLASS_DEVICE StepMask(Params const& params, int n0, int m0)
        : base(uint32_t(n0 - m0 - params.diag_offset + params.window_left)),
          width(uint32_t(params.window_left) + uint32_t(params.window_right)) {}
    CUTLASS_DEVICE bool hides(int key_offset, int query_offset) const {
      return base + uint32_t(key_offset - query_offset) > width;
    }
  };

  // Whether the (query block m0, key block n0) tile crosses a window edge (causal diagonal
  // included), so that its elements need the mask.
  CUTLASS_DEVICE static bool block_needs_mask(int m0, int n0, Params const& params) {
    return kLocal && (n0 + kBlockN - 1 > m0 + params.diag_offset + params.window_right ||
                      n0 < m0 + kBlockM - 1 + params.diag_offset - params.window_left);
  }

  CUTLASS_DEVICE static int load_acquire(int const* ptr) {
    int value;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(value) : "l"(ptr) : "memory");
    return value;
  }

  // dK (scaled) and dV from registers: each quad of lanes trades pieces so that every lane stores
  // a whole 16-byte chunk, a quad 64 contiguous bytes of a row (the accumulator's own layout gave
  // 4-byte pieces of 8 rows per store instruction). Rows past seqlen_k and columns past the real
  // head dim are dropped. dk and dv are allocated by the binding (contiguous, rows 16-byte
  // aligned). A CTA that no query sees writes zeros.
  template <typename TensorAcc>
  CUTLASS_DEVICE void epilogue(Params const& params, TiledMmadKV const& mma_dkv, TensorAcc& tdKrdK,
                               TensorAcc& tdVrdV, int n_block, int head_kv, int batch, int mma_tidx) const {
    auto thr_dkv = mma_dkv.get_thread_slice(mma_tidx);
    Tensor tc = thr_dkv.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
    Tensor tc_rc = make_tensor(tc.data(), acc_layout_rowcol(tc.layout()));
    Tensor dk_rc = make_tensor(tdKrdK.data(), acc_layout_rowcol(tdKrdK.layout()));
    Tensor dv_rc = make_tensor(tdVrdV.data(), acc_layout_rowcol(tdVrdV.layout()));
    constexpr int kCols = decltype(size<1>(dk_rc))::value;
    static_assert(kCols % 8 == 0, "groups of 4 chunks of 8 columns per row");
    int const lane_in_quad = mma_tidx % 4;
    int const n0 = n_block * kBlockN;
    int64_t const row_stride = int64_t(params.heads_kv) * params.head_dim;  // dk, dv are contiguous
    int64_t const base = (int64_t(batch) * params.seqlen_k) * row_stride + int64_t(head_kv) * params.head_dim;
    auto pack = [](float x, float y) {
      Element pair[2] = {Element(x), Element(y)};
      return *reinterpret_cast<uint32_t*>(pair);
    };
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < size<0>(dk_rc); ++r) {
      int const key = n0 + get<0>(tc_rc(r, 0));
      CUTLASS_PRAGMA_UNROLL
      for (int g = 0; g < kCols; g += 8) {
        uint32_t dk_words[4], dv_words[4];
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < 4; ++k) {
          dk_words[k] = pack(dk_rc(r, g + 2 * k) * params.softmax_scale, dk_rc(r, g + 2 * k + 1) * params.softmax_scale);
          dv_words[k] = pack(dv_rc(r, g + 2 * k), dv_rc(r, g + 2 * k + 1));
        }
        uint4 const dk_chunk = quad_transpose(dk_words, lane_in_quad);
        uint4 const dv_chunk = quad_transpose(dv_words, lane_in_quad);
        // Column g of this thread is 2 * lane_in_quad into the group's first chunk.
        int const col = get<1>(tc_rc(r, g)) - 2 * lane_in_quad + 8 * lane_in_quad;
        if (key < params.seqlen_k && col < params.head_dim) {  // head dims are multiples of 8
          int64_t const offset = base + int64_t(key) * row_stride + col;
          *reinterpret_cast<uint4*>(params.dk + offset) = dk_chunk;
          *reinterpret_cast<uint4*>(params.dv + offset) = dv_chunk;
        }
      }
    }
  }
};

template <typename Kernel>
__global__ void __launch_bounds__(Kernel::kNumThreads, 1)
    flash_bwd_kernel(CUTE_GRID_CONSTANT typename Kernel::Params const params) {
  extern __shared__ __align__(1024) char smem_buf[];
  Kernel{}(params, smem_buf);
}

}  // namespace flash
