// Host side of the FP8 (e4m3) forward (FwdPolicy::kFp8): the launch of fwd_launch.cuh with the FP8
// kernels (fwd_fp8_tile), in translation units of their own. O is bf16.
#pragma once

#include <stdexcept>
#include <type_traits>

#include "launch/fwd_launch.cuh"

namespace flash {

// Entry point, explicitly instantiated per head dim (Element: cutlass::float_e4m3_t) by the
// generated files. Dense, varlen or over a paged cache, any mask, softcap; split-KV for varlen calls
// without softcap; no qv or dv != d (the binding refuses those before launching).
template <int kHeadDim, typename Element>
void run_flash_fwd_fp8(FwdParams& p, cudaStream_t stream) {
  static_assert(cutlass::sizeof_bits<Element>::value == 8, "the FP8 kernels take e4m3 inputs");
  if (p.qv_ptr != nullptr || (p.head_dim_v > 0 && p.head_dim_v != p.head_dim)) {
    throw std::runtime_error("flash_attn_hopper: the FP8 kernels take no qv or dv != d");
  }
  bool const paged = p.page_table != nullptr;
  if (paged && (p.varlen.cu_seqlens_q == nullptr || p.page_size <= 0 || p.num_pages <= 0)) {
    throw std::runtime_error("flash_attn_hopper: a paged call needs its page table, sequences and cache sizes");
  }
  if (p.num_splits > 1) {  // split-KV (varlen, no softcap), over a paged cache or not [D:081]
    check_split_call(p);
    if (p.varlen.cu_seqlens_q == nullptr) { throw std::runtime_error("flash_attn_hopper: FP8 splits are varlen"); }
    dispatch_mask_varlen(p, [&](auto local, auto varlen, auto) {
      if constexpr (decltype(varlen)::value) {
        constexpr bool kLocal = decltype(local)::value;
        if (paged) {
          launch_fwd<FwdKernel<FwdFp8CachePolicyFor<kHeadDim, kLocal, false, true, true>>>(p, stream);
        } else {
          launch_fwd<FwdKernel<FwdFp8CachePolicyFor<kHeadDim, kLocal, false, true, false>>>(p, stream);
        }
      }
    });
    return;
  }
  if (paged) {  // the producer gathers K/V [D:081]
    dispatch_mask_varlen(p, [&](auto local, auto, auto softcap) {
      launch_fwd<FwdKernel<FwdFp8CachePolicyFor<kHeadDim, decltype(local)::value, decltype(softcap)::value, false,
                                                true>>>(p, stream);
    });
    return;
  }
  dispatch_mask_varlen(p, [&](auto local, auto varlen, auto softcap) {
    constexpr bool kLocal = decltype(local)::value, kVarlen = decltype(varlen)::value;
    constexpr bool kSoftcap = decltype(softcap)::value;
    using Dense = FwdFp8Dense<kHeadDim, kLocal, kVarlen, kSoftcap>;  // policy.h: which kernel for seqlen_k
    if constexpr (Dense::kHasLong) {
      if (Dense::long_keys(p.seqlen_k)) {
        launch_fwd<FwdKernel<typename Dense::Long>>(p, stream);
        return;
      }
    }
    launch_fwd<FwdKernel<typename Dense::Short>>(p, stream);
  });
}

}  // namespace flash
