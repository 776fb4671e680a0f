// Paged KV cache loads: the producer warpgroup gathers a key block's K or V rows from the cache's
// pages with cp.async (16 bytes per copy), looking each row's page up in the page table. TMA
// cannot: a block of kBlockN keys spans pages of any size (1 to beyond kBlockN), each somewhere
// else. Rows past the sequence's keys are zero-filled (a zero V row times a masked P is 0, where
// stale cache contents could be NaN); page numbers are clamped to the cache, so no page-table
// contents make a load leave it.
#pragma once

#include "kernel/common/config.h"

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/fast_math.h>

namespace flash {

using namespace cute;

// The cache as the kernel reads it: (num_pages, page_size, heads_kv, d) K and V with these element
// strides, sequence b's pages in row b of the page table.
struct PagedKVParams {
  void const* k = nullptr;
  void const* v = nullptr;
  int64_t k_page_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_page_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int const* page_table = nullptr;
  int64_t page_table_stride = 0;  // between sequences
  cutlass::FastDivmod page_size;
  int num_pages = 1;
  int head_dim = 0;  // the real head dim (a multiple of 8): columns past it are zero-filled, not read
};

struct NoPagedKV {};

template <typename Element, int kBlockN, int kHeadDim>
struct PagedKVLoader {
  static constexpr int kThreads = cutlass::NumThreadsPerWarpGroup;
  static constexpr int kElems = 16 / int(sizeof(Element));  // elements per cp.async
  // The threads of a row read one 128-byte line (64 or 32 where the row is no multiple of 128 B):
  // consecutive threads, coalesced, and a row's page looked up by few threads.
  static constexpr int kRowBytes = kHeadDim * int(sizeof(Element));
  static constexpr int kLineBytes = kRowBytes % 128 == 0 ? 128 : kRowBytes % 64 == 0 ? 64 : 32;
  static constexpr int kThreadsPerRow = kLineBytes / 16;
  static constexpr int kRowsPerPass = kThreads / kThreadsPerRow;
  static_assert(kBlockN % kRowsPerPass == 0, "each thread loads the same number of rows");
  static constexpr int kRows = kBlockN / kRowsPerPass;  // rows per thread and block
  static_assert(kRows <= kThreadsPerRow, "a row's threads look up one of their rows' pages each");
  using TiledCopy = decltype(make_tiled_copy(
      Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>, Element>{},
      Layout<Shape<Int<kRowsPerPass>, Int<kThreadsPerRow>>, Stride<Int<kThreadsPerRow>, _1>>{},
      Layout<Shape<_1, Int<kElems>>>{}));

  PagedKVParams const& p;
  int const* pages;  // this sequence's row of the page table
  int first;         // the logical position of the sequence's key 0 in its pages
  int seqlen_k;
  int tid;           // 0..127 in the producer warpgroup

  CUTLASS_DEVICE PagedKVLoader(PagedKVParams const& params, int batch, int first_key, int keys, int thread)
      : p(params), pages(params.page_table + batch * params.page_table_stride), first(first_key), seqlen_k(keys),
        tid(thread) {}

  // cp.async of key block n of K (kKeys) or V of head `head_kv` into the (kBlockN, kHeadDim) shared
  // tile; the caller arrives on the stage's barrier when these copies complete.
  template <bool kKeys, typename SmemTile>
  CUTLASS_DEVICE void load(int n, int head_kv, SmemTile&& tile) const {
    TiledCopy tiled_copy;
    auto thr_copy = tiled_copy.get_thread_slice(tid);
    Tensor coords = thr_copy.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
    Tensor dst = thr_copy.partition_D(tile);  // (CPY, rows, column chunks)
    static_assert(decltype(size<1>(dst))::value == kRows);
    Element const* const base = static_cast<Element const*>(kKeys ? p.k : p.v) +
                                head_kv * (kKeys ? p.k_head_stride : p.v_head_stride);
    int64_t const page_stride = kKeys ? p.k_page_stride : p.v_page_stride;
    int64_t const row_stride = kKeys ? p.k_row_stride : p.v_row_stride;
    // The threads of a row group (consecutive lanes) share their rows: thread c of the group looks
    // up the page of the group's c-th row (one page-table read and division per thread and block,
    // as FA3's PagedKVManager), the others take it with a shuffle.
    int const c = tid % kThreadsPerRow;
    int const group_lane = threadIdx.x % cutlass::NumThreadsPerWarp - c;
    int my_page = 0, my_in_page = 0;
    if (c < kRows) {
      int const key = n * kBlockN + get<0>(coords(_0{}, c, _0{}));
      int const slot = p.page_size.divmod(my_in_page, first + key);
      my_page = key < seqlen_k ? min(max(pages[slot], 0), p.num_pages - 1) : 0;
    }
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < kRows; ++m) {
      int const key = n * kBlockN + get<0>(coords(_0{}, m, _0{}));
      bool const valid = key < seqlen_k;
      int const page = __shfl_sync(0xffffffff, my_page, group_lane + m);
      int const in_page = __shfl_sync(0xffffffff, my_in_page, group_lane + m);
      Element const* const row = base + (valid ? int64_t(page) * page_stride + int64_t(in_page) * row_stride : 0);
      Tensor src = tiled_divide(make_tensor(make_gmem_ptr(row), Shape<Int<kHeadDim>>{}), Shape<Int<kElems>>{});
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < size<2>(dst); ++c) {
        int const col = get<1>(coords(_0{}, m, c));
        copy(tiled_copy.with(valid && col < p.head_dim), src(_, col / kElems), dst(_, m, c));
      }
    }
  }
};

}  // namespace flash
