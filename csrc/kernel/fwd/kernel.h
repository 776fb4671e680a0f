// The SM90 forward kernel shell: one CTA computes O and LSE for kBlockM query rows of one head per
// tile, one tile (or, persistent, a stride or a counter's worth of tiles) per CTA.
//
// Warpgroup 0 is the producer: after giving registers back (setmaxnreg), one elected thread issues
// the TMA loads of the mainloop (Q once per tile, K/V blocks through a kStages pipeline) and, in
// dynamic kernels, draws the tiles and hands them to the consumers through a ring in shared
// memory. Warpgroups 1..kBlockM/64 are consumers: each owns 64 query rows, runs the mainloop's
// GEMMs and softmax and then the epilogue. docs/architecture.md walks one tile through the files.
#pragma once

#include "kernel/common/config.h"

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "kernel/common/block_range.h"
#include "kernel/common/named_barriers.h"
#include "kernel/common/policy.h"
#include "kernel/common/seqlen.h"
#include "kernel/common/tile_scheduler.h"
#include "kernel/common/trace.h"
#include "kernel/common/utils.h"
#include "kernel/fwd/epilogue.h"
#include "kernel/fwd/mainloop.h"
#include "kernel/fwd/mainloop_fp8.h"
#include "kernel/fwd/mainloop_qv.h"
#include "kernel/fwd/paged_kv.h"
#include "kernel/fwd/shared_storage.h"

namespace flash {

using namespace cute;

// dv != d kernels: V's global shape (rows, dv, heads_kv, batch) and O's (rows, dv, heads_q, batch).
template <typename Shape_>
struct ValueShapes {
  Shape_ v, o;
};
struct NoValueShapes {};

template <typename Policy_>
struct FwdKernel {
  using Policy = Policy_;
  using Element = typename Policy::Element;
  static constexpr int kHeadDim = Policy::kHeadDim;
  static constexpr int kHeadDimV = Policy::kHeadDimV;
  static constexpr int kBlockM = Policy::kBlockM;
  static constexpr int kBlockN = Policy::kBlockN;
  static constexpr bool kLocal = Policy::kLocal;
  static constexpr bool kDynamic = Policy::kDynamic;
  static constexpr bool kDirectO = Policy::kDirectO;
  static constexpr bool kRingDecode = Policy::kRingDecode;
  static constexpr bool kVarlen = Policy::kVarlen;
  // Varlen persistent kernels: the producer's whole warp finds each tile, one lane reads its
  // sequence's extent, hands both to the consumers through the ring (they read no cu_seqlens on
  // their path) and loads it.
  static constexpr bool kCompact = Policy::kCompact;
  using Walk = VarlenTileWalk<kBlockM, kLocal ? WalkOrder::kHeavyFirst : WalkOrder::kBlocksFastest>;
  static constexpr bool kPaged = Policy::kPaged;
  // FP8: the whole producer warpgroup transposes V (mainloop_fp8.h) for the consumers' V^T pipeline.
  static constexpr bool kFp8 = Policy::kFp8;

  using Mainloop = std::conditional_t<Policy::kWideV, FwdQvMainloop<Policy>, FwdMainloop<Policy>>;
  using Epilogue = FwdEpilogue<Policy, typename Mainloop::TiledMmaPV>;
  using Scheduler = FwdTileScheduler<Policy::kPersistent, kLocal>;
  using SharedStorage = FwdSharedStorage<Policy>;
  using Layouts = FwdSmemLayouts<Policy>;
  using SmemLayoutQ = typename Layouts::SmemLayoutQ;
  using SmemLayoutKV = typename Layouts::SmemLayoutKV;
  using SmemLayoutV = typename Layouts::SmemLayoutV;
  using SmemLayoutO64 = typename Layouts::SmemLayoutO64;
  using ShapeQKV = typename Mainloop::ShapeQKV;
  using Pipeline = typename Mainloop::Pipeline;
  using PipelineState = typename Mainloop::PipelineState;

  static constexpr int kNumMmaWarpGroups = Mainloop::kNumMmaWarpGroups;
  static constexpr int kNumMmaThreads = 128 * kNumMmaWarpGroups;
  static constexpr int kNumThreads = kNumMmaThreads + 128;

