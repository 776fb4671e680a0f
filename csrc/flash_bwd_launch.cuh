// Host side of the backward: TMA descriptors from BwdParams, tile choice, and the three launches
// (preprocess, main kernel, dQ postprocess). The caller allocates the workspaces and zeroes the
// dQ accumulator (and the deterministic mode's counters).
#pragma once

#include "kernel/config.h"

#include <algorithm>
#include <type_traits>

#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "flash_bwd_params.h"
#include "flash_fwd_launch.cuh"  // check_cuda
#include "kernel/flash_bwd_kernel.h"
#include "kernel/flash_bwd_prepost.h"
#include "kernel/tile_size.h"

namespace flash {

template <typename Kernel>
void launch_bwd(BwdParams const& p, cudaStream_t stream) {
  using namespace cute;
  using Element = typename Kernel::Element;
  using ShapeQKV = typename Kernel::ShapeQKV;
  static_assert(Kernel::kBlockM == kBwdBlockM);

  ShapeQKV const shape_q = make_shape(p.seqlen_q, p.head_dim, p.heads_q, p.batch);
  ShapeQKV const shape_k = make_shape(p.seqlen_k, p.head_dim, p.heads_kv, p.batch);
  auto tensor = [](void const* ptr, ShapeQKV const& shape, int64_t row, int64_t head, int64_t batch) {
    return make_tensor(make_gmem_ptr(static_cast<Element const*>(ptr)), shape, make_stride(row, _1{}, head, batch));
  };
  Tensor mQ = tensor(p.q_ptr, shape_q, p.q_row_stride, p.q_head_stride, p.q_batch_stride);
  Tensor mdO = tensor(p.do_ptr, shape_q, p.do_row_stride, p.do_head_stride, p.do_batch_stride);
  Tensor mK = tensor(p.k_ptr, shape_k, p.k_row_stride, p.k_head_stride, p.k_batch_stride);
  Tensor mV = tensor(p.v_ptr, shape_k, p.v_row_stride, p.v_head_stride, p.v_batch_stride);

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
  };

  constexpr int kPrepRows = prep_rows_per_cta<Kernel::kHeadDim>();
#if defined(FLASH_BWD_DEV_PREP_ZERO) && FLASH_BWD_DEV_PREP_ZERO && !(defined(FLASH_BWD_DEV_PREP_LOOP) && FLASH_BWD_DEV_PREP_LOOP)
#error "FLASH_BWD_DEV_PREP_ZERO needs FLASH_BWD_DEV_PREP_LOOP (only the loop kernel zeroes the accumulator)"
#endif
#if defined(FLASH_BWD_DEV_PREP_LOOP) && FLASH_BWD_DEV_PREP_LOOP
  if (int64_t(p.seqlen_q_padded / kPrepRows + 1) * p.heads_q * p.batch <= INT32_MAX) {
    // experiment: resident CTAs striding over the units (flash_bwd_prepost.h)
    auto prep = &flash_bwd_preprocess_loop_kernel<Element, Kernel::kHeadDim>;
    int device = 0, sms = 0, per_sm = 0;
    check_cuda(cudaGetDevice(&device), "querying the device");
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "querying the SM count");
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, prep, kPrepWarps * 32, 0),
               "querying the preprocess kernel's occupancy");
    int const units_per_head = (p.seqlen_q_padded + kPrepRows - 1) / kPrepRows;
    int64_t const units = int64_t(units_per_head) * p.heads_q * p.batch;
    int const grid = int(std::min<int64_t>(units, int64_t(sms) * std::max(per_sm, 1)));
    prep<<<grid, kPrepWarps * 32, 0, stream>>>(p, units_per_head, int(units));
  } else
#endif
  {
#if defined(FLASH_BWD_DEV_PREP_ZERO) && FLASH_BWD_DEV_PREP_ZERO
    check_cuda(cudaMemsetAsync(p.dq_accum_ptr, 0,
                               sizeof(float) * size_t(p.batch) * p.heads_q * p.seqlen_q_padded * p.head_dim_rounded,
                               stream),
               "zeroing the dQ accumulator");
#endif
    dim3 const grid_prep((p.seqlen_q_padded + kPrepRows - 1) / kPrepRows, p.heads_q, p.batch);
    flash_bwd_preprocess_kernel<Element, Kernel::kHeadDim><<<grid_prep, kPrepWarps * 32, 0, stream>>>(p);
  }
  check_cuda(cudaGetLastError(), "launching the backward preprocess kernel");

  dim3 grid((p.seqlen_k + Kernel::kBlockN - 1) / Kernel::kBlockN, p.heads_kv, p.batch);
  if constexpr (Kernel::kPersistent) {  // one CTA per SM over all tiles
    int device = 0, sms = 0;
    check_cuda(cudaGetDevice(&device), "querying the device");
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "querying the SM count");
    grid = dim3(std::min<int64_t>(int64_t(grid.x) * grid.y * grid.z, sms), 1, 1);
  }
  auto kernel = &flash_bwd_kernel<Kernel>;
  constexpr int smem_size = Kernel::kSharedStorageSize;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_size),
             "raising the backward kernel's shared-memory limit");
  kernel<<<grid, Kernel::kNumThreads, smem_size, stream>>>(params);
  check_cuda(cudaGetLastError(), "launching the backward kernel");

  dim3 const grid_post(p.seqlen_q_padded / Kernel::kBlockM, p.heads_q, p.batch);
  flash_bwd_dq_postprocess_kernel<Kernel><<<grid_post, Kernel::kNumMmaThreads, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "launching the backward dQ postprocess kernel");
}

template <int kHeadDim, typename Element, bool kLocal>
void run_flash_bwd_mask(BwdParams& p, cudaStream_t stream) {
  constexpr FwdTileShape tile = bwd_tile<kHeadDim>();
  // The default and the deterministic mode share one kernel unless a policy tells them apart.
  using Default = BwdKernel<kHeadDim, tile.block_m, tile.block_n, tile.stages, Element, kLocal,
                            bwd_dv_after_ds<kHeadDim, kLocal, /*kDeterministic=*/false>(),
                            bwd_persistent<kHeadDim, kLocal, /*kDeterministic=*/false>()>;
  using Deterministic = BwdKernel<kHeadDim, tile.block_m, tile.block_n, tile.stages, Element, kLocal,
                                  bwd_dv_after_ds<kHeadDim, kLocal, /*kDeterministic=*/true>(),
                                  bwd_persistent<kHeadDim, kLocal, /*kDeterministic=*/true>()>;
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
  if (p.is_local) {
    run_flash_bwd_mask<kHeadDim, Element, true>(p, stream);
  } else {
    run_flash_bwd_mask<kHeadDim, Element, false>(p, stream);
  }
}

}  // namespace flash
