// The split-KV combine: each split s of a row left a partial output O_s normalised by its own
// softmax and its LSE l_s; the row's LSE is l = log(sum_s e^{l_s}) and its output
// O = sum_s e^{l_s - l} O_s. kRowWarps warps per (batch, head, row): each reduces the row's LSEs
// (held in registers), keeps the splits with a non-zero weight (a split that saw no key,
// l_s = -inf, is never read) in shared memory and sums every kRowWarps-th of them over the head
// dim; with kRowWarps > 1 (few rows, many splits) the warps' sums meet in shared memory.
// Memory-bound: O_s is read once, in 16-byte loads where aligned. A learnable sink (split-KV
// calls with one) joins each row's LSE here, and so its weights.
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

// The (batch, head, row) of a row index, rows in (batch, head, seqlen) order with seqlen fastest
// (the LSE output's layout), and whether any split wrote it.
struct CombineRow {
  int b, h, l;
  bool owned;
};
__device__ __forceinline__ CombineRow combine_row(CombineParams const& p, int64_t row, int first, int last) {
  int const l = int(row % p.seqlen);
  int64_t const bh = row / p.seqlen;
  return {int(bh / p.heads), int(bh % p.heads), l, l >= first && l < last};
}

template <typename OutT, bool kVec4, int kRowWarps>
__global__ void __launch_bounds__(kCombineWarps * 32, 1) flash_combine_kernel(CombineParams const p) {
  static_assert(kCombineWarps % kRowWarps == 0 && kCombineMaxSplits % 32 == 0);
  constexpr int kRowsPerBlock = kCombineWarps / kRowWarps;
  constexpr int kLsePerLane = kCombineMaxSplits / 32;
  constexpr int kChunk = 32 * (kVec4 ? 4 : 1);  // head-dim elements a warp covers per step
  __shared__ float scale_of[kCombineWarps][kCombineMaxSplits];
  __shared__ int split_of[kCombineWarps][kCombineMaxSplits];
  __shared__ float partial[kRowWarps > 1 ? kCombineWarps : 1][kChunk];
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int const part = warp % kRowWarps;  // this warp's share of the row's splits
  int64_t const rows = int64_t(p.batch) * p.heads * p.seqlen;
  int64_t const groups = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  int const first = p.cu_seqlens == nullptr ? 0 : p.cu_seqlens[0];
  int const last = p.cu_seqlens == nullptr ? p.seqlen : p.cu_seqlens[p.cu_count];
  // Uniform over the block: every warp runs every group (kRowWarps > 1 meets at __syncthreads).
  for (int64_t group = blockIdx.x; group < groups; group += gridDim.x) {
    int64_t const row = group * kRowsPerBlock + warp / kRowWarps;
    bool const live_row = row < rows;
    CombineRow const r = combine_row(p, live_row ? row : 0, first, last);
    float const* lse_row = p.lse_partial + r.b * p.lp_batch_stride + r.l * p.lp_row_stride + r.h * p.lp_head_stride;

    float lv[kLsePerLane];
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < kLsePerLane; ++i) {
      int const s = i * 32 + lane;
      lv[i] = (live_row && r.owned && s < p.splits) ? lse_row[s * p.lp_split_stride] : -INFINITY;
      m = fmaxf(m, lv[i]);
    }
    m = combine_warp_max(m);
    // A finite max: the sum is at least 1. No finite split (all -inf, NaN, or a row no split
    // wrote): the row is empty.
    bool const finite = m > -INFINITY && m < INFINITY;
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < kLsePerLane; ++i) { sum += finite ? expf(lv[i] - m) : 0.f; }
    sum = combine_warp_sum(sum);
    float lse = finite ? m + logf(sum) : -INFINITY;
    // Where the row's results go: per query head and token (PackGQA unpacks here).
    int const l_out = r.l / p.group, h_out = r.h * p.group + r.l % p.group;
    if (p.sink != nullptr) {  // the sink joins the denominator: lse = log(e^lse + e^sink); an empty row gets the sink
      float const s = p.sink[h_out];
      float const hi = fmaxf(lse, s);
      lse = hi == -INFINITY ? -INFINITY : hi + log1pf(expf(-fabsf(lse - s)));
    }

    // The splits that count (weight > 0; NaN weights are dropped), compacted in shared memory.
    int count = 0;
#pragma unroll
    for (int i = 0; i < kLsePerLane; ++i) {
      float const w = finite ? expf(lv[i] - lse) : 0.f;
      bool const live = w > 0.f;
      unsigned const ballot = __ballot_sync(0xffffffffu, live);
      if (live) {
        int const at = count + __popc(ballot & ((1u << lane) - 1u));
        scale_of[warp][at] = w;
        split_of[warp][at] = i * 32 + lane;
      }
      count += __popc(ballot);
    }
    __syncwarp();
    if (live_row && part == 0 && lane == 0) {
      p.lse[(int64_t(r.b) * p.heads * p.group + h_out) * (p.seqlen / p.group) + l_out] = lse;
    }

    float const* o_row = p.o_partial + r.b * p.op_batch_stride + r.l * p.op_row_stride + r.h * p.op_head_stride;
    OutT* out_row = static_cast<OutT*>(p.out) + r.b * p.out_batch_stride + l_out * p.out_row_stride +
                    h_out * p.out_head_stride;
    for (int d0 = 0; d0 < p.head_dim; d0 += kChunk) {
      constexpr int kWidth = kVec4 ? 4 : 1;
      int const d = d0 + kWidth * lane;
      float acc[kWidth] = {};
      if (d < p.head_dim) {
#pragma unroll 4
        for (int i = part; i < count; i += kRowWarps) {
          float const w = scale_of[warp][i];
          float const* src = o_row + split_of[warp][i] * p.op_split_stride + d;
          if constexpr (kVec4) {
            float4 const v = *reinterpret_cast<float4 const*>(src);
            acc[0] += w * v.x;
            acc[1] += w * v.y;
            acc[2] += w * v.z;
            acc[3] += w * v.w;
          } else {
            acc[0] += w * *src;
          }
        }
      }
      if constexpr (kRowWarps > 1) {  // the row's warps add their sums; the first writes
#pragma unroll
        for (int j = 0; j < kWidth; ++j) { partial[warp][kWidth * lane + j] = acc[j]; }
        __syncthreads();
        if (part == 0) {
#pragma unroll
          for (int w = 1; w < kRowWarps; ++w) {
#pragma unroll
            for (int j = 0; j < kWidth; ++j) { acc[j] += partial[warp + w][kWidth * lane + j]; }
          }
        }
        __syncthreads();
      }
      if (live_row && part == 0 && d < p.head_dim) {
#pragma unroll
        for (int j = 0; j < kWidth; ++j) { out_row[d + j] = combine_convert<OutT>(acc[j]); }
      }
    }
    __syncwarp();  // the lists are rewritten by the warp's next row
  }
}

}  // namespace flash
