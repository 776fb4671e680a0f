// Small device helpers shared by the kernels: WGMMA issue, register layout
// conversions between the accumulator and the A operand, quad reductions.
#pragma once

#include "kernel/common/config.h"

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

namespace flash {

using namespace cute;

// Registers a CTA holds for setmaxnreg to share out. Each thread starts with the per-SM file
// (64K) split over the threads of all resident CTAs, rounded down to the allocation unit of 8
// (ptxas reports 168 for 384 threads), at most 256. A warpgroup's setmaxnreg.inc waits until
// the CTA's pool has the registers, so a producer / consumer split must fit this, not 64K per
// SM: with 384 threads the pool is 168 x 384 = 64512 (24 + 2 x 240 fits; 32 + 2 x 240 hung).
constexpr int launch_register_pool(int threads_per_cta, int ctas_per_sm) {
  int const per_thread = 64 * 1024 / (threads_per_cta * ctas_per_sm) / 8 * 8;
  return (per_thread < 256 ? per_thread : 256) * threads_per_cta;
}
static_assert(launch_register_pool(384, 1) == 168 * 384 && launch_register_pool(512, 1) == 128 * 512 &&
              launch_register_pool(256, 2) == 128 * 256);

// K-major shared-memory atom with the widest swizzle (128, 64 or 32 bytes) that kContiguous elements
// per row allow (any tile extent along that dimension must be a multiple of the atom's width).
template <typename Element, int kContiguous>
constexpr auto smem_atom_k_major() {
  constexpr int kBytes = kContiguous * cute::sizeof_bits_v<Element> / 8;
  if constexpr (kBytes % 128 == 0) {
    return GMMA::Layout_K_SW128_Atom<Element>{};
  } else if constexpr (kBytes % 64 == 0) {
    return GMMA::Layout_K_SW64_Atom<Element>{};
  } else {
    return GMMA::Layout_K_SW32_Atom<Element>{};
  }
}

// Issue one warpgroup GEMM over all K blocks of the operands: C (+)= A * B.
// The caller fences and commits; this only sets the accumulate flag per K block.
template <bool kZeroInit, typename TiledMma, typename TA, typename TB, typename TC>
CUTLASS_DEVICE void wgmma_issue(TiledMma& tiled_mma, TA const& tCrA, TB const& tCrB, TC& tCrC) {
  tiled_mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < size<2>(tCrA); ++k) {
    cute::gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), tCrC);
    tiled_mma.accumulate_ = GMMA::ScaleOut::One;
  }
}

// Fence, issue, commit: the GEMM runs asynchronously until warpgroup_wait<N>.
// A in registers (P.V) needs its registers fenced too; A as smem descriptors must not be.
template <bool kZeroInit, typename TiledMma, typename TA, typename TB, typename TC>
CUTLASS_DEVICE void wgmma_async(TiledMma& tiled_mma, TA const& tCrA, TB const& tCrB, TC& tCrC) {
  constexpr bool kARegs = !cute::is_same_v<typename TA::value_type, GMMA::DescriptorIterator::value_type>;
  if constexpr (kARegs) { warpgroup_fence_operand(const_cast<TA&>(tCrA)); }
  warpgroup_fence_operand(tCrC);
  warpgroup_arrive();
  wgmma_issue<kZeroInit>(tiled_mma, tCrA, tCrB, tCrC);
  warpgroup_commit_batch();
  warpgroup_fence_operand(tCrC);
  if constexpr (kARegs) { warpgroup_fence_operand(const_cast<TA&>(tCrA)); }
}

