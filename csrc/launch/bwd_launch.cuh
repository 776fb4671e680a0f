// Host side of the backward: TMA descriptors from BwdParams, tile choice, and the three launches
// (preprocess, main kernel, dQ postprocess). The caller allocates the workspaces and zeroes the
// dQ accumulator (and the deterministic mode's counters).
#pragma once

#include "kernel/common/config.h"

#include <algorithm>
#include <string>
#include <type_traits>

#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "kernel/bwd/kernel.h"
#include "kernel/bwd/prepost.h"
#include "kernel/common/policy.h"
#include "launch/fwd_launch.cuh"  // check_cuda, dispatch_mask_varlen
#include "params/bwd_params.h"

namespace flash {

// CTAs of `kernel` (no dynamic shared memory) resident per SM at `threads` threads, at least 1; the
// grids of the resident-CTA kernels below (each caller keeps it in a static: once per instantiation).
template <typename KernelFn>
int resident_per_sm(KernelFn kernel, int threads, char const* name) {
  int n = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0),
             (std::string("querying the occupancy of ") + name).c_str());
  return std::max(n, 1);
}

template <typename Kernel>
void launch_bwd(BwdParams const& p, cudaStream_t stream) {
  using namespace cute;
  using Element = typename Kernel::Element;
  using ShapeQKV = typename Kernel::ShapeQKV;
  static_assert(kBwdPadM % Kernel::kBlockM == 0 && Kernel::kBlockM >= kBwdMinBlockM,
                "the binding pads the per-row buffers for this step");

  // Varlen: one packed (total, d, heads) tensor, batch coordinate 0; tiles offset by their sequence.
  constexpr bool kVarlen = Kernel::kVarlen;
  ShapeQKV const shape_q =
      make_shape(kVarlen ? p.varlen.total_q : p.seqlen_q, p.head_dim, p.heads_q, kVarlen ? 1 : p.batch);
  ShapeQKV const shape_k =
      make_shape(kVarlen ? p.varlen.total_k : p.seqlen_k, p.head_dim, p.heads_kv, kVarlen ? 1 : p.batch);
  // v and dO at their own head dim (dv != d): the descriptors zero-fill the tile's columns past it,
  // which add nothing to dP = dO.V^T; the tiles' coordinates are those of k and q.
  if (p.head_dim_v <= 0 || p.head_dim_v > p.head_dim || (!Kernel::Policy::kNarrowV && p.head_dim_v != p.head_dim)) {
    throw std::runtime_error("flash_attn_hopper: v's head dim is not one this backward kernel takes");
  }
  ShapeQKV const shape_do = make_shape(get<0>(shape_q), p.head_dim_v, p.heads_q, get<3>(shape_q));
  ShapeQKV const shape_v = make_shape(get<0>(shape_k), p.head_dim_v, p.heads_kv, get<3>(shape_k));
  auto tensor = [](void const* ptr, ShapeQKV const& shape, int64_t row, int64_t head, int64_t batch) {
    return make_tensor(make_gmem_ptr(static_cast<Element const*>(ptr)), shape, make_stride(row, _1{}, head, batch));
  };
  Tensor mQ = tensor(p.q_ptr, shape_q, p.q_row_stride, p.q_head_stride, p.q_batch_stride);
  Tensor mdO = tensor(p.do_ptr, shape_do, p.do_row_stride, p.do_head_stride, p.do_batch_stride);
  Tensor mK = tensor(p.k_ptr, shape_k, p.k_row_stride, p.k_head_stride, p.k_batch_stride);
  Tensor mV = tensor(p.v_ptr, shape_v, p.v_row_stride, p.v_head_stride, p.v_batch_stride);

  using M = Int<Kernel::kBlockM>;
  using N = Int<Kernel::kBlockN>;
  using D = Int<Kernel::kHeadDim>;
  auto const smem_q = take<0, 2>(typename Kernel::SmemLayoutQ{});
  typename Kernel::Params params{
      make_tma_copy(SM90_TMA_LOAD{}, mQ, smem_q, Shape<M, D>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, mdO, smem_q, Shape<M, D>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, mK, typename Kernel::SmemLayoutK{}, Shape<N, D>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, mV, typename Kernel::SmemLayoutK{}, Shape<N, D>{}, _1{}),
      shape_q,
      shape_k,
      static_cast<Element*>(p.dk_ptr),
      static_cast<Element*>(p.dv_ptr),
      p.dq_accum_ptr,
      p.lse_log2_ptr,
      p.dsum_ptr,
      p.dq_semaphore_ptr,
      p.tile_counter,
      p.seqlen_q,
      p.seqlen_q_padded,
      p.seqlen_k,
      p.heads_q,
      p.heads_q / p.heads_kv,
      p.head_dim,
      p.heads_kv,
      p.softmax_scale,
      p.softmax_scale_log2,
      p.diag_offset,
      p.window_left,
      p.window_right,
      {},  // varlen, set below
      p.softcap_prescale,
      p.head_dim_v,
  };
  if constexpr (kVarlen) { params.varlen = p.varlen; }

  if (Kernel::kDynamic && (p.tile_counter == nullptr || p.dq_semaphore_ptr != nullptr)) {
    throw std::runtime_error(
        "flash_attn_hopper: the dynamic backward kernel needs the binding's tile counter and the default mode");
  }
  {  // preprocess: resident CTAs (as many as fit, found once per instantiation) over the row units
    auto prep = &flash_bwd_preprocess_kernel<Element, Kernel::kHeadDim, kVarlen>;
    static int const per_sm = resident_per_sm(prep, kPrepWarps * 32, "the backward preprocess kernel");
    constexpr int kPrepRows = prep_rows_per_cta<Kernel::kHeadDim>();
    // Varlen: the longest sequence's units per (head, sequence), a bound on the grid (the kernel
    // counts the real ones).
    int const rows = kVarlen ? (p.seqlen_q + kBwdPadM - 1) / kBwdPadM * kBwdPadM : p.seqlen_q_padded;
    int const units_per_head = (rows + kPrepRows - 1) / kPrepRows;
    int64_t const units = int64_t(units_per_head) * p.heads_q * p.batch;
    int const grid_prep = int(std::min<int64_t>(units, int64_t(p.num_sms) * per_sm));
    prep<<<grid_prep, kPrepWarps * 32, 0, stream>>>(p, units_per_head, units);
  }
  check_cuda(cudaGetLastError(), "launching the backward preprocess kernel");

  dim3 grid((p.seqlen_k + Kernel::kBlockN - 1) / Kernel::kBlockN, p.heads_kv, p.batch);
  if constexpr (Kernel::kPersistent) {  // one CTA per SM over all tiles
    grid = dim3(std::min<int64_t>(int64_t(grid.x) * grid.y * grid.z, p.num_sms), 1, 1);
  }
  auto kernel = &flash_bwd_kernel<Kernel>;
  constexpr int smem_size = Kernel::kSharedStorageSize;
  static std::atomic<uint64_t> smem_allowed{0};
  allow_smem_once(smem_allowed, kernel, smem_size, "raising the backward kernel's shared-memory limit");
  kernel<<<grid, Kernel::kNumThreads, smem_size, stream>>>(params);
  check_cuda(cudaGetLastError(), "launching the backward kernel");

  auto post = &flash_bwd_dq_postprocess_kernel<Kernel>;
  dim3 grid_post(p.seqlen_q_padded / Kernel::kBlockM, p.heads_q, p.batch);
  if constexpr (kVarlen) {  // resident CTAs over the blocks that hold rows: at most this many
    static int const post_per_sm = resident_per_sm(post, Kernel::kNumMmaThreads, "the dQ postprocess kernel");
    int64_t const blocks = int64_t(p.heads_q) * ((p.varlen.total_q + Kernel::kBlockM - 1) / Kernel::kBlockM + p.batch);
    grid_post = dim3(unsigned(std::min<int64_t>(blocks, int64_t(p.num_sms) * post_per_sm)), 1, 1);
  }
  post<<<grid_post, Kernel::kNumMmaThreads, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "launching the backward dQ postprocess kernel");
}

