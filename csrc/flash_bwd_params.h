// Plain parameters of one backward call, filled by the torch binding. No torch headers.
#pragma once

#include <cstdint>

namespace flash {

// Query rows per main-loop step of the backward kernel; the binding pads the per-row
// float32 buffers (LSE, D, dQ accumulator) to a multiple of it.
constexpr int kBwdBlockM = 64;

struct BwdParams {
  // (batch, seqlen, heads, head_dim) with a unit head_dim stride.
  void const* q_ptr;
  void const* k_ptr;
  void const* v_ptr;
  void const* do_ptr;
  void* dk_ptr;  // (batch, seqlen_k, heads_kv, head_dim), contiguous
  void* dv_ptr;
  float* dq_accum_ptr;     // (batch, heads_q, seqlen_q_padded, head_dim_rounded), zeroed, unscaled
  float const* lse_log2_ptr;  // (batch, heads_q, seqlen_q_padded): LSE * log2(e), +inf for empty/pad rows
  float const* dsum_ptr;      // (batch, heads_q, seqlen_q_padded): rowsum(dO * O), 0 for pad rows
  // deterministic mode: (batch, heads_q, seqlen_q_padded / kBwdBlockM) zeroed counters that order
  // the key blocks' dQ additions; nullptr otherwise.
  int* dq_semaphore_ptr;

  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t do_batch_stride, do_row_stride, do_head_stride;

  int batch;
  int heads_q;
  int heads_kv;
  int seqlen_q;
  int seqlen_q_padded;
  int seqlen_k;
  int head_dim;
  int head_dim_rounded;

  float softmax_scale;
  float softmax_scale_log2;

  // Same window semantics as FwdParams.
  bool is_local;
  int window_left;
  int window_right;
  int diag_offset;
};

}  // namespace flash
