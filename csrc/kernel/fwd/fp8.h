// The FP8 (e4m3) forward's own pieces (FwdPolicy::kFp8): the descales, P quantized into the A
// operand of the FP8 P.V WGMMA, and V transposed in shared memory by the producer warpgroup (FP8
// WGMMA reads both operands K-major, and V arrives keys-outermost).
//
// P's layout. A warpgroup's float32 S accumulator gives lane q of a quad, per 8 keys, the column
// pair 2q, 2q + 1 of two rows; the e4m3 A operand wants, per 32 keys, 4 consecutive K indices 4q..4q+3
// (and 16 + 4q..) of the same rows. Renaming registers instead of shuffling them across lanes, A's
// K index 4q + i of each 16 holds key 2q + (i & 1) + 8 (i >> 1): the keys of P.V's K dimension are
// permuted within every 16, and V^T is written in that order (transpose_v).
//
// O's layout. V^T's rows (V's columns) are permuted within every 16 too: column 2c + e is row
// 8e + c, so that each 8-row matrix a stmatrix writes holds 8 consecutive rows, one
// per 16-byte bank group of the swizzle (the unpermuted even / odd rows meet twice per bank group).
// P.V's accumulator then holds in lane q's column pair 2q, 2q + 1 of each 16 O's columns 4q, 4q + 2,
// and in 8 + 2q, 9 + 2q columns 4q + 1, 4q + 3 (the epilogue stores them so).
#pragma once

#include "kernel/common/config.h"

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_conversion.h>

namespace flash {

using namespace cute;

// q / k / v descales, float32 (batch, heads_kv) by strides (FA3's), null = 1: the scores are
// (q_descale k_descale) Q.K^T, the output v_descale P.V.
struct Fp8Args {
  float const* q_descale;
  float const* k_descale;
  float const* v_descale;
  int64_t q_batch_stride, q_head_stride, k_batch_stride, k_head_stride, v_batch_stride, v_head_stride;

