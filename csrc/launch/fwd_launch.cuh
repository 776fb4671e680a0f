// Host side of the forward kernel: builds the TMA descriptors from FwdParams, picks the tile
// for (head dim, mask, key length) and launches on the caller's stream. No torch headers.
#pragma once

#include "kernel/common/config.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "kernel/common/policy.h"
#include "kernel/fwd/kernel.h"
#include "params/fwd_params.h"

namespace flash {

// fn(std::bool_constant<local>, std::bool_constant<varlen>, std::bool_constant<softcap>) for the
// params' mask, layout and score cap. Builds with FLASH_DISABLE_SOFTCAP compile no softcap kernels
// (the binding refuses softcap there before any allocation; this throw is the last guard).
template <typename Params, typename Fn>
void dispatch_mask_varlen(Params const& p, Fn&& fn) {
  auto with_softcap = [&](auto local, auto varlen) {
    if (p.softcap > 0) {
#ifndef FLASH_DISABLE_SOFTCAP
      fn(local, varlen, std::true_type{});
      return;
#else
      throw std::runtime_error("flash_attn_hopper: this build has no softcap kernels (FLASH_DISABLE_SOFTCAP)");
#endif
    }
    fn(local, varlen, std::false_type{});
  };
  auto with_mask = [&](auto varlen) {
    if (p.is_local) {
      with_softcap(std::true_type{}, varlen);
    } else {
      with_softcap(std::false_type{}, varlen);
    }
  };
  if (p.varlen.cu_seqlens_q != nullptr) {
    with_mask(std::true_type{});
  } else {
    with_mask(std::false_type{});
  }
}

inline void check_cuda(cudaError_t err, char const* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("flash_attn_hopper: ") + what + ": " + cudaGetErrorString(err));
  }
}

// Raises kernel's dynamic shared-memory limit on the current device the first time it launches
// there (the attribute lasts for the process): done[bit d] says device d has it.
template <typename KernelFn>
void allow_smem_once(std::atomic<uint64_t>& done, KernelFn kernel, int smem_size, char const* what) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), what);
  uint64_t const bit = device < 64 ? uint64_t(1) << device : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0) { return; }
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_size), what);
  done.fetch_or(bit, std::memory_order_release);
}

