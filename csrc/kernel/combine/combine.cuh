// The split-KV combine: each split s of a row left a partial output O_s normalised by its own
// softmax and its LSE l_s; the row's LSE is l = log(sum_s e^{l_s}) and its output
// O = sum_s e^{l_s - l} O_s. One warp per (batch, head, row): the lanes reduce the LSEs, keep the
// splits with a non-zero weight (a split that saw no key, l_s = -inf, is never read) in shared
// memory, then stride over the head dim. Memory-bound: O_s is read once, in 16-byte loads where
// aligned. A learnable sink (split-KV calls with one) joins each row's LSE here, and so its weights.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "params/combine_params.h"

namespace flash {

constexpr int kCombineWarps = 8;

template <typename T>
__device__ __forceinline__ T combine_convert(float x);
template <>
__device__ __forceinline__ float combine_convert<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half combine_convert<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 combine_convert<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float combine_warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2) { x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset)); }
  return x;
}
__device__ __forceinline__ float combine_warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) { x += __shfl_xor_sync(0xffffffffu, x, offset); }
  return x;
}

template <typename OutT, bool kVec4>
__global__ void __launch_bounds__(kCombineWarps * 32) flash_combine_kernel(CombineParams const p) {
  __shared__ float scale_of[kCombineWarps][kCombineMaxSplits];
  __shared__ int split_of[kCombineWarps][kCombineMaxSplits];
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int64_t const rows = int64_t(p.batch) * p.heads * p.seqlen;
  for (int64_t row = int64_t(blockIdx.x) * kCombineWarps + warp; row < rows;
       row += int64_t(gridDim.x) * kCombineWarps) {
    // Rows in (batch, head, seqlen) order, seqlen fastest: the LSE output's layout.
    int const l = int(row % p.seqlen);
    int64_t const bh = row / p.seqlen;
    int const h = int(bh % p.heads), b = int(bh / p.heads);
    float const* lse_row = p.lse_partial + b * p.lp_batch_stride + l * p.lp_row_stride + h * p.lp_head_stride;

    float m = -INFINITY;
    for (int s = lane; s < p.splits; s += 32) { m = fmaxf(m, lse_row[s * p.lp_split_stride]); }
    m = combine_warp_max(m);
    // A finite max: the sum is at least 1. No finite split (all -inf, or NaN): the row is empty.
    bool const finite = m > -INFINITY && m < INFINITY;
    float sum = 0.f;
    if (finite) {
      for (int s = lane; s < p.splits; s += 32) { sum += expf(lse_row[s * p.lp_split_stride] - m); }
    }
    sum = combine_warp_sum(sum);
    float lse = finite ? m + logf(sum) : -INFINITY;
    if (p.sink != nullptr) {  // the sink joins the denominator: lse = log(e^lse + e^sink); an empty row gets the sink
      float const s = p.sink[h];
      float const hi = fmaxf(lse, s);
      lse = hi == -INFINITY ? -INFINITY : hi + log1pf(expf(-fabsf(lse - s)));
    }

    // The splits that count (weight > 0; NaN weights are dropped), compacted in shared memory.
    int count = 0;
    for (int s0 = 0; s0 < p.splits; s0 += 32) {
      int const s = s0 + lane;
      float const w = (finite && s < p.splits) ? expf(lse_row[s * p.lp_split_stride] - lse) : 0.f;
      bool const live = w > 0.f;
      unsigned const ballot = __ballot_sync(0xffffffffu, live);
      if (live) {
        int const at = count + __popc(ballot & ((1u << lane) - 1u));
        scale_of[warp][at] = w;
        split_of[warp][at] = s;
      }
      count += __popc(ballot);
    }
    __syncwarp();
    if (lane == 0) { p.lse[row] = lse; }

    float const* o_row = p.o_partial + b * p.op_batch_stride + l * p.op_row_stride + h * p.op_head_stride;
    OutT* out_row = static_cast<OutT*>(p.out) + b * p.out_batch_stride + l * p.out_row_stride + h * p.out_head_stride;
    if constexpr (kVec4) {
      for (int d = 4 * lane; d < p.head_dim; d += 4 * 32) {
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int i = 0; i < count; ++i) {
          float const w = scale_of[warp][i];
          float4 const v = *reinterpret_cast<float4 const*>(o_row + split_of[warp][i] * p.op_split_stride + d);
          acc.x += w * v.x;
          acc.y += w * v.y;
          acc.z += w * v.z;
          acc.w += w * v.w;
        }
        out_row[d] = combine_convert<OutT>(acc.x);
        out_row[d + 1] = combine_convert<OutT>(acc.y);
        out_row[d + 2] = combine_convert<OutT>(acc.z);
        out_row[d + 3] = combine_convert<OutT>(acc.w);
      }
    } else {
      for (int d = lane; d < p.head_dim; d += 32) {
        float acc = 0.f;
        for (int i = 0; i < count; ++i) { acc += scale_of[warp][i] * o_row[split_of[warp][i] * p.op_split_stride + d]; }
        out_row[d] = combine_convert<OutT>(acc);
      }
    }
    __syncwarp();  // the lists are rewritten by the warp's next row
  }
}

}  // namespace flash