// Fence, issue and commit K blocks [kBegin, kEnd) of one warpgroup GEMM as a commit group of its
// own, so that one GEMM can be issued in two parts (the first before its remaining A registers
// exist). kZeroInit applies to the range's first K block.
template <int kBegin, int kEnd, bool kZeroInit, typename TiledMma, typename TA, typename TB, typename TC>
CUTLASS_DEVICE void wgmma_async_k_range(TiledMma& tiled_mma, TA const& tCrA, TB const& tCrB, TC& tCrC) {
  static_assert(0 <= kBegin && kBegin < kEnd && kEnd <= decltype(size<2>(tCrA))::value);
  constexpr bool kARegs = !cute::is_same_v<typename TA::value_type, GMMA::DescriptorIterator::value_type>;
  // Only the range's A registers are fenced: the rest may still be computed after the issue.
  auto fence_a = [&]() {
    if constexpr (kARegs) {
      CUTLASS_PRAGMA_UNROLL
      for (int k = kBegin; k < kEnd; ++k) {
        auto a_k = const_cast<TA&>(tCrA)(_, _, k);
        warpgroup_fence_operand(a_k);
      }
    }
  };
  fence_a();
  warpgroup_fence_operand(tCrC);
  warpgroup_arrive();
  tiled_mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTLASS_PRAGMA_UNROLL
  for (int k = kBegin; k < kEnd; ++k) {
    cute::gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), tCrC);
    tiled_mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(tCrC);
  fence_a();
}

// The first thread of tidx's warpgroup (tidx counted from the first consumer), warp-uniform: a
// shuffle from lane 0 tells the compiler that every lane holds the same value. WGMMA's shared-memory
// descriptors depend on the warpgroup only, so a TiledMMA spanning several warpgroups, sliced at
// this thread, has them built in uniform registers. Sliced at the thread's own index, the compiler
// built each descriptor in vector registers and moved it with R2UR before every HGMMA (backward,
// hdim 128: 48 R2UR, 54 UMOV among 515 instructions per step and warp) [D:018].
CUTLASS_DEVICE int warpgroup_first_thread(int tidx) {
  int const wg = __shfl_sync(0xffffffff, tidx / cutlass::NumThreadsPerWarpGroup, 0);
  return wg * cutlass::NumThreadsPerWarpGroup;
}

// Whether `pred` holds for every one of `num_threads` threads meeting at hardware barrier
// `hw_id` (a barrier and a vote in one instruction). The id is the hardware's, not
// cutlass::arch::NamedBarrier's (which adds its reserved count).
CUTLASS_DEVICE bool named_barrier_all(bool pred, int hw_id, int num_threads) {
  int result;
  asm volatile(
      "{\n"
      "  .reg .pred p, q;\n"
      "  setp.ne.s32 p, %1, 0;\n"
      "  barrier.red.and.pred q, %2, %3, p;\n"
      "  selp.s32 %0, 1, 0, q;\n"
      "}\n"
      : "=r"(result)
      : "r"(int(pred)), "r"(hw_id), "r"(num_threads));
  return result != 0;
}

// An acquire load from global memory (the deterministic backward's dQ turn counters).
CUTLASS_DEVICE int load_acquire(int const* ptr) {
  int value;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(value) : "l"(ptr) : "memory");
  return value;
}

// The SM90 accumulator fragment of one warpgroup is ((2, 2, N/8), MMA_M, MMA_N):
// mode 0.0 = column pair, 0.1 = row half (+8), 0.2 = 8-column chunk.
// View it as (rows, cols) = ((2, MMA_M), (2, N/8, MMA_N)).
template <typename Layout>
CUTLASS_HOST_DEVICE constexpr auto acc_layout_rowcol(Layout const& acc) {
  static_assert(decltype(rank<0>(acc))::value == 3, "expects an SM90 accumulator layout");
  auto l = acc;
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)),
                     make_layout(get<0, 0>(l), get<0, 2>(l), get<2>(l)));
}

// The same registers as the A operand of a 16-bit WGMMA with K = 16 per block:
// ((2, 2, 2), MMA_M, N/16), where the last 2 of mode 0 is the low bit of the 8-column chunk.
template <typename Layout>
CUTLASS_HOST_DEVICE constexpr auto acc_layout_as_a_operand(Layout const& acc) {
  static_assert(decltype(rank<0>(acc))::value == 3, "expects an SM90 accumulator layout");
  static_assert(decltype(size<0, 2>(acc))::value % 2 == 0, "block N must be a multiple of 16");
  auto chunks = logical_divide(get<0, 2>(acc), Int<2>{});  // (2, N/16)
  return make_layout(make_layout(get<0, 0>(acc), get<0, 1>(acc), get<0>(chunks)),
                     get<1>(acc),
                     coalesce(make_layout(get<1>(chunks), get<2>(acc))));
}

