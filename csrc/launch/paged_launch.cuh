// Host side of the paged-KV forward (flash_attn_with_kvcache, flash_attn_varlen_func with a page
// table): the varlen launch of fwd_launch.cuh with policy.h's paged kernels, split or not.
#pragma once

#include "launch/fwd_launch.cuh"

namespace flash {

// Entry point, explicitly instantiated once per (head dim, dtype) by the generated files.
template <int kHeadDim, typename Element>
void run_flash_fwd_paged(FwdParams& p, cudaStream_t stream) {
  if (p.page_table == nullptr || p.varlen.cu_seqlens_q == nullptr || p.page_size <= 0 || p.num_pages <= 0) {
    throw std::runtime_error("flash_attn_hopper: a paged call needs its page table, sequences and cache sizes");
  }
  auto with_mask = [&](auto fn) {
    if (p.is_local) {
      fn(std::true_type{});
    } else {
      fn(std::false_type{});
    }
  };
  if (p.num_splits > 1) {
    if (p.softcap > 0 || p.oaccum_ptr == nullptr || p.lseaccum_ptr == nullptr) {
      throw std::runtime_error("flash_attn_hopper: a split-KV call needs its partial buffers and no softcap");
    }
    with_mask([&](auto local) {
      launch_fwd<FwdKernel<FwdPagedPolicyFor<kHeadDim, Element, decltype(local)::value, false, true>>>(p, stream);
    });
    return;
  }
  with_mask([&](auto local) {
    if (p.softcap > 0) {
#ifndef FLASH_DISABLE_SOFTCAP
      launch_fwd<FwdKernel<FwdPagedPolicyFor<kHeadDim, Element, decltype(local)::value, true, false>>>(p, stream);
      return;
#else
      throw std::runtime_error("flash_attn_hopper: this build has no softcap kernels (FLASH_DISABLE_SOFTCAP)");
#endif
    }
    launch_fwd<FwdKernel<FwdPagedPolicyFor<kHeadDim, Element, decltype(local)::value, false, false>>>(p, stream);
  });
}

}  // namespace flash
