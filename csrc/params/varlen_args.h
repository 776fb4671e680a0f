// The sequences of a variable-length batch, as the host fills them and the kernels read them
// (kernel/common/seqlen.h). No torch or CUTLASS headers.
#pragma once

namespace flash {

// q, k, v (and o, do, dq, dk, dv) are packed (total, heads, head_dim) tensors. Sequence b's rows:
// [cu_seqlens[b], cu_seqlens[b] + (seqused ? seqused[b] : cu_seqlens[b + 1] - cu_seqlens[b])),
// clamped by the kernels to [0, total] (seqused_q also to its segment, seqused_k to the longest
// key length; kernel/common/seqlen.h). A null cu_seqlens_q means a dense problem.
struct VarlenArgs {
  int const* cu_seqlens_q = nullptr;  // (batch + 1), int32, device
  int const* cu_seqlens_k = nullptr;
  int const* seqused_q = nullptr;  // (batch) or null
  int const* seqused_k = nullptr;
  int total_q = 0;  // rows of the packed tensors
  int total_k = 0;
  bool top_left = false;  // the causal diagonal / window from the top-left corner (else bottom-right)
  int batch = 0;          // sequences
};

}  // namespace flash
