// Plain parameters of one backward call, filled by the torch binding. No torch headers.
#pragma once

#include <cstdint>

#include "params/varlen_args.h"

namespace flash {

// Query rows per main-loop step of the backward kernel (kernel/common/policy.h, bwd_tile): 128
// for head dims <= 64, 64 above. The binding pads the per-row float32 buffers (LSE, D, dQ
// accumulator) to a multiple of kBwdPadM, which every head dim's step divides, and sizes the
// deterministic mode's per-block counters for the smallest step.
constexpr int kBwdPadM = 128;
constexpr int kBwdMinBlockM = 64;

struct BwdParams {
  // (batch, seqlen, heads, head_dim) with a unit head_dim stride.
  void const* q_ptr;
  void const* k_ptr;
  void const* v_ptr;
  void const* do_ptr;
  void const* o_ptr;       // the forward's output, (batch, seqlen_q, heads_q, head_dim), 16-byte aligned rows
  float const* lse_ptr;    // the forward's LSE, (batch, heads_q, seqlen_q) contiguous
  void* dq_ptr;  // (batch, seqlen_q, heads_q, head_dim) with a unit last stride
  void* dk_ptr;  // (batch, seqlen_k, heads_kv, head_dim), contiguous
  void* dv_ptr;
  // Workspaces. dq_accum: (batch, heads_q, seqlen_q_padded / kBwdBlockM) blocks of kBwdBlockM x head_dim_rounded
  // float32, zeroed by the preprocess kernel, unscaled, in the order the kernel chooses (kernel/bwd/dq_reducer.h).
  float* dq_accum_ptr;
  float* lse_log2_ptr;  // (batch, heads_q, seqlen_q_padded): LSE * log2(e), +inf for empty/pad rows (preprocess)
  float* dsum_ptr;      // (batch, heads_q, seqlen_q_padded): rowsum(dO * O), 0 for pad rows (preprocess)
  // deterministic mode: (batch, heads_q, seqlen_q_padded / kBwdBlockM) zeroed counters that order
  // the key blocks' dQ additions; nullptr otherwise.
  int* dq_semaphore_ptr;
  // An int the persistent causal/local kernel draws its tiles from (policy.h,
  // bwd_needs_tile_counter), zeroed by the preprocess kernel launched before it; nullptr otherwise.
  int* tile_counter = nullptr;

  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t do_batch_stride, do_row_stride, do_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;

  int batch;
  int heads_q;
  int heads_kv;
  int seqlen_q;
  int seqlen_q_padded;
  int seqlen_k;
  int head_dim;
  int head_dim_rounded;
  int num_sms;  // multiprocessors of the device (the persistent kernel's grid)

  float softmax_scale;       // multiplies dQ and dK
  float softmax_scale_log2;  // as FwdParams (softcap * log2(e) with softcap)

  // Same window semantics as FwdParams.
  bool is_local;
  int window_left;
  int window_right;
  int diag_offset;

  // Variable-length batches, as in FwdParams. The per-row float32 buffers are then (heads_q,
  // seqlen_q_padded) with each sequence at its own kBwdPadM-aligned rows (seqlen.h), seqlen_q_padded
  // = total_q + batch * kBwdPadM rounded up to kBwdPadM; dq, dk, dv are packed like q, k, v.
  VarlenArgs varlen;

  float softcap;  // as FwdParams
  float softcap_prescale;

  int head_dim_v;  // v's, out's, dout's and dv's: head_dim, or narrower (dv != d; BwdPolicy::kNarrowV)

  // Learnable sinks (null: none): the forward's float32 (heads_q,) logits, and per padded row (as
  // dsum) the row's term of the sink's gradient, -exp(sink - LSE) * D, 0 on pad rows (preprocess).
  float const* sink_ptr = nullptr;
  float* dsink_rows_ptr = nullptr;
};

}  // namespace flash
