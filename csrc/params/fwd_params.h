// Plain parameters of one forward call, filled by the torch binding and read by
// the host launcher. No torch (and no CUTLASS) headers: kernels build without them.
#pragma once

#include <cstdint>

#include "params/varlen_args.h"

namespace flash {

struct FwdParams {
  // Tensors are (batch, seqlen, heads, head_dim) with a unit head_dim stride.
  void const* q_ptr;
  void const* k_ptr;
  void const* v_ptr;
  void* o_ptr;
  float* lse_ptr;  // (batch, heads_q, seqlen_q), contiguous, natural log

  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;

  int batch;
  int heads_q;
  int heads_kv;     // heads_q % heads_kv == 0 (GQA / MQA)
  int seqlen_q;
  int seqlen_k;
  int head_dim;     // the real head dim (a multiple of 8); the kernel's tile may be wider
  int head_dim_v = 0;  // v's and out's head dim (0: head_dim); != head_dim only where the kernels take it
                      // (policy.h fwd_value_head_dim)

  float softmax_scale;       // multiplies Q.K^T
  float softmax_scale_log2;  // the exp2-domain factor of the kernel's scores: softmax_scale * log2(e),
                             // or softcap * log2(e) with softcap

  // Local (sliding-window) attention, causal included. Query row i sees key j iff
  //   i + diag_offset - window_left <= j <= i + diag_offset + window_right,
  // diag_offset = seqlen_k - seqlen_q (bottom-right aligned, FlashAttention) or 0 (top-left, torch).
  // Unbounded sides are stored as seqlen_q + seqlen_k, so no sum overflows.
  bool is_local;
  int window_left;
  int window_right;
  int diag_offset;
  int num_sms;               // multiprocessors of the device (for the scheduler)
  // A zeroed int of this call's own: the tile counter of dynamic persistent scheduling
  // (persistent causal/local kernels, policy.h fwd_needs_tile_counter); null otherwise.
  int* tile_counter = nullptr;

  // Variable-length batches (varlen.cu_seqlens_q null: dense). q, k, v, o are then packed (total,
  // heads, head_dim) tensors (batch strides unused), batch counts the sequences, seqlen_q / seqlen_k
  // are the longest sequences' lengths (they size the grid), lse is (heads_q, total_q) and the
  // diagonal is per sequence (diag_offset unused).
  VarlenArgs varlen;

  // Softcap (> 0; 0 = off): scores softcap * tanh(softmax_scale * Q.K^T / softcap), taken as
  // tanh(Q.K^T * softcap_prescale) with softcap_prescale = softmax_scale / softcap (kernel/common/softcap.h).
  float softcap;
  float softcap_prescale;

  // Learnable sinks (null: none): float32 (heads_q,), one logit per query head that joins every
  // row's softmax denominator and carries no value; the LSE includes it.
  float const* sink_ptr = nullptr;

  // Split-KV (num_splits > 1): each split writes its partial O, normalised by its own softmax, as
  // float32 (splits, batch, seqlen_q, heads, head_dim) [varlen: (splits, total_q, heads, head_dim)]
  // and its LSE as float32 (splits, batch, heads, seqlen_q) [varlen: (splits, heads, total_q)];
  // the combine kernel then writes o_ptr and lse_ptr (adding the sink, if any). No softcap with splits.
  int num_splits = 1;
  float* oaccum_ptr = nullptr;
  float* lseaccum_ptr = nullptr;
  int64_t oaccum_split_stride = 0, oaccum_batch_stride = 0, oaccum_row_stride = 0, oaccum_head_stride = 0;
  int64_t lseaccum_split_stride = 0;

  // Paged KV cache (page_table null: none), varlen calls only: k_ptr / v_ptr are (num_pages,
  // page_size, heads_kv, d) caches, their batch strides the page strides. Sequence b's key j sits at
  // logical position p = cu_seqlens_k[b] + j of its pages: row p % page_size of page
  // page_table[b * page_table_stride + p / page_size]; varlen.total_k = max_pages * page_size bounds p.
  int const* page_table = nullptr;
  int64_t page_table_stride = 0;
  int page_size = 0;
  int num_pages = 0;

  // qv (null: none; FA3's MLA decode): (batch, seqlen, heads_q, head_dim_v) [varlen: (total_q,
  // heads_q, head_dim_v)] with a unit last stride; the scores are softmax_scale * (q.k^T + qv.v^T).
  // Head dim 64 only, head_dim_v in (64, 512]; no softcap, splits or paged caches.
  void const* qv_ptr = nullptr;
  int64_t qv_batch_stride = 0, qv_row_stride = 0, qv_head_stride = 0;

  // FP8 (e4m3 q, k, v; o bf16): float32 descales (batch, heads_kv) by strides, null = 1. The scores
  // are q_descale * k_descale * Q.K^T, the output v_descale * P.V (FA3's).
  float const* q_descale_ptr = nullptr;
  float const* k_descale_ptr = nullptr;
  float const* v_descale_ptr = nullptr;
  int64_t q_descale_batch_stride = 0, q_descale_head_stride = 0;
  int64_t k_descale_batch_stride = 0, k_descale_head_stride = 0;
  int64_t v_descale_batch_stride = 0, v_descale_head_stride = 0;
};

}  // namespace flash
