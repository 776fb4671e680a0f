// Host side of the split-KV combine (kernel/combine/combine.cuh): the output dtype, the load
// width, the warps per row, and a grid of resident blocks striding over the rows.
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernel/combine/combine.cuh"

namespace flash {

template <typename OutT, bool kVec4, int kRowWarps>
void launch_combine(CombineParams const& p, cudaStream_t stream) {
  int64_t const rows = int64_t(p.batch) * p.heads * p.seqlen;
  int64_t const blocks = (rows + kCombineWarps / kRowWarps - 1) / (kCombineWarps / kRowWarps);
  int const grid = int(std::min<int64_t>(blocks, int64_t(p.num_sms) * 8));
  flash_combine_kernel<OutT, kVec4, kRowWarps><<<grid, kCombineWarps * 32, 0, stream>>>(p);
  cudaError_t const err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("flash_attn_hopper: launching the combine kernel: ") + cudaGetErrorString(err));
  }
}

// A warp per row while the rows alone fill the SMs (4 warps each); fewer rows (a decode step,
// batch 1) with many splits share each row's splits among a block's 8 warps.
template <typename OutT, bool kVec4>
void launch_combine_rows(CombineParams const& p, cudaStream_t stream) {
  int64_t const rows = int64_t(p.batch) * p.heads * p.seqlen;
  if (rows < int64_t(p.num_sms) * 4 && p.splits >= 2 * kCombineWarps) {
    launch_combine<OutT, kVec4, kCombineWarps>(p, stream);
  } else {
    launch_combine<OutT, kVec4, 1>(p, stream);
  }
}

template <typename OutT>
void launch_combine_out(CombineParams const& p, cudaStream_t stream) {
  if (p.vec4) {
    launch_combine_rows<OutT, true>(p, stream);
  } else {
    launch_combine_rows<OutT, false>(p, stream);
  }
}

void run_combine(CombineParams const& p, CombineOut out, cudaStream_t stream) {
  if (p.batch == 0 || p.heads == 0 || p.seqlen == 0) { return; }
  switch (out) {
    case CombineOut::kFloat: launch_combine_out<float>(p, stream); break;
    case CombineOut::kHalf: launch_combine_out<__half>(p, stream); break;
    case CombineOut::kBFloat16: launch_combine_out<__nv_bfloat16>(p, stream); break;
  }
}

}  // namespace flash
