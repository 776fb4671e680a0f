// The small kernels around the backward main kernel:
// - preprocess: per query row, D = rowsum(dO * O) in float32 and LSE in the log2 domain
//   (+inf for rows that see no key and for padding rows, so that their P = exp2(s - LSE2) is 0);
// - dQ postprocess: the float32 accumulator (in the main kernel's layout) times the softmax scale,
//   into dq in the input dtype.
#pragma once

#include "kernel/config.h"

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

#include "flash_bwd_params.h"

namespace flash {

using namespace cute;

// One warp per (batch, head, padded query row); blocks of kPrepWarps warps.
constexpr int kPrepWarps = 8;

template <typename Element>
__global__ void __launch_bounds__(kPrepWarps * 32)
    flash_bwd_preprocess_kernel(CUTE_GRID_CONSTANT BwdParams const p) {
  int const lane = threadIdx.x % 32;
  int64_t const row = int64_t(blockIdx.x) * kPrepWarps + threadIdx.x / 32;  // over (batch, head, padded row)
  int64_t const rows = int64_t(p.batch) * p.heads_q * p.seqlen_q_padded;
  if (row >= rows) { return; }
  int const i = int(row % p.seqlen_q_padded);
  int const head = int((row / p.seqlen_q_padded) % p.heads_q);
  int const batch = int(row / (int64_t(p.seqlen_q_padded) * p.heads_q));
  float dot = 0.f;
  float lse2 = INFINITY;
  if (i < p.seqlen_q) {
    auto const* o = static_cast<Element const*>(p.o_ptr) + batch * p.o_batch_stride + i * p.o_row_stride +
                    head * p.o_head_stride;
    auto const* dout = static_cast<Element const*>(p.do_ptr) + batch * p.do_batch_stride +
                       i * p.do_row_stride + head * p.do_head_stride;
    // 8 elements (16 bytes) per lane and pass; head dims are multiples of 8, rows 16-byte aligned.
    for (int d = lane * 8; d < p.head_dim; d += 32 * 8) {
      uint4 const ov = *reinterpret_cast<uint4 const*>(o + d);
      uint4 const dv = *reinterpret_cast<uint4 const*>(dout + d);
      Element const* oe = reinterpret_cast<Element const*>(&ov);
      Element const* de = reinterpret_cast<Element const*>(&dv);
      CUTLASS_PRAGMA_UNROLL
      for (int e = 0; e < 8; ++e) { dot += float(oe[e]) * float(de[e]); }
    }
    CUTLASS_PRAGMA_UNROLL
    for (int offset = 16; offset > 0; offset /= 2) { dot += __shfl_xor_sync(0xffffffff, dot, offset); }
    float const lse = p.lse_ptr[(int64_t(batch) * p.heads_q + head) * p.seqlen_q + i];
    lse2 = lse == -INFINITY ? INFINITY : lse * float(M_LOG2E);
  }
  if (lane == 0) {
    p.dsum_ptr[row] = dot;
    p.lse_log2_ptr[row] = lse2;
  }
}

// dq = softmax_scale * accumulator. One CTA per (64-row query block, head, batch), one thread per
// consumer thread of the main kernel: thread t reads the fragment that consumer thread t staged
// (pair j of thread t at float2 index j * threads + t of the block) and writes it where it belongs.
template <typename Kernel>
__global__ void __launch_bounds__(Kernel::kNumMmaThreads)
    flash_bwd_dq_postprocess_kernel(CUTE_GRID_CONSTANT BwdParams const p) {
  using Element = typename Kernel::Element;
  constexpr int kBlockM = Kernel::kBlockM;
  constexpr int kHeadDim = Kernel::kHeadDim;
  typename Kernel::TiledMmadQ mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(threadIdx.x);
  Tensor coord = thr_dq.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  constexpr int kPairs = decltype(size(coord))::value / 2;
  int const m_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  float const* block = p.dq_accum_ptr +
      ((int64_t(batch) * p.heads_q + head) * p.seqlen_q_padded + int64_t(m_block) * kBlockM) * kHeadDim;
  auto* dq = static_cast<Element*>(p.dq_ptr) + batch * p.dq_batch_stride + head * p.dq_head_stride;
  CUTLASS_PRAGMA_UNROLL
  for (int j = 0; j < kPairs; ++j) {
    int const row = get<0>(coord(2 * j));
    int const col = get<1>(coord(2 * j));
    float2 const acc = reinterpret_cast<float2 const*>(block)[j * Kernel::kNumMmaThreads + threadIdx.x];
    int const query = m_block * kBlockM + row;
    if (query < p.seqlen_q && col < p.head_dim) {
      Element pair[2] = {Element(acc.x * p.softmax_scale), Element(acc.y * p.softmax_scale)};
      *reinterpret_cast<uint32_t*>(dq + int64_t(query) * p.dq_row_stride + col) = *reinterpret_cast<uint32_t*>(pair);
    }
  }
}

}  // namespace flash
