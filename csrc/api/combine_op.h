// The fwd_combine op (flash_attn_combine): argument checks and the launch of the split-KV combine.
// Included by flash_api.cpp after api/checks.h (its helpers, in the same anonymous namespace).
#pragma once

#include "params/combine_params.h"

namespace {

// out_partial (splits, batch, seqlen, heads, d) and lse_partial (splits, batch, seqlen, heads),
// float32 (FlashAttention-3's layout); returns out (batch, seqlen, heads, d) in out_dtype (default
// float32) and the LSE (batch, seqlen, heads), a view of (batch, heads, seqlen) memory.
std::tuple<Tensor, Tensor> mha_combine(Tensor const& out_partial, Tensor const& lse_partial,
                                       std::optional<ScalarType> out_dtype) {
  FLASH_CHECK(out_partial.is_cuda() && same_device(lse_partial, out_partial),
              "flash_attn_hopper: out_partial and lse_partial must be CUDA tensors on one device");
  FLASH_CHECK(out_partial.scalar_type() == kFloat && lse_partial.scalar_type() == kFloat,
              "flash_attn_hopper: out_partial and lse_partial must be float32");
  FLASH_CHECK(out_partial.dim() == 5 && lse_partial.dim() == 4,
              "flash_attn_hopper: out_partial must be (num_splits, batch, seqlen, nheads, headdim) and lse_partial "
              "(num_splits, batch, seqlen, nheads)");
  int64_t const splits = out_partial.size(0), batch = out_partial.size(1), seqlen = out_partial.size(2),
                heads = out_partial.size(3), head_dim = out_partial.size(4);
  for (int i = 0; i < 4; ++i) {
    FLASH_CHECK(lse_partial.size(i) == out_partial.size(i), "flash_attn_hopper: lse_partial's dimension ", i,
                " is ", lse_partial.size(i), " but out_partial's is ", out_partial.size(i));
  }
  FLASH_CHECK(splits >= 1 && splits <= flash::kCombineMaxSplits, "flash_attn_hopper: num_splits must be in [1, ",
              flash::kCombineMaxSplits, "], got ", splits);
  FLASH_CHECK(out_partial.stride(4) == 1 || head_dim <= 1,
              "flash_attn_hopper: the last dimension of out_partial must be contiguous");
  FLASH_CHECK(batch * heads * seqlen < (int64_t(1) << 40) && head_dim < (int64_t(1) << 20),
              "flash_attn_hopper: out_partial is too large for the combine kernel");
  ScalarType const out_type = out_dtype.value_or(kFloat);
  flash::CombineOut out_kind;
  switch (out_type) {
    case ScalarType::Float: out_kind = flash::CombineOut::kFloat; break;
    case ScalarType::Half: out_kind = flash::CombineOut::kHalf; break;
    case ScalarType::BFloat16: out_kind = flash::CombineOut::kBFloat16; break;
    default: FLASH_CHECK(false, "flash_attn_hopper: out_dtype must be float32, float16 or bfloat16, got ", out_type);
  }
  int const device = out_partial.get_device();
  int const cc_major = device_attribute(cudaDevAttrComputeCapabilityMajor, device);
  FLASH_CHECK(cc_major == 9 && device_attribute(cudaDevAttrComputeCapabilityMinor, device) == 0,
              "flash_attn_hopper: needs an sm_90 (Hopper) GPU");
  torch::stable::accelerator::DeviceGuard device_guard(device);

  Tensor out = empty_like_dev(out_partial, {batch, seqlen, heads, head_dim}, out_type);
  Tensor lse = empty_like_dev(out_partial, {batch, heads, seqlen}, kFloat);
  flash::CombineParams p{};
  p.o_partial = out_partial.const_data_ptr<float>();
  p.op_split_stride = out_partial.stride(0);
  p.op_batch_stride = out_partial.stride(1);
  p.op_row_stride = out_partial.stride(2);
  p.op_head_stride = out_partial.stride(3);
  p.lse_partial = lse_partial.const_data_ptr<float>();
  p.lp_split_stride = lse_partial.stride(0);
  p.lp_batch_stride = lse_partial.stride(1);
  p.lp_row_stride = lse_partial.stride(2);
  p.lp_head_stride = lse_partial.stride(3);
  p.out = out.data_ptr();
  p.out_batch_stride = out.stride(0);
  p.out_row_stride = out.stride(1);
  p.out_head_stride = out.stride(2);
  p.lse = lse.mutable_data_ptr<float>();
  p.splits = int(splits);
  p.batch = int(batch);
  p.seqlen = int(seqlen);
  p.heads = int(heads);
  p.head_dim = int(head_dim);
  bool aligned = reinterpret_cast<uintptr_t>(p.o_partial) % 16 == 0 && head_dim % 4 == 0;
  for (int i = 0; i < 4; ++i) { aligned = aligned && out_partial.stride(i) % 4 == 0; }
  p.vec4 = aligned;
  p.num_sms = device_attribute(cudaDevAttrMultiProcessorCount, device);
  flash::run_combine(p, out_kind, current_stream(device));
  return {out, torch::stable::transpose(lse, 1, 2)};
}

}  // namespace
