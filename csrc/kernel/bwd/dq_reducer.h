// The backward's dQ path. Consumers stage each step's dQ block in shared memory in their
// accumulator's register order (stage); warp 1 of the producer warpgroup, the reducer, adds it to
// the float32 accumulator with bulk reduce-adds (cp.reduce.async.bulk; one per block, or per
// warpgroup half with kDqPerWG), so the accumulator holds each block in that order
// (dq_staged_offset), which the dQ postprocess kernel (prepost.h) undoes. Deterministic mode
// orders the additions into each dQ block with a counter per block (dq_turn) [D:030, D:032].
#pragma once

#include "kernel/common/config.h"

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>

#include "kernel/bwd/mainloop.h"
#include "kernel/bwd/shared_storage.h"
#include "kernel/common/block_range.h"
#include "kernel/common/named_barriers.h"
#include "kernel/common/tile_scheduler.h"
#include "kernel/common/utils.h"

namespace flash {

using namespace cute;

template <typename Policy>
struct BwdDqReducer {
  using Element = typename Policy::Element;
  static constexpr int kHeadDim = Policy::kHeadDim;
  static constexpr int kBlockM = Policy::kBlockM;
  static constexpr int kBlockN = Policy::kBlockN;
  static constexpr bool kLocal = Policy::kLocal;
  static constexpr bool kDqPerWG = Policy::kDqPerWG;
  static constexpr int kDqStages = BwdSmem<Policy>::kDqStages;
  static_assert(kDqStages == 1 || kDqStages == 2);
  static_assert(!kDqPerWG || kDqStages == 1, "per-warpgroup dQ staging uses the barrier ids of two buffers");
  using Mainloop = BwdMainloop<Policy>;
  using SharedStorage = typename Mainloop::SharedStorage;
  using Range = typename Mainloop::Range;
  using Walk = typename Mainloop::Walk;
  using Scheduler = BwdTileScheduler<kBlockM, kBlockN, kLocal, Policy::kPersistent, Policy::kDynamic, Policy::kVarlen>;
  static constexpr int kNumMmaThreads = Mainloop::kNumMmaThreads;
  static constexpr uint32_t kBytesDq = kBlockM * kHeadDim * sizeof(float);

  // One dQ block in shared memory (and in the float32 accumulator): the accumulator's elements in
  // pairs, pair j of consumer thread t at pair index j * threads + t (kDqPerWG: warpgroup w's half
  // of the block first, pair j of its thread u at j * 128 + u within it), so that each store is one
  // conflict-free 8-byte store [D:030].
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

  // Consumers: dQ of one step to staging buffer step % kDqStages, in register order (dq_staged_offset),
  // for the reducer warp; first wait until it has read what that buffer held. kDqPerWG: one
  // buffer, each warpgroup writing its own half under its own barrier pair (128 + 32 threads).
  template <typename TensorAcc>
  CUTLASS_DEVICE void stage(SharedStorage& smem, TensorAcc const& tdQrdQ, int step, int mma_tidx) const {
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

  // Warp 1 of the producer warpgroup: adds each step's dQ block from shared memory into
  // the float32 accumulator with one bulk reduce-add (kDqPerWG: one per warpgroup half, in
  // reduce_per_wg). Deterministic mode takes the block's turn first and waits for the
  // addition to complete before passing the turn on.
  // progress.steps + step is the CTA-wide step (buffers run on across tiles); the caller waits for
  // the last reductions.
  template <typename Params, typename Seq>
  CUTLASS_DEVICE void reduce(Params const& params, Seq const& seq, SharedStorage& smem, BwdProgress const& progress,
                             bool leader, Range const& range, int num_steps, int n_block, int head_kv,
                             int batch) const {
    Walk walk(params, range, n_block);
    for (int step = 0; step < num_steps; ++step, walk.advance()) {
      int const head = head_kv * params.q_heads_per_kv_head + walk.head_offset;
      int const m_block = walk.m_block;
      int const global_step = progress.steps + step;
      if constexpr (kDqPerWG) {
        reduce_per_wg(params, seq, smem, leader, global_step, head, m_block, n_block, batch);
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
      int64_t const row_base = Mainloop::row_base(params, seq, batch, head);
      float* const gdq = params.dq_accum + (row_base + int64_t(m_block) * kBlockM) * kHeadDim;
      float const* const sdq = smem.dq.dq.data() + buffer * (kBlockM * kHeadDim);
      cutlass::arch::NamedBarrier::sync(kNumMmaThreads + 32, static_cast<int>(BwdNamedBarrier::kDqFull0) + buffer);
      if (leader) {
        int* const semaphore = params.dq_semaphore != nullptr ? take_dq_turn(params, seq, row_base, m_block, n_block)
                                                             : nullptr;
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
  template <typename Params, typename Seq>
  CUTLASS_DEVICE static int* take_dq_turn(Params const& params, Seq const& seq, int64_t row_base, int m_block,
                                          int n_block) {
    int* const semaphore = params.dq_semaphore + (row_base / kBlockM) + m_block;
    int const turn = dq_turn(m_block, n_block, seq.seqlen_k(params), seq.diag(params), params.window_right);
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
  template <typename Params, typename Seq>
  CUTLASS_DEVICE void reduce_per_wg(Params const& params, Seq const& seq, SharedStorage& smem, bool leader,
                                    int global_step,
                                    int head, int m_block, int n_block, int batch) const {
    constexpr int kHalf = kBlockM * kHeadDim / 2;
    int64_t const row_base = Mainloop::row_base(params, seq, batch, head);
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
        int* const semaphore = take_dq_turn(params, seq, row_base, m_block, n_block);
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

  // Deterministic mode: the turn of key block n_block among those adding into dQ block m_block.
  // Non-causal: ascending key blocks. Causal/windowed: descending key blocks. There CTA n walks
  // its query blocks upward from its diagonal, kBlockN / kBlockM blocks further on than CTA n - 1
  // (two at hdim 128, one at hdim 64); in ascending order CTA n would wait on every block for CTA
  // n - 1, which reaches it that many steps later: a wavefront. In descending order each CTA waits
  // for CTAs that got there first [D:032]. Query block m's last key block holds key
  // (m + 1) * kBlockM - 1 + diag + right. Its CTAs wait on higher key blocks, so those launch
  // first (tile_scheduler.h, key_block_of_cta), or a head with more CTAs than fit on the GPU at
  // once could deadlock. Varlen: the same per sequence.
  // tests/host/schedule_checks.cu checks, on random shapes, windows and both alignments, that
  // the turns of each dQ block's key blocks are 0..k-1 in this order.
  static constexpr bool kDetDescending = Scheduler::kDetDescending;

  CUTLASS_HOST_DEVICE static int dq_turn(int m_block, int n_block, int seqlen_k, int diag, int window_right) {
    if constexpr (kDetDescending) {
      int const num_n_blocks = (seqlen_k + kBlockN - 1) / kBlockN;
      int const last = min(num_n_blocks - 1, floor_div((m_block + 1) * kBlockM - 1 + diag + window_right, kBlockN));
      return last - n_block;
    } else {
      return n_block;
    }
  }
  template <typename Params>  // dense problems (the host checks)
  CUTLASS_HOST_DEVICE static int dq_turn(int m_block, int n_block, Params const& params) {
    return dq_turn(m_block, n_block, params.seqlen_k, params.diag_offset, params.window_right);
  }
};

}  // namespace flash