template <typename Kernel>
void launch_fwd(FwdParams const& p, cudaStream_t stream) {
  using namespace cute;
  using Element = typename Kernel::Element;
  using OutElement = typename Kernel::Policy::OutElement;
  using ShapeQKV = typename Kernel::ShapeQKV;

  // Varlen: one packed (total, d, heads) tensor, batch coordinate 0; tiles offset by their sequence.
  constexpr bool kVarlen = Kernel::kVarlen;
  ShapeQKV const shape_q =
      make_shape(kVarlen ? p.varlen.total_q : p.seqlen_q, p.head_dim, p.heads_q, kVarlen ? 1 : p.batch);
  // Paged: the cache's (page_size, d, heads, pages) for the unused K/V TMA descriptors (paged_kv.h loads).
  ShapeQKV const shape_k = Kernel::Policy::kPaged
                               ? make_shape(p.page_size, p.head_dim, p.heads_kv, p.num_pages)
                               : make_shape(kVarlen ? p.varlen.total_k : p.seqlen_k, p.head_dim, p.heads_kv,
                                            kVarlen ? 1 : p.batch);
  auto tensor = [](void const* ptr, ShapeQKV const& shape, int64_t row, int64_t head, int64_t batch) {
    return make_tensor(make_gmem_ptr(static_cast<Element const*>(ptr)), shape,
                       make_stride(row, _1{}, head, batch));
  };
  Tensor mQ = tensor(p.q_ptr, shape_q, p.q_row_stride, p.q_head_stride, p.q_batch_stride);
  Tensor mK = tensor(p.k_ptr, shape_k, p.k_row_stride, p.k_head_stride, p.k_batch_stride);
  // V and O: head dim dv (FwdParams::head_dim_v; 0 = head_dim).
  int const head_dim_v = p.head_dim_v > 0 ? p.head_dim_v : p.head_dim;
  ShapeQKV const shape_v = make_shape(get<0>(shape_k), head_dim_v, p.heads_kv, get<3>(shape_k));
  ShapeQKV const shape_o = make_shape(get<0>(shape_q), head_dim_v, p.heads_q, get<3>(shape_q));
  Tensor mV = tensor(p.v_ptr, shape_v, p.v_row_stride, p.v_head_stride, p.v_batch_stride);
  Tensor mO = make_tensor(make_gmem_ptr(static_cast<OutElement*>(p.o_ptr)), shape_o,
                          make_stride(p.o_row_stride, _1{}, p.o_head_stride, p.o_batch_stride));

  using M = Int<Kernel::kBlockM>;
  using N = Int<Kernel::kBlockN>;
  using D = Int<Kernel::kHeadDim>;
  using DV = Int<Kernel::kHeadDimV>;
  using DO = Int<Kernel::Policy::kHeadDimO>;
  int const num_m_blocks = (p.seqlen_q + Kernel::kBlockM - 1) / Kernel::kBlockM;
  int const heads_per_group = Kernel::Scheduler::heads_per_group(
      p.heads_q, p.heads_q / p.heads_kv, p.batch, int64_t(p.seqlen_k) * p.head_dim * int64_t(sizeof(Element)));
  typename Kernel::Params params{
      make_tma_copy(SM90_TMA_LOAD{}, mQ, typename Kernel::SmemLayoutQ{}, Shape<M, D>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, mK, take<0, 2>(typename Kernel::SmemLayoutKV{}), Shape<N, D>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, mV, take<0, 2>(typename Kernel::SmemLayoutV{}), Shape<N, DV>{}, _1{}),
      make_tma_copy(SM90_TMA_STORE{}, mO, typename Kernel::SmemLayoutO64{}, Shape<_64, DO>{}, _1{}),
      shape_q,
      shape_k,
      p.lse_ptr,
      p.seqlen_q,
      p.seqlen_k,
      p.heads_q,
      p.heads_q / p.heads_kv,
      num_m_blocks,
      p.batch,
      p.diag_offset,
      p.window_left,
      p.window_right,
      p.softcap > 0 ? p.softcap : p.softmax_scale,  // the row max's factor in the LSE
      p.softmax_scale_log2,
      heads_per_group,
      p.tile_counter,
      Kernel::Scheduler::divisors(num_m_blocks, p.heads_q, heads_per_group),
      {},  // direct_o, set below
      {},  // varlen, set below
      p.softcap_prescale,
      Kernel::Policy::kSplit ? nullptr : p.sink_ptr,  // split kernels: the combine adds the sink
      {},  // split, set below
      {},  // paged, set below
      {},  // shapes_v, set below
      {},  // qv, set below
      {},  // fp8, set below
  };
  if constexpr (Kernel::kHeadDimV != Kernel::kHeadDim) { params.shapes_v = {shape_v, shape_o}; }
  if constexpr (Kernel::kDirectO) {
    params.direct_o = {static_cast<OutElement*>(p.o_ptr), p.o_row_stride, p.o_head_stride, p.o_batch_stride};
  }
  if constexpr (Kernel::kFp8) {
    params.fp8 = {p.q_descale_ptr,          p.k_descale_ptr,          p.v_descale_ptr,
                  p.q_descale_batch_stride, p.q_descale_head_stride,  p.k_descale_batch_stride,
                  p.k_descale_head_stride,  p.v_descale_batch_stride, p.v_descale_head_stride};
  }
  if constexpr (kVarlen) { params.varlen = p.varlen; }
  if constexpr (Kernel::Policy::kWideV) {
    if (p.qv_ptr == nullptr) { throw std::runtime_error("flash_attn_hopper: the qv kernels need qv"); }
    ShapeQKV const shape_qv = make_shape(get<0>(shape_q), head_dim_v, p.heads_q, get<3>(shape_q));
    Tensor mQv = tensor(p.qv_ptr, shape_qv, p.qv_row_stride, p.qv_head_stride, p.qv_batch_stride);
    params.qv = {make_tma_copy(SM90_TMA_LOAD{}, mQv, typename Kernel::Mainloop::SmemLayoutQv{}, Shape<M, DV>{}, _1{}),
                 shape_qv};
  }
  if constexpr (Kernel::Policy::kPaged) {
    params.paged = {p.k_ptr,           p.v_ptr,           p.k_batch_stride,      p.k_row_stride,
                    p.k_head_stride,   p.v_batch_stride,  p.v_row_stride,        p.v_head_stride,
                    p.page_table,      p.page_table_stride, cutlass::FastDivmod(p.page_size), p.num_pages,
                    p.head_dim};
  }
  int grid_batches = p.batch;
  if constexpr (Kernel::Policy::kSplit) {
    params.split = {p.oaccum_ptr,           p.lseaccum_ptr,         p.num_splits,
                    p.oaccum_split_stride,  p.oaccum_batch_stride,  p.oaccum_row_stride,
                    p.oaccum_head_stride,   p.lseaccum_split_stride};
    grid_batches = p.batch * p.num_splits;  // the grid's batch coordinate: batch * num_splits + split
  }
  if (Kernel::kDynamic && p.tile_counter == nullptr) {
    throw std::runtime_error("flash_attn_hopper: dynamic tile scheduling needs the binding's tile counter");
  }

  dim3 const grid = Kernel::Scheduler::grid(params.num_m_blocks, p.heads_q, grid_batches, p.num_sms);
  auto kernel = &flash_fwd_kernel<Kernel>;
  constexpr int smem_size = Kernel::kSharedStorageSize;
  static std::atomic<uint64_t> smem_allowed{0};
  allow_smem_once(smem_allowed, kernel, smem_size, "raising the kernel's shared-memory limit");
  kernel<<<grid, Kernel::kNumThreads, smem_size, stream>>>(params);
  check_cuda(cudaGetLastError(), "launching the forward kernel");
}

