// The SM90 backward kernel shell: one CTA owns kBlockN keys of one KV head (one tile; persistent:
// a stride or a counter's worth of tiles) and loops over every (query head of its group, query
// block) that sees them, accumulating dK and dV in registers and adding each query block's dQ
// contribution into a float32 buffer.
//
// Warpgroup 0: warp 0 is the producer (TMA loads, mainloop.h; in dynamic kernels it also draws the
// tiles), warp 1 the dQ reducer (dq_reducer.h). Two consumer warpgroups run the step loops
// (mainloop_rs.h / mainloop_ss.h) and the dK / dV epilogue. docs/architecture.md walks one step
// through the files.
#pragma once

#include "kernel/common/config.h"

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "kernel/bwd/dq_reducer.h"
#include "kernel/bwd/epilogue.h"
#include "kernel/bwd/mainloop.h"
#include "kernel/bwd/mainloop_rs.h"
#include "kernel/bwd/mainloop_ss.h"
#include "kernel/bwd/shared_storage.h"
#include "kernel/common/named_barriers.h"
#include "kernel/common/policy.h"
#include "kernel/common/seqlen.h"
#include "kernel/common/tile_scheduler.h"
#include "kernel/common/utils.h"

namespace flash {

using namespace cute;

template <typename Policy_>
struct BwdKernel {
  using Policy = Policy_;
  using Element = typename Policy::Element;
  static constexpr int kHeadDim = Policy::kHeadDim;
  static constexpr int kBlockM = Policy::kBlockM;
  static constexpr int kBlockN = Policy::kBlockN;
  static constexpr bool kLocal = Policy::kLocal;
  static constexpr bool kPersistent = Policy::kPersistent;
  static constexpr bool kDynamic = Policy::kDynamic;

  using Mainloop = BwdMainloop<Policy>;
  using DqReducer = BwdDqReducer<Policy>;
  using Epilogue = BwdEpilogue<Policy, typename Mainloop::TiledMmadKV>;
  static constexpr bool kVarlen = Policy::kVarlen;
  using Scheduler = BwdTileScheduler<kBlockM, kBlockN, kLocal, kPersistent, kDynamic, kVarlen>;
  using Tile = typename Scheduler::Tile;
  using SharedStorage = typename Mainloop::SharedStorage;
  using Pipeline = typename Mainloop::Pipeline;
  using PipelineState = typename Mainloop::PipelineState;
  using ShapeQKV = typename Mainloop::ShapeQKV;
  using SmemLayoutQ = typename Mainloop::SmemLayoutQ;
  using SmemLayoutK = typename Mainloop::SmemLayoutK;
  using TiledMmadQ = typename Mainloop::TiledMmadQ;  // the dQ postprocess kernel undoes its order
  using DqTileShape = typename Mainloop::DqTileShape;
  static constexpr int kDqAccPerThread = DqReducer::kDqAccPerThread;
  CUTLASS_HOST_DEVICE static constexpr int dq_staged_offset(int i, int t) { return DqReducer::dq_staged_offset(i, t); }

  static constexpr int kNumMmaWarpGroups = Mainloop::kNumMmaWarpGroups;
  static constexpr int kNumMmaThreads = Mainloop::kNumMmaThreads;
  static constexpr int kNumThreads = kNumMmaThreads + 128;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static_assert(kProducerRegs * 128 + kConsumerRegs * kNumMmaThreads <= launch_register_pool(kNumThreads, 1),
                "setmaxnreg.inc would wait forever for registers the CTA does not hold");
  static constexpr int kSharedStorageSize = sizeof(SharedStorage);

  struct Params {
    typename Mainloop::TmaQ tma_q;
    typename Mainloop::TmaQ tma_do;
    typename Mainloop::TmaK tma_k;
    typename Mainloop::TmaK tma_v;
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
    [[no_unique_address]] std::conditional_t<kVarlen, VarlenArgs, NoVarlen> varlen;
    float softcap_prescale;  // kSoftcap: BwdParams
    int head_dim_v;  // kNarrowV: v's, dO's and dv's (<= head_dim; the descriptors zero-fill the rest)
  };

  CUTLASS_DEVICE void operator()(Params const& params, char* smem_buf) const {
    if (Scheduler::cta_past_its_keys(params)) { return; }
    SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_buf);
    int const warp_group_idx = cutlass::canonical_warp_group_idx();
    int const warp_idx_in_wg = cutlass::canonical_warp_idx_sync() % 4;
    bool const lane_predicate = cute::elect_one_sync();

