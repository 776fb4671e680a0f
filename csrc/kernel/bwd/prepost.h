// The small kernels around the backward main kernel:
// - preprocess: per query row, D = rowsum(dO * O) in float32 and LSE in the log2 domain
//   (+inf for rows that see no key and for padding rows, so that their P = exp2(s - LSE2) is 0),
//   and the row's dQ accumulator zeroed; with a sink, the row's term of its gradient;
// - dQ postprocess: the float32 accumulator (in the main kernel's layout) times the softmax scale,
//   into dq in the input dtype.
#pragma once

#include "kernel/common/config.h"

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

#include "kernel/common/policy.h"  // fwd_value_head_dim
#include "kernel/common/seqlen.h"
#include "kernel/common/tile_scheduler.h"  // VarlenTileWalk
#include "params/bwd_params.h"

namespace flash {

using namespace cute;

// kGroup lanes per query row, 16 bytes of O and dO each per lane (kGroup * 8 >= the padded head
// dim); a warp covers 32 / kGroup rows per pass and kPrepPasses passes, all loads issued before
// any arithmetic so that enough bytes are in flight (one row per warp left half the lanes idle)
// [D:044].
constexpr int kPrepWarps = 8;
constexpr int kPrepPasses = 4;

template <int kHeadDim>
constexpr int prep_lanes_per_row() {
  return kHeadDim <= 64 ? 8 : kHeadDim <= 128 ? 16 : 32;
}

template <int kHeadDim>
constexpr int prep_rows_per_cta() {
  return kPrepWarps * kPrepPasses * (32 / prep_lanes_per_row<kHeadDim>());
}

// A row's term of the sink's gradient, -p_sink * D with p_sink = exp(sink - LSE) (the LSE holds
// the sink); 0 for pad rows and rows whose LSE is -inf (no key and a -inf sink).
CUTLASS_DEVICE float sink_grad_term(float sink, float lse, float dsum) {
  return lse == -INFINITY ? 0.f : -__expf(sink - lse) * dsum;
}

// Varlen: sequence bh / heads_q's first row in the packed tensors and in the padded buffers, its
// rows and padded rows.
struct PrepExtent {
  int64_t offset, offset_padded;
  int rows, rows_padded;
};
CUTLASS_DEVICE PrepExtent prep_extent(BwdParams const& p, int64_t bh) {
  VarSeqLen<BwdParams> const seq(p, int(bh / p.heads_q));
  return PrepExtent{seq.offset_q(), seq.template offset_q_padded<kBwdPadM>(), seq.seqlen_q(),
                    (seq.seqlen_q() + kBwdPadM - 1) / kBwdPadM * kBwdPadM};
}

// A grid of resident CTAs striding over the units (prep_rows_per_cta padded query rows of one
// (head, batch)), each warp loading the next unit's O and dO before it reduces the current one, so
// that every SM keeps loads in flight from start to end (one unit per CTA ran in waves of
// load-wait-reduce-exit at half of HBM bandwidth) [D:044].
// Block 0 also zeroes the persistent causal kernel's tile counter (BwdParams::tile_counter), which
// the main kernel, launched next on the stream, draws from. Varlen: unit ids count only the
// sequences' padded rows (VarlenTileWalk over kBwdPadM-row blocks, the units within each block
// next to each other), so that no CTA strides over the longest sequence's rows once per sequence
// (1.7 ms of 12 for one 16k sequence among 64 short ones, [D:068]); a unit's rows are those of its
// sequence (clamped as in seqlen.h), written to the sequence's padded rows (mainloop.h, row_base).
template <typename Element, int kHeadDim, bool kVarlen = false>
__global__ void __launch_bounds__(kPrepWarps * 32)
    flash_bwd_preprocess_kernel(CUTE_GRID_CONSTANT BwdParams const p, int units_per_head, int64_t units) {
  constexpr int kGroup = prep_lanes_per_row<kHeadDim>();
  static_assert(kGroup * 8 >= kHeadDim);
  // out's and dout's head dim: v's where it may be narrower (BwdPolicy::kNarrowV), else q's.
  int const head_dim_o = fwd_value_head_dim<kHeadDim>() != 0 ? p.head_dim_v : p.head_dim;
  constexpr int kRowsPerPass = 32 / kGroup;
  int const lane = threadIdx.x % 32;
  int const d = (lane % kGroup) * 8;  // this lane's 8 columns
  int const warp_row = int(threadIdx.x / 32) * (kPrepPasses * kRowsPerPass) + lane / kGroup;
  if (p.tile_counter != nullptr && blockIdx.x == 0 && threadIdx.x == 0) { *p.tile_counter = 0; }
  struct Unit {
    int64_t bh;     // batch * heads_q + head
    int first_row;  // this lane's padded query row of pass 0
  };

  // Unit id -> its (head, batch) and rows; false past the last unit. Every thread calls it with the
  // same, growing ids (the walk moves forward only).
  [[maybe_unused]] VarlenTileWalk<kBwdPadM, WalkOrder::kBlocksFastest> walk;
  auto decode = [&](int64_t unit, Unit& u) {
    if constexpr (kVarlen) {
      constexpr int kUnitsPerBlock = kBwdPadM / prep_rows_per_cta<kHeadDim>();
      static_assert(kUnitsPerBlock * prep_rows_per_cta<kHeadDim>() == kBwdPadM);
      FwdTile t;
      if (!walk.find(p, int(unit / kUnitsPerBlock), t)) { return false; }
      int const row_block = t.m_block * kUnitsPerBlock + int(unit % kUnitsPerBlock);
      u = Unit{int64_t(t.batch) * p.heads_q + t.head, row_block * prep_rows_per_cta<kHeadDim>() + warp_row};
      return true;
    }
    if (unit >= units) { return false; }
    int const row_block = int(unit % units_per_head);
    u = Unit{unit / units_per_head, row_block * prep_rows_per_cta<kHeadDim>() + warp_row};
    return true;
  };
  auto load = [&](Unit const& u, uint4 (&o_chunk)[kPrepPasses], uint4 (&do_chunk)[kPrepPasses]) {
    int64_t const head = u.bh % p.heads_q, batch = u.bh / p.heads_q;
    if constexpr (kVarlen) {
      PrepExtent const e = prep_extent(p, u.bh);
      auto const* o = static_cast<Element const*>(p.o_ptr) + e.offset * p.o_row_stride + head * p.o_head_stride + d;
      auto const* dout =
          static_cast<Element const*>(p.do_ptr) + e.offset * p.do_row_stride + head * p.do_head_stride + d;
      CUTLASS_PRAGMA_UNROLL
      for (int pass = 0; pass < kPrepPasses; ++pass) {
        int const i = u.first_row + pass * kRowsPerPass;
        o_chunk[pass] = do_chunk[pass] = make_uint4(0, 0, 0, 0);
        if (i < e.rows && d < head_dim_o) {
          o_chunk[pass] = *reinterpret_cast<uint4 const*>(o + i * p.o_row_stride);
          do_chunk[pass] = *reinterpret_cast<uint4 const*>(dout + i * p.do_row_stride);
        }
      }
      return;
    }
    auto const* o = static_cast<Element const*>(p.o_ptr) + batch * p.o_batch_stride + head * p.o_head_stride + d;
    auto const* dout =
        static_cast<Element const*>(p.do_ptr) + batch * p.do_batch_stride + head * p.do_head_stride + d;
    CUTLASS_PRAGMA_UNROLL
    for (int pass = 0; pass < kPrepPasses; ++pass) {
      int const i = u.first_row + pass * kRowsPerPass;
      o_chunk[pass] = do_chunk[pass] = make_uint4(0, 0, 0, 0);
      if (i < p.seqlen_q && d < head_dim_o) {  // head dims are multiples of 8
        o_chunk[pass] = *reinterpret_cast<uint4 const*>(o + i * p.o_row_stride);
        do_chunk[pass] = *reinterpret_cast<uint4 const*>(dout + i * p.do_row_stride);
      }
    }
  };
  // The unit's rows of the dQ accumulator (whole kBwdPadM-row blocks of the main kernel's layout
  // once every unit has run), zeroed here rather than by a fill kernel of their own before the
  // launch, as FA3's preprocess does; the main kernel, next on the stream, adds into them.
  auto clear_dq = [&](Unit const& u) {
    int const row0 = u.first_row - warp_row;
    int64_t base;
    if constexpr (kVarlen) {
      base = int64_t(u.bh % p.heads_q) * p.seqlen_q_padded + prep_extent(p, u.bh).offset_padded + row0;
    } else {
      base = u.bh * p.seqlen_q_padded + row0;
    }
    float4* const dst = reinterpret_cast<float4*>(p.dq_accum_ptr + base * kHeadDim);
    constexpr int kVecs = prep_rows_per_cta<kHeadDim>() * kHeadDim / 4;
    CUTLASS_PRAGMA_UNROLL
    for (int i = int(threadIdx.x); i < kVecs; i += kPrepWarps * 32) { dst[i] = make_float4(0.f, 0.f, 0.f, 0.f); }
  };
  auto finish = [&](Unit const& u, uint4 const (&o_chunk)[kPrepPasses], uint4 const (&do_chunk)[kPrepPasses]) {
    CUTLASS_PRAGMA_UNROLL
    for (int pass = 0; pass < kPrepPasses; ++pass) {
      Element const* oe = reinterpret_cast<Element const*>(&o_chunk[pass]);
      Element const* de = reinterpret_cast<Element const*>(&do_chunk[pass]);
      float dot = 0.f;
      CUTLASS_PRAGMA_UNROLL
      for (int e = 0; e < 8; ++e) { dot += float(oe[e]) * float(de[e]); }
      CUTLASS_PRAGMA_UNROLL
      for (int offset = kGroup / 2; offset > 0; offset /= 2) { dot += __shfl_xor_sync(0xffffffff, dot, offset); }
      int const i = u.first_row + pass * kRowsPerPass;
      if constexpr (kVarlen) {
        PrepExtent const e = prep_extent(p, u.bh);
        if (lane % kGroup == 0 && i < e.rows_padded) {
          int64_t const head = u.bh % p.heads_q;
          float lse = -INFINITY;
          if (i < e.rows) { lse = p.lse_ptr[head * p.varlen.total_q + e.offset + i]; }
          int64_t const row = head * p.seqlen_q_padded + e.offset_padded + i;
          p.dsum_ptr[row] = dot;
          p.lse_log2_ptr[row] = lse == -INFINITY ? INFINITY : lse * float(M_LOG2E);
          if (p.sink_ptr != nullptr) { p.dsink_rows_ptr[row] = sink_grad_term(p.sink_ptr[head], lse, dot); }
        }
        continue;
      }
      if (lane % kGroup == 0 && i < p.seqlen_q_padded) {
        float lse = -INFINITY;  // padding rows and rows that see no key: P = exp2(s - inf) = 0
        if (i < p.seqlen_q) { lse = p.lse_ptr[u.bh * p.seqlen_q + i]; }
        int64_t const row = u.bh * p.seqlen_q_padded + i;
        p.dsum_ptr[row] = dot;
        p.lse_log2_ptr[row] = lse == -INFINITY ? INFINITY : lse * float(M_LOG2E);
        if (p.sink_ptr != nullptr) { p.dsink_rows_ptr[row] = sink_grad_term(p.sink_ptr[u.bh % p.heads_q], lse, dot); }
      }
    }
    clear_dq(u);
  };
  // Two register buffers, alternating: the next unit's loads are in flight during this one's sums.
  uint4 o_a[kPrepPasses], do_a[kPrepPasses], o_b[kPrepPasses], do_b[kPrepPasses];
  int64_t unit = blockIdx.x;
  Unit cur, u_a, u_b;
  if (!decode(unit, cur)) { return; }
  load(cur, o_a, do_a);
  for (;;) {
    bool const more_b = decode(unit + gridDim.x, u_b);
    if (more_b) { load(u_b, o_b, do_b); }
    finish(cur, o_a, do_a);
    if (!more_b) { break; }
    unit += gridDim.x;
    cur = u_b;
    bool const more_a = decode(unit + gridDim.x, u_a);
    if (more_a) { load(u_a, o_a, do_a); }
    finish(cur, o_b, do_b);
    if (!more_a) { break; }
    unit += gridDim.x;
    cur = u_a;
  }
}

// One (query block, head, batch) of the dQ postprocess (below).
template <typename Kernel>
CUTLASS_DEVICE void dq_postprocess_block(BwdParams const& p, int m_block, int head, int batch) {
  using Element = typename Kernel::Element;
  constexpr int kBlockM = Kernel::kBlockM;
  constexpr int kHeadDim = Kernel::kHeadDim;
  constexpr int kThreads = Kernel::kNumMmaThreads;
  constexpr int kPitch = kHeadDim + 8;  // elements; 16 bytes of padding spread the rows over the banks
  __shared__ alignas(16) Element tile[kBlockM * kPitch];
  typename Kernel::TiledMmadQ mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(threadIdx.x);
  Tensor coord = thr_dq.partition_C(make_identity_tensor(typename Kernel::DqTileShape{}));
  constexpr int kAcc = decltype(size(coord))::value;
  static_assert(kAcc == Kernel::kDqAccPerThread);
  float const* block;
  [[maybe_unused]] int rows;            // varlen: the sequence's query rows
  [[maybe_unused]] int64_t dq_offset;   // varlen: its first row in the packed dq
  if constexpr (Kernel::kVarlen) {
    VarSeqLen<BwdParams> const seq(p, batch);
    block = p.dq_accum_ptr + (Kernel::Mainloop::row_base(p, seq, batch, head) + int64_t(m_block) * kBlockM) * kHeadDim;
    rows = seq.seqlen_q();
    dq_offset = seq.offset_q();
  } else {
    block = p.dq_accum_ptr +
            ((int64_t(batch) * p.heads_q + head) * p.seqlen_q_padded + int64_t(m_block) * kBlockM) * kHeadDim;
  }
  float2 acc[kAcc / 2];
  CUTLASS_PRAGMA_UNROLL
  for (int j = 0; j < kAcc / 2; ++j) {
    acc[j] = *reinterpret_cast<float2 const*>(block + Kernel::dq_staged_offset(2 * j, threadIdx.x));
  }
  CUTLASS_PRAGMA_UNROLL
  for (int j = 0; j < kAcc / 2; ++j) {
    Element pair[2] = {Element(acc[j].x * p.softmax_scale), Element(acc[j].y * p.softmax_scale)};
    *reinterpret_cast<uint32_t*>(&tile[get<0>(coord(2 * j)) * kPitch + get<1>(coord(2 * j))]) =
        *reinterpret_cast<uint32_t*>(pair);
  }
  __syncthreads();
  Element* dq;  // this head's rows of the batch entry, or of the sequence in the packed dq
  if constexpr (Kernel::kVarlen) {
    dq = static_cast<Element*>(p.dq_ptr) + dq_offset * p.dq_row_stride + head * p.dq_head_stride;
  } else {
    dq = static_cast<Element*>(p.dq_ptr) + batch * p.dq_batch_stride + head * p.dq_head_stride;
  }
  constexpr int kChunksPerRow = kHeadDim / 8;
  CUTLASS_PRAGMA_UNROLL
  for (int c = threadIdx.x; c < kBlockM * kChunksPerRow; c += kThreads) {
    int const row = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    int const query = m_block * kBlockM + row;
    if (query < (Kernel::kVarlen ? rows : p.seqlen_q) && col < p.head_dim) {  // head dims are multiples of 8: chunks stay whole
      *reinterpret_cast<uint4*>(dq + int64_t(query) * p.dq_row_stride + col) =
          *reinterpret_cast<uint4 const*>(&tile[row * kPitch + col]);
    }
  }
}

// dq = softmax_scale * accumulator. One CTA per (kBlockM-row query block, head, batch), one thread
// per consumer thread of the main kernel: thread t reads the fragment that consumer thread t
// staged (BwdKernel::dq_staged_offset), converts it into a
// row-major tile in shared memory, and the CTA then writes whole rows 16 bytes per thread (the
// fragment's own layout gave 16-byte pieces of 8 rows per warp store: 180 us against cuDNN's
// 56 us at 16k tokens x 2048). dq is allocated by the binding: rows 16-byte aligned.
// Varlen: resident CTAs stride over compact block ids (VarlenTileWalk over the query blocks that
// hold rows), not a grid over the longest sequence for every sequence (226 of 68 us at one 16k
// sequence among 64 short ones, mostly CTAs that found no rows) [D:071].
template <typename Kernel>
__global__ void __launch_bounds__(Kernel::kNumMmaThreads)
    flash_bwd_dq_postprocess_kernel(CUTE_GRID_CONSTANT BwdParams const p) {
  if constexpr (Kernel::kVarlen) {
    VarlenTileWalk<Kernel::kBlockM, WalkOrder::kBlocksFastest> walk;
    FwdTile t;
    for (int id = int(blockIdx.x); walk.find(p, id, t); id += int(gridDim.x)) {
      dq_postprocess_block<Kernel>(p, t.m_block, t.head, t.batch);
      __syncthreads();  // the shared tile is free again
    }
  } else {
    dq_postprocess_block<Kernel>(p, int(blockIdx.x), int(blockIdx.y), int(blockIdx.z));
  }
}

}  // namespace flash
