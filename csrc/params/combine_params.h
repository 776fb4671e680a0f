// Plain parameters of one split-KV combine call (flash_attn_combine): per-split partial outputs
// and LSEs merged into one output and LSE. Filled by the torch binding, read by the launcher.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>  // cudaStream_t

namespace flash {

// At most this many splits (FlashAttention-3's bound): the per-warp scale list lives in shared memory.
constexpr int kCombineMaxSplits = 256;

enum class CombineOut { kFloat, kHalf, kBFloat16 };  // the output's dtype

struct CombineParams {
  // out_partial (splits, batch, seqlen, heads, head_dim) float32, head_dim contiguous.
  float const* o_partial;
  int64_t op_split_stride, op_batch_stride, op_row_stride, op_head_stride;
  // lse_partial (splits, batch, seqlen, heads) float32, natural log, any strides.
  float const* lse_partial;
  int64_t lp_split_stride, lp_batch_stride, lp_row_stride, lp_head_stride;
  // out (batch, seqlen, heads, head_dim) in the output dtype, head_dim contiguous.
  void* out;
  int64_t out_batch_stride, out_row_stride, out_head_stride;
  float* lse;  // (batch, heads, seqlen) contiguous
  int splits, batch, seqlen, heads, head_dim;
  bool vec4;  // every pointer and stride of out_partial 16-byte aligned and head_dim % 4 == 0: float4 loads
  float const* sink = nullptr;  // optional learnable sink per head (natural log): one more term in the LSE
  // Varlen split calls (null: every row is one): rows outside [cu_seqlens[0], cu_seqlens[cu_count])
  // belong to no sequence, no split wrote them, and they come out 0 with LSE -inf (or the sink).
  int const* cu_seqlens = nullptr;
  int cu_count = 0;
  // PackGQA (group > 1): row l of head h holds token l / group of query head h * group + l % group;
  // out, lse and the sink are indexed per query head and token (seqlen / group rows, heads * group).
  int group = 1;
  int num_sms;
};

void run_combine(CombineParams const& p, CombineOut out, cudaStream_t stream);  // launch/combine.cu

}  // namespace flash
