// Host-only check of a layout fact the backward's dK/dV epilogue relies on (kernel/bwd/epilogue.h
// + quad_transpose): in every consumer thread's dK/dV accumulator, viewed as (rows,
// columns), each row holds groups of 8 columns = 4 chunks of 8 head-dim columns, 2 columns per
// chunk, at consecutive 8-column offsets from (first column - 2 * lane % 4); the 4 lanes of a
// quad share their rows. Prints one line per head dim and exits non-zero on any mismatch.
#include "kernel/bwd/kernel.h"

#include <cstdio>

template <int kHeadDim>
int check() {
  using namespace cute;
  using Kernel = flash::BwdKernelFor<kHeadDim, cutlass::bfloat16_t, /*kLocal=*/false, /*kDeterministic=*/false>;
  constexpr int kBlockN = Kernel::kBlockN;
  typename Kernel::Mainloop::TiledMmadKV mma;
  auto coords = [&](int thread) {
    Tensor tc = mma.get_thread_slice(thread).partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
    return make_tensor(tc.data(), flash::acc_layout_rowcol(tc.layout()));
  };
  int bad = 0, checked = 0;
  for (int t = 0; t < Kernel::kNumMmaThreads; ++t) {
    auto rc = coords(t);
    auto rc_quad0 = coords(t - t % 4);
    int const cols = size<1>(rc);
    if (cols % 8 != 0) { ++bad; }
    for (int r = 0; r < size<0>(rc); ++r) {
      if (get<0>(rc(r, 0)) != get<0>(rc_quad0(r, 0))) { ++bad; }
      for (int c = 0; c < cols; ++c) {
        int const g = c / 8 * 8, chunk = (c % 8) / 2;
        int const first = get<1>(rc(r, g)) - 2 * (t % 4);
        int const expect = first + 8 * chunk + 2 * (t % 4) + c % 2;
        bad += get<1>(rc(r, c)) != expect || get<0>(rc(r, c)) != get<0>(rc(r, 0));
        ++checked;
      }
    }
  }
  std::printf("hdim %d: %d coordinates checked, %d mismatches\n", kHeadDim, checked, bad);
  return bad;
}

int main() { return (check<64>() + check<96>() + check<128>() + check<192>() + check<256>()) != 0; }