// Element type conversion of a register tensor into another of the same size
// (vectorised: cvt packs pairs for bf16/fp16).
template <typename EngineIn, typename LayoutIn, typename EngineOut, typename LayoutOut>
CUTLASS_DEVICE void convert_into(Tensor<EngineIn, LayoutIn> const& src, Tensor<EngineOut, LayoutOut>& dst) {
  using From = typename EngineIn::value_type;
  using To = typename EngineOut::value_type;
  constexpr int kNumel = decltype(size(src))::value;
  static_assert(kNumel == decltype(size(dst))::value);
  cutlass::NumericArrayConverter<To, From, kNumel> converter;
  *reinterpret_cast<cutlass::Array<To, kNumel>*>(dst.data()) =
      converter(*reinterpret_cast<cutlass::Array<From, kNumel> const*>(src.data()));
}

// Element type conversion of K blocks [kBegin, kEnd) of a float32 A-operand view
// (acc_layout_as_a_operand) into the same blocks of a 16-bit one, a column pair at a time.
template <int kBegin, int kEnd, typename EngineIn, typename LayoutIn, typename EngineOut, typename LayoutOut>
CUTLASS_DEVICE void convert_k_blocks(Tensor<EngineIn, LayoutIn> const& src, Tensor<EngineOut, LayoutOut>& dst) {
  using To = typename EngineOut::value_type;
  static_assert(decltype(size<0, 0>(src))::value == 2, "mode 0.0 is the column pair");
  cutlass::NumericArrayConverter<To, float, 2> converter;
  CUTLASS_PRAGMA_UNROLL
  for (int k = kBegin; k < kEnd; ++k) {
    Tensor s = src(_, _, k);
    Tensor d = dst(_, _, k);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < decltype(size(s))::value / 2; ++i) {
      cutlass::Array<float, 2> in;
      in[0] = s(2 * i);
      in[1] = s(2 * i + 1);
      cutlass::Array<To, 2> const out = converter(in);
      d(2 * i) = out[0];
      d(2 * i + 1) = out[1];
    }
  }
}

// Four consecutive lanes of a warp hold one accumulator row between them.
template <typename Op>
CUTLASS_DEVICE float quad_allreduce(float x, Op op) {
  x = op(x, __shfl_xor_sync(0xffffffff, x, 1));
  x = op(x, __shfl_xor_sync(0xffffffff, x, 2));
  return x;
}

// Lane L of a quad holds in[k], its 4-byte piece (2 columns) of 8-column chunk k of a row,
// k = 0..3; afterwards it holds all of chunk L, pieces in lane order: a 4x4 transpose in two
// butterfly steps of two shuffles each (lane bit 1 swaps the off-diagonal 2x2 blocks, lane bit 0
// transposes each 2x2 block). Used by the backward's dK/dV epilogue and the forward's direct O
// store; a three-shuffle form with lane-dependent indices was slower [D:015].
CUTLASS_DEVICE uint4 quad_transpose(uint32_t const (&in)[4], int lane_in_quad) {
  bool const hi = lane_in_quad & 2, lo = lane_in_quad & 1;
  uint32_t a0 = in[0], a1 = in[1], a2 = in[2], a3 = in[3];
  uint32_t r0 = __shfl_xor_sync(0xffffffffu, hi ? a0 : a2, 2);
  uint32_t r1 = __shfl_xor_sync(0xffffffffu, hi ? a1 : a3, 2);
  if (hi) { a0 = r0; a1 = r1; } else { a2 = r0; a3 = r1; }
  r0 = __shfl_xor_sync(0xffffffffu, lo ? a0 : a1, 1);
  r1 = __shfl_xor_sync(0xffffffffu, lo ? a2 : a3, 1);
  if (lo) { a0 = r0; a2 = r1; } else { a1 = r0; a3 = r1; }
  return make_uint4(a0, a1, a2, a3);
}

struct MaxOp { CUTLASS_DEVICE float operator()(float a, float b) const { return fmaxf(a, b); } };
struct SumOp { CUTLASS_DEVICE float operator()(float a, float b) const { return a + b; } };

}  // namespace flash