  static_assert(!(kPaged || kFp8) || !kCompact, "all producer threads walk the same tiles");
  static_assert(!kPaged || !kDynamic, "paged kernels are one CTA per tile");

  static constexpr int kSharedStorageSize = sizeof(SharedStorage);
  static_assert(kSharedStorageSize <= 227 * 1024, "tile does not fit in shared memory");

  // setmaxnreg budgets: the producer keeps the minimum, the consumers share the rest of the CTA's
  // launch pool (launch_register_pool: 168 x 384 with two consumer warpgroups, 64K with three). A
  // consumer's count must not be below what the kernel starts with, since setmaxnreg.inc may
  // only raise it. Paged kernels' producers compute row addresses and FP8 ones up to hdim 128
  // transpose V: 40 registers (32 beside three consumer warpgroups); past hdim 128 the FP8
  // consumers' O takes 240.
  static constexpr bool kWideProducer = kPaged || (kFp8 && kHeadDimV <= 128);
  static constexpr int kProducerRegs = kNumMmaWarpGroups == 3 ? 32 : kWideProducer ? 40 : 24;
  static constexpr int kConsumerRegs = kNumMmaWarpGroups == 3 ? 160 : kWideProducer ? 232 : 240;
  static_assert(!kPaged || kNumMmaWarpGroups == 2, "paged kernels have two consumer warpgroups");
  static_assert(kProducerRegs * 128 + kConsumerRegs * kNumMmaThreads <= launch_register_pool(kNumThreads, 1),
                "setmaxnreg.inc would wait forever for registers the CTA does not hold");
  static_assert(kConsumerRegs >= 64 * 1024 / kNumThreads, "consumers would start above their setmaxnreg count");

  struct Params {
    typename Mainloop::TmaQ tma_q;
    typename Mainloop::TmaKV tma_k;
    typename Mainloop::TmaV tma_v;
    typename Epilogue::TmaO tma_o;
    ShapeQKV shape_q;
    ShapeQKV shape_k;
    float* lse;  // (batch, heads_q, seqlen_q)
    int seqlen_q;
    int seqlen_k;
    int heads_q;
    int q_heads_per_kv_head;
    int num_m_blocks;
    int batch;
    int diag_offset;  // local attention (kLocal): see FwdParams
    int window_left;
    int window_right;
    float lse_scale;           // the row max's factor in the LSE: softmax_scale, or softcap
    float softmax_scale_log2;  // FwdParams
    int heads_per_group;  // persistent causal/local order: (batch x head)s walked together (tile_scheduler.h)
    int* tile_counter;    // kDynamic: zeroed before the launch
    typename Scheduler::Divisors divisors;
    [[no_unique_address]] typename Epilogue::DirectO direct_o;
    [[no_unique_address]] std::conditional_t<kVarlen, VarlenArgs, NoVarlen> varlen;
    float softcap_prescale;  // kSoftcap: FwdParams
    float const* sink;       // FwdParams
    [[no_unique_address]] std::conditional_t<Policy::kSplit, SplitArgs, NoSplit> split;
    [[no_unique_address]] std::conditional_t<kPaged, PagedKVParams, NoPagedKV> paged;
    // dv != d: V's and O's global shapes (else K's and Q's).
    [[no_unique_address]] std::conditional_t<Policy::kHeadDimV != kHeadDim, ValueShapes<ShapeQKV>, NoValueShapes> shapes_v;
    [[no_unique_address]] typename Mainloop::QvArgs qv;  // kWideV: Qv's TMA and shape
    [[no_unique_address]] std::conditional_t<kFp8, Fp8Args, NoFp8> fp8;  // kFp8: the descales
  };
  using Seq = SeqLenFor<kVarlen, Params>;  // a tile's sequence: its extent and offsets

  // The stages P.V reads: V's, or (kFp8) V^T's.
  template <typename PipelineV, typename PipelineVt>
  CUTLASS_DEVICE static auto& pv_pipeline(PipelineV& v, PipelineVt& vt) {
    if constexpr (kFp8) { return vt; } else { return v; }
  }

  CUTLASS_DEVICE static int split_count(Params const& params) {
    if constexpr (Policy::kSplit) {
      return params.split.num_splits;
    } else {
      return 1;
    }
  }

