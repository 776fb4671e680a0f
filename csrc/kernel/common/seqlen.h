// Where batch entry b's queries and keys are and how many there are: the one place the kernels
// learn a sequence's extent. Dense problems read the parameters' fixed sizes (every access a
// read of the kernel parameters, as before this object existed); variable-length ones read
// cu_seqlens / seqused once per tile, clamped to the packed tensors, so that no contents of those
// arrays can make a kernel touch memory outside q, k, v or the outputs.
#pragma once

#include "kernel/common/config.h"

#include <type_traits>

#include <cutlass/cutlass.h>

#include "params/varlen_args.h"

namespace flash {

struct NoVarlen {};

// Dense: every batch entry has the parameters' seqlen_q / seqlen_k rows, at batch coordinate b. An
// empty object: each accessor is the same read of the kernel parameters as before it existed.
template <typename Params>
struct FixedSeqLen {
  CUTLASS_DEVICE FixedSeqLen(Params const& /*params*/, int /*batch*/) {}
  CUTLASS_DEVICE static int seqlen_q(Params const& params) { return params.seqlen_q; }
  CUTLASS_DEVICE static int seqlen_k(Params const& params) { return params.seqlen_k; }
  CUTLASS_DEVICE static int diag(Params const& params) { return params.diag_offset; }
  CUTLASS_DEVICE static int offset_q(Params const&) { return 0; }
  CUTLASS_DEVICE static int offset_k(Params const&) { return 0; }
};

// A variable-length sequence's extent as VarSeqLen reads it, in a form that travels through shared
// memory (the forward's tile ring hands it from the producer to the consumers).
struct SeqExtent {
  int offset_q_, offset_k_, seqlen_q_, seqlen_k_, diag_, batch_;
};

// Variable length: sequence b's queries are rows [offset_q, offset_q + seqlen_q) of the packed
// (total_q, ...) tensors, its keys rows [offset_k, offset_k + seqlen_k) of (total_k, ...).
// Offsets and ends are clamped to [0, total]. seqused_q, where given, is clamped to the segment
// (the backward's per-row buffers need the queries' segments apart); seqused_k is the keys'
// length from cu_seqlens_k[b] as FA3 reads it, so those offsets need not be in order (a KV cache
// whose entries a batch index picks), at most the call's longest key length.
template <typename Params>
struct VarSeqLen : SeqExtent {
  CUTLASS_HOST_DEVICE static void segment(int const* cu, int const* used, int b, int total, int& offset, int& length) {
    int const begin = min(max(cu[b], 0), total);
    int const end = min(max(cu[b + 1], begin), total);
    offset = begin;
    length = end - begin;
    if (used != nullptr) { length = min(max(used[b], 0), length); }
  }
  CUTLASS_HOST_DEVICE static void key_segment(int const* cu, int const* used, int b, int total, int max_len,
                                              int& offset, int& length) {
    if (used == nullptr) { return segment(cu, used, b, total, offset, length); }
    offset = min(max(cu[b], 0), total);
    length = min(max(used[b], 0), min(max_len, total - offset));
  }
  CUTLASS_HOST_DEVICE explicit VarSeqLen(SeqExtent const& e) : SeqExtent(e) {}
  CUTLASS_HOST_DEVICE VarSeqLen(Params const& p, int b) {
    VarlenArgs const& v = p.varlen;
    segment(v.cu_seqlens_q, v.seqused_q, b, v.total_q, offset_q_, seqlen_q_);
    key_segment(v.cu_seqlens_k, v.seqused_k, b, v.total_k, p.seqlen_k, offset_k_, seqlen_k_);
    diag_ = v.top_left ? 0 : seqlen_k_ - seqlen_q_;
    batch_ = b;
  }
  template <typename... P>
  CUTLASS_HOST_DEVICE int seqlen_q(P const&...) const { return seqlen_q_; }
  template <typename... P>
  CUTLASS_HOST_DEVICE int seqlen_k(P const&...) const { return seqlen_k_; }
  template <typename... P>
  CUTLASS_HOST_DEVICE int diag(P const&...) const { return diag_; }
  template <typename... P>
  CUTLASS_HOST_DEVICE int offset_q(P const&...) const { return offset_q_; }
  template <typename... P>
  CUTLASS_HOST_DEVICE int offset_k(P const&...) const { return offset_k_; }
  // The backward's per-row float32 buffers give each sequence its own kPadRows-aligned rows, at
  // most kPadRows - 1 of padding before each: sequence b's start (rounded down) plus b * kPadRows.
  // Within the buffers' total_q + batch * kPadRows rows whatever the offsets are.
  template <int kPadRows>
  CUTLASS_HOST_DEVICE int offset_q_padded() const {
    return (offset_q_ + batch_ * kPadRows) / kPadRows * kPadRows;
  }
};

template <bool kVarlen, typename Params>
using SeqLenFor = std::conditional_t<kVarlen, VarSeqLen<Params>, FixedSeqLen<Params>>;

}  // namespace flash
