// Softcap (Gemma 2; FlashAttention-3's semantics): the scaled scores s = scale * q.k become
// softcap * tanh(s / softcap). The kernels take t = tanh(q.k * prescale), prescale = scale /
// softcap, on the raw accumulator before any mask, and run the softmax with softcap in place of
// the scale (FwdParams: softmax_scale_log2 = softcap * log2e). The backward multiplies dS by the
// derivative of the cap, 1 - t^2 (the scale stays on dQ and dK as without softcap).
#pragma once

#include "kernel/common/config.h"

#include <cute/tensor.hpp>

namespace flash {

using namespace cute;

// MUFU.TANH (relative error ~2^-11, as FlashAttention-3's); not volatile, so it schedules freely.
CUTLASS_DEVICE float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// s <- tanh(s * prescale), element-wise over a register tensor.
template <typename TensorS>
CUTLASS_DEVICE void apply_softcap(TensorS& s, float prescale) {
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(s); ++i) { s(i) = tanh_approx(s(i) * prescale); }
}

// s <- t = tanh(s * prescale) and dtanh <- 1 - t^2 (the backward; float32 or fp16, which holds a
// value in [0, 1] to 2^-11 in half the registers), over two tensors of one shape.
template <typename TensorS, typename TensorD>
CUTLASS_DEVICE void cap_scores(TensorS& s, TensorD& dtanh, float prescale) {
  static_assert(decltype(size(s))::value == decltype(size(dtanh))::value);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(s); ++i) {
    float const t = tanh_approx(s(i) * prescale);
    s(i) = t;
    dtanh(i) = static_cast<typename TensorD::value_type>(1.f - t * t);
  }
}

}  // namespace flash