  CUTLASS_DEVICE void operator()(Params const& params, char* smem_buf) const {
    SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_buf);
    int const warp_group_idx = cutlass::canonical_warp_group_idx();
    int const warp_idx_in_wg = cutlass::canonical_warp_idx_sync() % 4;
    bool const lane_predicate = cute::elect_one_sync();

    if (warp_group_idx == int(WarpGroupRole::kProducer) && warp_idx_in_wg == 0 && lane_predicate) {
      cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_o.get_tma_descriptor());
      if constexpr (Policy::kWideV) { cute::prefetch_tma_descriptor(params.qv.tma.get_tma_descriptor()); }
      smem.barrier_q.init(/*arrive_count=*/1);
      smem.barrier_q_empty.init(/*arrive_count=*/kNumMmaWarpGroups);
      if constexpr (Policy::kSeparateO) {
        smem.o.barrier_q2.init(/*arrive_count=*/1);
        smem.o.barrier_q2_empty.init(/*arrive_count=*/kNumMmaWarpGroups);
      }
      // FP8: the producer warpgroup's other 127 threads read each drawn tile too.
      if constexpr (Policy::kRing) { smem.ring.init(kNumMmaThreads + (kFp8 ? 127 : 0)); }
    }
    typename Pipeline::Params pipeline_params;
    pipeline_params.transaction_bytes = Mainloop::kBytesKV;
    bool const producer = warp_group_idx == int(WarpGroupRole::kProducer);
    pipeline_params.role = producer ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
    pipeline_params.is_leader = threadIdx.x == 0;
    pipeline_params.num_consumers = kNumMmaThreads;
    Pipeline pipeline_k(smem.pipeline_k, pipeline_params, Shape<_1, _1, _1>{});
    if constexpr (Mainloop::kBytesV != Mainloop::kBytesKV) { pipeline_params.transaction_bytes = Mainloop::kBytesV; }
    if constexpr (kFp8) { pipeline_params.num_consumers = 128; }  // V's stages are read by the producer warpgroup
    Pipeline pipeline_v(smem.pipeline_v, pipeline_params, Shape<_1, _1, _1>{});
    // kFp8: V^T's stages, written by the producer warpgroup, read by the consumers.
    auto pipeline_vt = [&] {
      if constexpr (kFp8) {
        typename CpAsyncPipeline<Policy::kStages>::Params vt_params;
        vt_params.role = producer ? CpAsyncPipeline<Policy::kStages>::ThreadCategory::Producer
                                  : CpAsyncPipeline<Policy::kStages>::ThreadCategory::Consumer;
        vt_params.num_consumers = kNumMmaThreads;
        return CpAsyncPipeline<Policy::kStages>(smem.vt.pipeline, vt_params, Shape<_1, _1, _1>{});
      } else {
        return NoFp8{};
      }
    }();
    FLASH_TRACE_INIT();
    __syncthreads();  // barriers initialised before anyone waits on them

    Mainloop const mainloop;
    // kSplit: the grid's batch coordinate is batch * num_splits + split.
    Scheduler const scheduler(params.num_m_blocks, params.heads_q,
                              Policy::kSplit ? params.batch * split_count(params) : params.batch,
                              params.heads_per_group);
    auto decoded = [&](auto const& tile) {
      if constexpr (std::is_same_v<std::decay_t<decltype(tile)>, FwdTile>) {
        return tile;
      } else if constexpr (std::is_same_v<std::decay_t<decltype(tile)>, CompactTile>) {
        return tile.tile;
      } else {
        FwdTile t = scheduler.decode(tile, params.divisors);
        if constexpr (Policy::kSplit) { t.batch /= split_count(params); }
        return t;
      }
    };
    // The tile's sequence: handed on with it (kCompact), else read here.
    auto seq_of = [&](auto const& tile, FwdTile const& t) {
      if constexpr (std::is_same_v<std::decay_t<decltype(tile)>, CompactTile>) {
        return Seq(tile.seq);
      } else {
        return Seq(params, t.batch);
      }
    };
    auto split_of = [&](auto const& tile) {
      if constexpr (Policy::kSplit) {
        return scheduler.decode(tile, params.divisors).batch % split_count(params);
      } else {
        return 0;
      }
    };
    auto range_of = [&](FwdTile const& t, Seq const& seq, int split) {
      BlockRange<kBlockM, kBlockN, kLocal> range(t.m_block, seq.seqlen_q(params), seq.seqlen_k(params), seq.diag(params),
                                                 params.window_left, params.window_right);
      // Varlen: the grid covers the longest sequence; a tile past its own sequence's end is empty.
      if constexpr (kVarlen) {
        if (t.m_block * kBlockM >= seq.seqlen_q(params)) { range.n_block_max = range.n_block_min; }
      }
      if constexpr (Policy::kSplit) { range.keep_split(split, split_count(params)); }
      return range;
    };

