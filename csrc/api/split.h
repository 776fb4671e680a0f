// Split-KV forward calls: how many splits, the partial buffers, and the combine that turns them
// into the call's out and LSE. Included by flash_api.cpp after api/checks.h and api/combine_op.h.
#pragma once

#include <algorithm>

#include "kernel/common/policy.h"  // fwd_split_tile
#include "params/combine_params.h"
#include "params/fwd_params.h"

namespace {

// The grid's batch dimension (batch x splits) is at most this (CUDA's grid y / z bound).
constexpr int64_t kMaxGridBatches = 65535;

// The split kernels' key block for a (rounded) head dim; FP8 split kernels have their own tile.
int split_block_n(int head_dim_rounded, bool fp8) {
  if (fp8) { return head_dim_rounded <= 128 ? flash::fwd_fp8_split_tile<128>().block_n : flash::fwd_fp8_split_tile<256>().block_n; }
  switch (head_dim_rounded) {
    case 64: return flash::fwd_split_tile<64>().block_n;
    case 96: return flash::fwd_split_tile<96>().block_n;
    case 128: return flash::fwd_split_tile<128>().block_n;
    case 192: return flash::fwd_split_tile<192>().block_n;
    default: return flash::fwd_split_tile<256>().block_n;
  }
}

// How many splits a call runs with. requested: 1 none, 0 choose, n > 1 at most n. Never with
// softcap (its kernels are unsplit; the result does not depend on the splits), and
// never more than the key blocks, 256 (the combine's bound) or the grid's batch dimension allows.
// Choosing: only when the query tiles fill less than 80 % of the SMs and there are at least 4 key
// blocks (below that the combine costs more than the split saves), as many splits as fit in one
// wave (the split kernels hold one CTA per SM), down to one key block each (FA3's bound).
int choose_splits(int64_t requested, int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                  int head_dim_rounded, bool unsplittable, int num_sms, bool fp8 = false) {
  FLASH_CHECK(requested >= 0, "flash_attn_hopper: num_splits must be >= 0 (0: choose), got ", requested);
  if (requested == 1 || unsplittable || batch == 0 || seqlen_q == 0 || seqlen_k == 0) { return 1; }
  int64_t const block_n = split_block_n(head_dim_rounded, fp8);
  int64_t const n_blocks = (seqlen_k + block_n - 1) / block_n;
  int64_t const tiles = (seqlen_q + 127) / 128 * heads_q * batch;
  int64_t splits = requested;
  if (requested == 0) {
    if (tiles * 5 >= int64_t(num_sms) * 4 || n_blocks < 4) { return 1; }
    splits = std::min<int64_t>(num_sms / tiles, n_blocks);
  }
  splits = std::min<int64_t>({splits, n_blocks, flash::kCombineMaxSplits, kMaxGridBatches / std::max<int64_t>(batch, 1)});
  return splits >= 2 ? int(splits) : 1;
}

// The partial buffers of a split call, its params' split fields, and the combine into o_ptr /
// lse_ptr afterwards. rows: batch x seqlen_q (dense) or total_q (varlen, batch 1 in the buffers).
struct SplitRun {
  Tensor oaccum, lseaccum;
  flash::CombineParams combine{};

  SplitRun(flash::FwdParams& params, Tensor const& like, int splits, bool varlen, int64_t batch, int64_t rows,
           int64_t heads, int64_t head_dim, Tensor const& out, int64_t out_row_stride, int64_t out_head_stride,
           int64_t out_batch_stride, int group = 1) {
    // A sink joins the combine, not the splits (each split's softmax is its own).
    int64_t const seqlen = rows / batch;
    oaccum = empty_like_dev(like, {splits, batch, seqlen, heads, head_dim}, kFloat);
    lseaccum = empty_like_dev(like, {splits, batch, heads, seqlen}, kFloat);
    // Varlen rows past seqused_q are not written: -inf makes them 0. Rows outside every sequence
    // the combine knows from cu_seqlens_q (below), with no fill kernel.
    if (varlen && params.varlen.seqused_q != nullptr) {
      torch::stable::fill_(lseaccum, -std::numeric_limits<float>::infinity());
    }
    params.num_splits = splits;
    params.oaccum_ptr = oaccum.mutable_data_ptr<float>();
    params.lseaccum_ptr = lseaccum.mutable_data_ptr<float>();
    params.oaccum_split_stride = oaccum.stride(0);
    params.oaccum_batch_stride = oaccum.stride(1);
    params.oaccum_row_stride = oaccum.stride(2);
    params.oaccum_head_stride = oaccum.stride(3);
    params.lseaccum_split_stride = lseaccum.stride(0);

    flash::CombineParams& c = combine;
    c.o_partial = params.oaccum_ptr;
    c.op_split_stride = oaccum.stride(0);
    c.op_batch_stride = oaccum.stride(1);
    c.op_row_stride = oaccum.stride(2);
    c.op_head_stride = oaccum.stride(3);
    c.lse_partial = params.lseaccum_ptr;  // (splits, batch, heads, seqlen) read as (splits, batch, seqlen, heads)
    c.lp_split_stride = lseaccum.stride(0);
    c.lp_batch_stride = lseaccum.stride(1);
    c.lp_row_stride = lseaccum.stride(3);
    c.lp_head_stride = lseaccum.stride(2);
    c.out = out.data_ptr();
    c.out_batch_stride = out_batch_stride;
    c.out_row_stride = out_row_stride;
    c.out_head_stride = out_head_stride;
    c.lse = params.lse_ptr;  // (batch, heads, seqlen): the call's LSE layout, dense and varlen alike
    c.splits = splits;
    c.batch = int(batch);
    c.seqlen = int(seqlen);
    c.heads = int(heads);
    c.head_dim = int(head_dim);
    c.vec4 = head_dim % 4 == 0;  // fresh float32 buffers: aligned, strides multiples of 4 with it
    c.num_sms = params.num_sms;
    c.sink = params.sink_ptr;
    if (varlen) {
      c.cu_seqlens = params.varlen.cu_seqlens_q;
      c.cu_count = params.varlen.batch;
    }
    c.group = group;
  }

  void finish(bool is_bf16, cudaStream_t stream) const {
    flash::run_combine(combine, is_bf16 ? flash::CombineOut::kBFloat16 : flash::CombineOut::kHalf, stream);
  }
};

}  // namespace
