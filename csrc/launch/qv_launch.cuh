// Host side of the qv forward (FA3's qv, MLA decode; FwdPolicy::kWideV): the launch of
// fwd_launch.cuh with the qv kernels, in translation units of their own (beside the hdim-64
// forward's, they changed that file's other kernels' code).
#pragma once

#include "launch/fwd_launch.cuh"

namespace flash {

// v's head dim rounded up to 256 or 512 (fwd_qv_head_dim_v); one CTA per tile, O slice and split
// (split-KV calls have no softcap: the binding leaves softcap unsplit).
template <typename Element, int kHeadDimV>
void run_flash_fwd_qv_dv(FwdParams& p, cudaStream_t stream) {
  if (p.num_splits > 1) {
    check_split_call(p);
    dispatch_mask_varlen(p, [&](auto local, auto varlen, auto) {
      launch_fwd<FwdKernel<FwdQvPolicyFor<Element, decltype(local)::value, decltype(varlen)::value, false, kHeadDimV,
                                          /*kSplit=*/true>>>(p, stream);
    });
    return;
  }
  dispatch_mask_varlen(p, [&](auto local, auto varlen, auto softcap) {
    launch_fwd<FwdKernel<FwdQvPolicyFor<Element, decltype(local)::value, decltype(varlen)::value,
                                        decltype(softcap)::value, kHeadDimV>>>(p, stream);
  });
}

// Entry point, explicitly instantiated per dtype (head dim 64 only) by the generated files.
template <int kHeadDim, typename Element>
void run_flash_fwd_qv(FwdParams& p, cudaStream_t stream) {
  static_assert(kHeadDim == 64, "the qv kernels have q / k head dim 64");
  if (p.qv_ptr == nullptr) { throw std::runtime_error("flash_attn_hopper: a qv call needs qv"); }
  switch (fwd_qv_head_dim_v(p.head_dim_v)) {
    case 256: run_flash_fwd_qv_dv<Element, 256>(p, stream); return;
    case 512: run_flash_fwd_qv_dv<Element, 512>(p, stream); return;
    default: throw std::runtime_error("flash_attn_hopper: qv needs v's head dim in (64, 512]");
  }
}

}  // namespace flash