template <int kHeadDim, typename Element, bool kLocal, FwdKeys kKeys, bool kVarlen, bool kSoftcap, int kHeadDimV>
void run_flash_fwd_tile(FwdParams& p, cudaStream_t stream) {
  launch_fwd<FwdKernelFor<kHeadDim, Element, kLocal, kKeys, kVarlen, kSoftcap, kHeadDimV>>(p, stream);
}

// The tile of the key-length class of seqlen_k (policy.h; varlen: of the longest sequence);
// classes sharing a tile share a kernel.
template <int kHeadDim, typename Element, bool kLocal, bool kVarlen, bool kSoftcap, int kHeadDimV>
void run_flash_fwd_mask(FwdParams& p, cudaStream_t stream) {
  FwdKeys const keys = fwd_keys_class_for<kHeadDim, kLocal>(p.seqlen_k);
  if constexpr (fwd_keys_class_differs<kHeadDim, kLocal, kLongKeys>()) {
    if (keys == kLongKeys) {
      run_flash_fwd_tile<kHeadDim, Element, kLocal, kLongKeys, kVarlen, kSoftcap, kHeadDimV>(p, stream);
      return;
    }
  }
  if constexpr (fwd_keys_class_differs<kHeadDim, kLocal, kMidKeys>()) {
    if (keys >= kMidKeys) {
      run_flash_fwd_tile<kHeadDim, Element, kLocal, kMidKeys, kVarlen, kSoftcap, kHeadDimV>(p, stream);
      return;
    }
  }
  run_flash_fwd_tile<kHeadDim, Element, kLocal, kShortKeys, kVarlen, kSoftcap, kHeadDimV>(p, stream);
}

// A split-KV call (num_splits > 1) has its partial buffers and no softcap (the binding leaves
// softcap unsplit); the split kernels of every forward entry point check it.
inline void check_split_call(FwdParams const& p) {
  if (p.softcap > 0 || p.oaccum_ptr == nullptr || p.lseaccum_ptr == nullptr) {
    throw std::runtime_error("flash_attn_hopper: a split-KV call needs its partial buffers and no softcap");
  }
}

// The kernels of (head dim, V's head dim). Split-KV calls (num_splits > 1; the binding leaves
// softcap unsplit) take the split kernels.
template <int kHeadDim, typename Element, int kHeadDimV>
void run_flash_fwd_dv(FwdParams& p, cudaStream_t stream) {
  if (p.num_splits > 1) {
    check_split_call(p);
    dispatch_mask_varlen(p, [&](auto local, auto varlen, auto) {
      launch_fwd<FwdKernel<
          FwdSplitPolicyFor<kHeadDim, Element, decltype(local)::value, decltype(varlen)::value, kHeadDimV>>>(p,
                                                                                                              stream);
    });
    return;
  }
  dispatch_mask_varlen(p, [&](auto local, auto varlen, auto softcap) {
    run_flash_fwd_mask<kHeadDim, Element, decltype(local)::value, decltype(varlen)::value, decltype(softcap)::value,
                       kHeadDimV>(p, stream);
  });
}

// Entry point, explicitly instantiated once per (head dim, dtype) by the generated files. V's head
// dim is q's (rounded up alike), or the one narrower head dim with kernels of its own
// (fwd_value_head_dim: 128 beside 192); the binding refuses any other. qv calls take
// run_flash_fwd_qv (qv_launch.cuh).
template <int kHeadDim, typename Element>
void run_flash_fwd(FwdParams& p, cudaStream_t stream) {
  if (p.qv_ptr != nullptr) { throw std::runtime_error("flash_attn_hopper: qv calls take the qv kernels"); }
  constexpr int kHeadDimV = fwd_value_head_dim<kHeadDim>();
  if (p.head_dim_v > 0 && p.head_dim_v != p.head_dim) {
    if constexpr (kHeadDimV > 0) {
      if (p.head_dim_v <= kHeadDimV) {
        run_flash_fwd_dv<kHeadDim, Element, kHeadDimV>(p, stream);
        return;
      }
    }
    throw std::runtime_error("flash_attn_hopper: no forward kernel for this V head dim beside this head dim");
  }
  run_flash_fwd_dv<kHeadDim, Element, 0>(p, stream);
}

}  // namespace flash
