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
  // dispatch_mask_varlen's varlen flag is always set here (checked above): paged kernels are varlen.
  if (p.num_splits > 1) {
    check_split_call(p);
    dispatch_mask_varlen(p, [&](auto local, auto, auto) {
      launch_fwd<FwdKernel<FwdPagedPolicyFor<kHeadDim, Element, decltype(local)::value, false, true>>>(p, stream);
    });
    return;
  }
  dispatch_mask_varlen(p, [&](auto local, auto, auto softcap) {
    launch_fwd<FwdKernel<FwdPagedPolicyFor<kHeadDim, Element, decltype(local)::value, decltype(softcap)::value,
                                           false>>>(p, stream);
  });
}

}  // namespace flash
