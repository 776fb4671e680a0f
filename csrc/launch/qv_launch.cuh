// Host side of the qv forward (FA3's qv, MLA decode; FwdPolicy::kWideV): the launch of
// fwd_launch.cuh with the qv kernels, in translation units of their own (beside the hdim-64
// forward's, they changed that file's other kernels' code) [D:079].
#pragma once

#include <type_traits>

#include "launch/fwd_launch.cuh"

namespace flash {

// v's head dim rounded up to 256 or 512 (fwd_qv_head_dim_v); one CTA per tile (and split; split-KV
// calls have no softcap: the binding leaves softcap unsplit). A paged cache (page_table set, varlen)
// takes the paged qv kernels.
template <typename Element, int kHeadDimV, bool kPaged>
void run_flash_fwd_qv_dv(FwdParams& p, cudaStream_t stream) {
  if (p.num_splits > 1) {
    check_split_call(p);
    dispatch_mask_varlen(p, [&](auto local, auto varlen, auto) {
      launch_fwd<FwdKernel<FwdQvPolicyFor<Element, decltype(local)::value, kPaged || decltype(varlen)::value, false,
                                          kHeadDimV, /*kSplit=*/true, kPaged>>>(p, stream);
    });
    return;
  }
  dispatch_mask_varlen(p, [&](auto local, auto varlen, auto softcap) {
    launch_fwd<FwdKernel<FwdQvPolicyFor<Element, decltype(local)::value, kPaged || decltype(varlen)::value,
                                        decltype(softcap)::value, kHeadDimV, false, kPaged>>>(p, stream);
  });
}

// Entry point, explicitly instantiated per dtype (head dim 64 only) by the generated files.
template <int kHeadDim, typename Element>
void run_flash_fwd_qv(FwdParams& p, cudaStream_t stream) {
  static_assert(kHeadDim == 64, "the qv kernels have q / k head dim 64");
  if (p.qv_ptr == nullptr) { throw std::runtime_error("flash_attn_hopper: a qv call needs qv"); }
  if (p.page_table != nullptr &&
      (p.varlen.cu_seqlens_q == nullptr || p.page_size <= 0 || p.num_pages <= 0)) {
    throw std::runtime_error("flash_attn_hopper: a paged call needs its page table, sequences and cache sizes");
  }
  auto run = [&](auto dv) {
    if (p.page_table != nullptr) {
      run_flash_fwd_qv_dv<Element, decltype(dv)::value, true>(p, stream);
    } else {
      run_flash_fwd_qv_dv<Element, decltype(dv)::value, false>(p, stream);
    }
  };
  switch (fwd_qv_head_dim_v(p.head_dim_v)) {
    case 256: run(std::integral_constant<int, 256>{}); return;
    case 512: run(std::integral_constant<int, 512>{}); return;
    default: throw std::runtime_error("flash_attn_hopper: qv needs v's head dim in (64, 512]");
  }
}

}  // namespace flash