    if (warp_group_idx == int(WarpGroupRole::kProducer) && warp_idx_in_wg == 0 && lane_predicate) {
      cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_do.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
      smem.barrier_kv.init(/*arrive_count=*/1);
      smem.barrier_kv_empty.init(/*arrive_count=*/kNumMmaThreads);
      if constexpr (kDynamic) { smem.ring.init(kNumMmaThreads + 32); }
    }
    typename Pipeline::Params pipeline_params;
    // Q, dO, LSE2, D of one query block (kSplitQdO: Q and LSE2 here, dO and D in pipeline_do)
    pipeline_params.transaction_bytes = Mainloop::kSplitQdO ? Mainloop::kBytesQ + Mainloop::kBytesRow
                                                             : 2 * Mainloop::kBytesQ + 2 * Mainloop::kBytesRow;
    bool const producer = warp_group_idx == int(WarpGroupRole::kProducer);
    pipeline_params.role = producer ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
    pipeline_params.is_leader = threadIdx.x == 0;
    pipeline_params.num_consumers = kNumMmaThreads;
    Pipeline pipeline(smem.pipeline_qdo, pipeline_params, Shape<_1, _1, _1>{});
    Pipeline pipeline_do(smem.pipeline_do, pipeline_params, Shape<_1, _1, _1>{});  // used with kSplitQdO
    __syncthreads();

    Mainloop const mainloop;
    DqReducer const dq;
    Epilogue const epilogue;

    // Every role walks the same tiles; Progress counts the steps and K/V loads before each tile
    // (the dQ staging buffers, the dS^T buffers and the K/V barrier phases run on across tiles).
    if (warp_group_idx == int(WarpGroupRole::kProducer)) {
      cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
      // One thread issues the loads (varlen persistent kernels: its whole warp walks the tiles).
      if (warp_idx_in_wg == int(ProducerWarpRole::kLoad) && (Scheduler::kCompact || lane_predicate)) {
        PipelineState state = cutlass::make_producer_start_state<Pipeline>();
        Scheduler::template for_each_tile</*kDraws=*/true>(params, smem, [&](Tile const& tile, auto const& seq,
                                                                              BwdProgress const& pr) {
          if (Scheduler::kCompact && !lane_predicate) { return; }
          mainloop.load(params, seq, smem, pipeline, pipeline_do, state, pr, tile.range, tile.num_steps, tile.n_block,
                        tile.head_kv, tile.batch);
        });
      }
      if (warp_idx_in_wg == int(ProducerWarpRole::kDqReducer)) {
        bool const leader = cute::elect_one_sync();
        Scheduler::template for_each_tile</*kDraws=*/false>(params, smem, [&](Tile const& tile, auto const& seq,
                                                                               BwdProgress const& pr) {
          dq.reduce(params, seq, smem, pr, leader, tile.range, tile.num_steps, tile.n_block, tile.head_kv, tile.batch);
        });
        if (leader) { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
      }
    } else {
      cutlass::arch::warpgroup_reg_alloc<kConsumerRegs>();
      PipelineState state;
      Scheduler::template for_each_tile</*kDraws=*/false>(params, smem, [&](Tile const& tile, auto const& seq,
                                                                             BwdProgress const& pr) {
        if constexpr (Policy::kRS) {
          mainloop.mma_rs(params, seq, smem, pipeline, state, pr, tile.range, tile.num_steps, tile.n_block,
                          tile.head_kv, tile.batch, threadIdx.x - 128, dq, epilogue);
        } else {
          mainloop.mma_ss(params, seq, smem, pipeline, pipeline_do, state, pr, tile.range, tile.num_steps,
                          tile.n_block, tile.head_kv, tile.batch, threadIdx.x - 128, dq, epilogue);
        }
      });
    }
  }
};

// The kernel of (head dim, dtype, mask, mode, varlen, softcap): the tile and choices of policy.h.
template <int kHeadDim, typename Element, bool kLocal, bool kDeterministic, bool kVarlen = false,
          bool kSoftcap = false>
using BwdKernelFor = BwdKernel<BwdPolicyFor<kHeadDim, Element, kLocal, kDeterministic, kVarlen, kSoftcap>>;

template <typename Kernel>
__global__ void __launch_bounds__(Kernel::kNumThreads, 1)
    flash_bwd_kernel(CUTE_GRID_CONSTANT typename Kernel::Params const params) {
  extern __shared__ __align__(1024) char smem_buf[];
  Kernel{}(params, smem_buf);
}

}  // namespace flash