    if (warp_group_idx == int(WarpGroupRole::kProducer)) {
      cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
      // One thread issues the TMA loads (compact kernels: its whole warp walks the tiles); paged
      // kernels' K/V copies take the whole warpgroup.
      if (kPaged || kFp8 || (warp_idx_in_wg == int(ProducerWarpRole::kLoad) && (kCompact || lane_predicate))) {
        PipelineState state_k = cutlass::make_producer_start_state<Pipeline>();
        PipelineState state_v = cutlass::make_producer_start_state<Pipeline>();
        int fp8_blocks = 0;  // kFp8: K / V blocks loaded so far (load_fp8)
        // Which release of the Q buffer to wait for before loading Q (-1: none). Without
        // kEarlyQ every tile releases it (a tile with nothing to attend writes its zero O
        // there too); with it only tiles that loaded Q do, so Q loads and releases pair up.
        int q_loads = 0;
        auto produce = [&](auto const& tile, int iteration) {  // a tile id, (kRingDecode) a decoded tile, (kCompact) a walked one
          FwdTile const t = decoded(tile);
          Seq const seq = seq_of(tile, t);
          auto const range = range_of(t, seq, split_of(tile));
          // kSeparateO: load k into Q slot k % 2 waits for that slot's release number k / 2 - 1.
          int const wait_phase = Policy::kSeparateO ? (q_loads > 1 ? ((q_loads >> 1) - 1) & 1 : -1)
                                 : Policy::kEarlyQ  ? (q_loads > 0 ? (q_loads - 1) & 1 : -1)
                                                    : (iteration > 0 ? (iteration - 1) & 1 : -1);
          if (range.empty()) {  // nothing to load: consumers write zeros
            if (!Policy::kEarlyQ && wait_phase >= 0) { smem.barrier_q_empty.wait(wait_phase); }
            return;
          }
          if constexpr (kFp8) {
            mainloop.load_fp8(params, seq, smem, pipeline_k, pipeline_v, pipeline_vt, fp8_blocks, t,
                              range, wait_phase, 0);
          } else {
            mainloop.load(params, seq, smem, pipeline_k, pipeline_v, state_k, state_v, t, range, wait_phase,
                          Policy::kSeparateO ? q_loads & 1 : 0);
          }
          ++q_loads;
        };
        if constexpr (kCompact) {
          int const leader = __ffs(__ballot_sync(0xffffffffu, lane_predicate)) - 1;
          Walk walk;
          // Causal/local: a sequence's heads in groups whose K/V fit in L2 together, as the dense
          // counter's order (params.heads_per_group, from the longest key length).
          if constexpr (kLocal) { walk.heads_per_group = params.heads_per_group; }
          int tile = scheduler.first();
          for (int iteration = 0;; ++iteration) {
            CompactTile item{{-1, 0, 0}, {}};
            bool const valid = walk.find(params, tile, item.tile);
            int next = tile + int(gridDim.x);  // static: the stride; dynamic: the counter's next id
            if (lane_predicate) {
              if (kDynamic && valid) { next = atomicAdd(params.tile_counter, 1) + int(gridDim.x); }  // in flight meanwhile
              if (valid) { item.seq = Seq(params, item.tile.batch); }
              int const slot = iteration & 1;
              smem.ring.empty[slot].wait(((iteration >> 1) & 1) ^ 1);  // the consumers read its last item
              smem.ring.items[slot] = item;
              smem.ring.full[slot].arrive();
            }
            if (!valid) { break; }
            if constexpr (kDynamic) { next = __shfl_sync(0xffffffffu, next, leader); }
            if (lane_predicate) { produce(item, iteration); }
            __syncwarp();
            tile = next;
          }
        } else if constexpr (kDynamic) {
          // One thread draws the tiles; in FP8 kernels the warpgroup's other threads (they transpose
          // V) read each from the ring as the consumers do.
          bool const draws = !kFp8 || threadIdx.x % cutlass::NumThreadsPerWarpGroup == 0;
          int tile = scheduler.first();
          for (int iteration = 0;; ++iteration) {
            int const slot = iteration & 1;
            using Item = std::remove_reference_t<decltype(smem.ring.items[0])>;
            Item item;
            bool valid;
            if (draws) {
              smem.ring.empty[slot].wait(((iteration >> 1) & 1) ^ 1);  // every reader read its last item
              valid = scheduler.valid(tile);
              item = [&] {
                if constexpr (kRingDecode) {
                  return valid ? scheduler.decode(tile, params.divisors) : FwdTile{-1, 0, 0};
                } else {
                  return tile;
                }
              }();
              smem.ring.items[slot] = item;
              smem.ring.full[slot].arrive();
            } else {
              smem.ring.full[slot].wait((iteration >> 1) & 1);
              item = smem.ring.items[slot];
              smem.ring.empty[slot].arrive();
              if constexpr (kRingDecode) {
                valid = item.m_block >= 0;
              } else {
                valid = scheduler.valid(item);
              }
            }
            if (!valid) { break; }
            int next = 0;
            if (draws) { next = atomicAdd(params.tile_counter, 1) + int(gridDim.x); }  // in flight meanwhile
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
      FLASH_TRACE_CTA_START(kFp8);
      int const wg = warp_group_idx - int(WarpGroupRole::kFirstConsumer);
      Mainloop::scheduler_init(wg);
      PipelineState state_k;
      PipelineState state_v;
      int q_phase = 0;
      Epilogue const epilogue;
      auto consume_tile = [&](auto const& tile) {  // a tile id, (kRingDecode) a decoded tile, (kCompact) a walked one
        FwdTile const t = decoded(tile);
        Seq const seq = seq_of(tile, t);
        // Varlen: a tile past its sequence's last query row has nothing to compute or store (the
        // producer loaded nothing for it either), so skip the epilogue's zero pass.
        if constexpr (kVarlen) {
          if (t.m_block * kBlockM >= seq.seqlen_q(params)) { return; }
        }
        int const split = split_of(tile);
        mainloop.mma(params, seq, smem, pipeline_k, pv_pipeline(pipeline_v, pipeline_vt), state_k, state_v, q_phase, t, range_of(t, seq, split),
                     threadIdx.x - 128, wg, epilogue, split);
      };
      if constexpr (Policy::kRing) {
        for (int iteration = 0;; ++iteration) {
          int const slot = iteration & 1;
          smem.ring.full[slot].wait((iteration >> 1) & 1);
          auto const item = smem.ring.items[slot];
          smem.ring.empty[slot].arrive();
          bool valid;
          if constexpr (kCompact) {
            valid = item.tile.m_block >= 0;
          } else if constexpr (kRingDecode) {
            valid = item.m_block >= 0;
          } else {
            valid = scheduler.valid(item);
          }
          if (!valid) { break; }
          consume_tile(item);
        }
      } else {
        for (int tile = scheduler.first(); scheduler.valid(tile); tile = scheduler.next(tile)) { consume_tile(tile); }
      }
      if constexpr (Epilogue::kLazyStore) {  // shared memory stays valid until the last O store has read it
        if (warp_idx_in_wg == 0 && lane_predicate) { tma_store_wait<0>(); }
      }
      FLASH_TRACE_CTA_END(kFp8, kNumMmaThreads);
    }
  }
};

// The kernel of (head dim, dtype, mask, key-length class, varlen, softcap): the tile of policy.h's
// table.
template <int kHeadDim, typename Element, bool kLocal, FwdKeys kKeys, bool kVarlen = false, bool kSoftcap = false,
          int kHeadDimV = 0>
using FwdKernelFor = FwdKernel<FwdPolicyFor<kHeadDim, Element, kLocal, kKeys, kVarlen, kSoftcap, kHeadDimV>>;

template <typename Kernel>
__global__ void __launch_bounds__(Kernel::kNumThreads, 1)
    flash_fwd_kernel(CUTE_GRID_CONSTANT typename Kernel::Params const params) {
  extern __shared__ __align__(1024) char smem_buf[];
  Kernel{}(params, smem_buf);
}

}  // namespace flash