template <int kHeadDim, typename Element, bool kLocal, bool kVarlen, bool kSoftcap>
void run_flash_bwd_mask(BwdParams& p, cudaStream_t stream) {
  // The default and the deterministic mode share one kernel unless a policy tells them apart.
  using Default = BwdKernelFor<kHeadDim, Element, kLocal, /*kDeterministic=*/false, kVarlen, kSoftcap>;
  using Deterministic = BwdKernelFor<kHeadDim, Element, kLocal, /*kDeterministic=*/true, kVarlen, kSoftcap>;
  if constexpr (!std::is_same_v<Default, Deterministic>) {
    if (p.dq_semaphore_ptr != nullptr) {
      launch_bwd<Deterministic>(p, stream);
      return;
    }
  }
  launch_bwd<Default>(p, stream);
}

// Entry point, explicitly instantiated once per (head dim, dtype) by the generated files.
template <int kHeadDim, typename Element>
void run_flash_bwd(BwdParams& p, cudaStream_t stream) {
  dispatch_mask_varlen(p, [&](auto local, auto varlen, auto softcap) {
    run_flash_bwd_mask<kHeadDim, Element, decltype(local)::value, decltype(varlen)::value, decltype(softcap)::value>(
        p, stream);
  });
}

}  // namespace flash