  CUTLASS_DEVICE static float at(float const* ptr, int64_t batch_stride, int64_t head_stride, int batch, int head) {
    return ptr == nullptr ? 1.f : ptr[batch * batch_stride + head * head_stride];
  }
  CUTLASS_DEVICE float qk(int batch, int head_kv) const {
    return at(q_descale, q_batch_stride, q_head_stride, batch, head_kv) *
           at(k_descale, k_batch_stride, k_head_stride, batch, head_kv);
  }
  CUTLASS_DEVICE float v(int batch, int head_kv) const {
    return at(v_descale, v_batch_stride, v_head_stride, batch, head_kv);
  }
};
struct NoFp8 {};

// P's e4m3 A-operand fragment for a warpgroup's 64 rows by kBlockN keys: ((4, 2, 2), 1, N/32).
template <int kBlockN>
CUTLASS_HOST_DEVICE constexpr auto fp8_p_layout() {
  return make_layout(make_shape(make_shape(_4{}, _2{}, _2{}), _1{}, Int<kBlockN / 32>{}));
}

// One warpgroup's S accumulator ((2, 2, N/8), 1, 1), float32, into P's e4m3 A operand
// ((4, 2, 2), 1, N/32): per 32 keys and row half, the two column pairs of 8-key groups 2j and 2j + 1
// make 4 bytes (cvt.rn.satfinite: p <= 2^(kMaxOffset + the lazy slack) = 445.7 stays inside e4m3's 448).
template <typename TensorS, typename TensorP>
CUTLASS_DEVICE void quantize_p(TensorS const& acc, TensorP& p) {
  constexpr int kNumel = decltype(size(acc))::value;
  static_assert(kNumel == decltype(size(p))::value && kNumel % 16 == 0, "32-key blocks of a 64-row warpgroup");
  cutlass::NumericArrayConverter<cutlass::float_e4m3_t, float, 4> convert;
  uint32_t* const out = reinterpret_cast<uint32_t*>(p.data());
  CUTLASS_PRAGMA_UNROLL
  for (int word = 0; word < kNumel / 4; ++word) {  // word = 4 kb + 2 half + row_half
    int const row_half = word & 1, group = 2 * (word >> 1);  // 8-key groups `group`, `group` + 1
    cutlass::Array<float, 4> in;
    in[0] = acc(4 * group + 2 * row_half);
    in[1] = acc(4 * group + 2 * row_half + 1);
    in[2] = acc(4 * (group + 1) + 2 * row_half);
    in[3] = acc(4 * (group + 1) + 2 * row_half + 1);
    cutlass::Array<cutlass::float_e4m3_t, 4> const q = convert(in);
    out[word] = reinterpret_cast<uint32_t const&>(q);
  }
}

// V^T's offset of key k0 + 16 j in row r from that of key k0, with swizzle atoms kW bytes wide:
// (offset(r, k0) XOR (16 j mod kW)) + a_j, where a_j = offset(0, 16 j) - 16 j mod kW steps over whole
// atoms. vt_xor_width: the atom width (128, 64 or 32) for which this holds for every row, every warp's
// first key k0 (multiples of kKeys) and j < kKeys / 16, else 0. A lane's stores then step by one XOR
// of its first address, the atom step riding in the store's immediate.
template <typename LayoutVt, int kW>
constexpr int vt_atom_step(int j) {
  return int(LayoutVt{}(0, 16 * j)) - (16 * j) % kW;
}
template <typename LayoutVt, int kBlockN, int kKeys, int kW>
constexpr bool vt_keys_xor() {
  for (int r = 0; r < 32; ++r) {
    for (int k0 = 0; k0 < kBlockN; k0 += kKeys) {
      for (int j = 0; j < kKeys / 16; ++j) {
        int const expect = (int(LayoutVt{}(r, k0)) ^ ((16 * j) % kW)) + vt_atom_step<LayoutVt, kW>(j);
        if (int(LayoutVt{}(r, k0 + 16 * j)) != expect) { return false; }
      }
    }
  }
  return true;
}
template <typename LayoutVt, int kBlockN, int kKeys>
constexpr int vt_xor_width() {
  return vt_keys_xor<LayoutVt, kBlockN, kKeys, 128>()  ? 128
         : vt_keys_xor<LayoutVt, kBlockN, kKeys, 64>() ? 64
         : vt_keys_xor<LayoutVt, kBlockN, kKeys, 32>() ? 32
                                                       : 0;
}

// A landed V stage (N, dv) into V^T (dv, N) by the producer warpgroup, in units of 16 keys by 32
// columns per warp: ldmatrix.trans (b16) gives lane (q, c) = (lane % 4, lane / 4), per 8 keys and 16
// bytes, the bytes of keys 2q, 2q + 1 at columns 2c, 2c + 1; two byte permutes make the words of
// V^T rows 2c and 2c + 1 holding keys 2q, 2q + 1, 8 + 2q, 9 + 2q (K indices 4q..4q + 3, as P's),
// and stmatrix writes them, the even and odd columns as separate 8 x 16-byte matrices (rows 0-7 and
// 8-15 of V^T's 16, see O's layout above: no bank conflicts). A warp keeps its columns and walks the
// keys, so its loads step by a constant (16 rows of V's swizzled layout).
template <int kBlockN, int kHeadDimV, typename LayoutV, typename LayoutVt, typename Element>
CUTLASS_DEVICE void transpose_v(Element const* sv, Element* svt, int tid) {
  constexpr int kKeyGroups = kBlockN / 16, kColGroups = kHeadDimV / 32;
  // Column groups per warp (dv >= 128), or warps per column group (dv 64), each a share of the keys.
  constexpr int kWarpsPerCol = kColGroups >= 4 ? 1 : 4 / kColGroups;
  constexpr int kColsPerWarp = kColGroups >= 4 ? kColGroups / 4 : 1;
  constexpr int kKeysPerWarp = kKeyGroups / kWarpsPerCol;
  static_assert(kColGroups % 4 == 0 || 4 % kColGroups == 0);
  static_assert(kKeyGroups % kWarpsPerCol == 0, "key groups spread evenly over a column's warps");
  LayoutV const layout_v{};    // (N, dv) offsets of one stage
  LayoutVt const layout_vt{};  // (dv, N)
  constexpr int kRowStep = LayoutV{}(16, 0) - LayoutV{}(0, 0);  // 16 rows further
  static_assert(LayoutV{}(23, 48) - LayoutV{}(7, 48) == kRowStep && LayoutV{}(21, 16) - LayoutV{}(5, 16) == kRowStep,
                "the swizzle repeats every 16 rows");
  constexpr int kXorW = vt_xor_width<LayoutVt, kBlockN, 16 * kKeysPerWarp>();
  int const warp = tid / 32, lane = tid % 32;
  int const matrix = lane / 8, row = lane % 8;
  int const load_key = 8 * (matrix & 1) + row, load_col = 16 * (matrix >> 1);   // ldmatrix's row
  int const store_row = 16 * (matrix >> 1) + 8 * (matrix & 1) + row;           // V^T's row of column 2 row + (matrix & 1)
  int const key_first = 16 * kKeysPerWarp * (warp / (4 / kWarpsPerCol) % kWarpsPerCol);
  // 32-bit shared-memory addresses: one register each, the constant steps in the instructions' immediates.
  uint32_t const src = cast_smem_ptr_to_uint(sv), dst = cast_smem_ptr_to_uint(svt);
  CUTLASS_PRAGMA_UNROLL  // dv 256: both column groups' addresses at once (the producer's counter state left room) [D:089]
  for (int c = 0; c < kColsPerWarp; ++c) {
    int const col0 = 32 * (kWarpsPerCol == 1 ? warp + 4 * c : warp % kColGroups);
    uint32_t const load = src + layout_v(key_first + load_key, col0 + load_col);
    // kXorW: the stage is 1024-byte aligned, so XOR-ing the shared address XORs the offset.
    uint32_t const store0 = dst + layout_vt(col0 + store_row, key_first);
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kKeysPerWarp; ++j) {
      uint32_t r[4];
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                   : "r"(load + j * kRowStep));
      uint32_t const w0 = __byte_perm(r[0], r[1], 0x6420), w1 = __byte_perm(r[0], r[1], 0x7531);
      uint32_t const w2 = __byte_perm(r[2], r[3], 0x6420), w3 = __byte_perm(r[2], r[3], 0x7531);
      uint32_t store;
      if constexpr (kXorW > 0) {
        store = (store0 ^ ((16 * j) % kXorW)) + vt_atom_step<LayoutVt, kXorW>(j);
      } else {
        store = dst + layout_vt(col0 + store_row, key_first + 16 * j);
      }
      asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(store), "r"(w0),
                   "r"(w1), "r"(w2), "r"(w3));
    }
  }
}

}  // namespace flash
