// Torch binding: op schemas, argument checks, and dispatch to the compiled kernels.
// The only file that includes torch headers; kernels see a plain FwdParams.
#include <Python.h>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cuda_runtime.h>
#include <cutlass/numeric_types.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "flash_fwd_params.h"
#ifndef FLASH_ATTN_HOPPER_REGISTRY_PROVIDED  // developer variant builds define their own list
#include "generated/fwd_registry.h"
#endif

namespace flash {
template <int kHeadDim, typename Element>
void run_flash_fwd(FwdParams& params, cudaStream_t stream);
}  // namespace flash

namespace {

using FwdFn = void (*)(flash::FwdParams&, cudaStream_t);

// Head dims that have kernels; any multiple of 8 up to 256 runs on the next one up.
int round_head_dim(int d) {
  if (d <= 64) return 64;
  if (d <= 96) return 96;
  if (d <= 128) return 128;
  if (d <= 192) return 192;
  return 256;
}

FwdFn find_fwd(int head_dim_rounded, bool is_bf16) {
#define FLASH_ATTN_HOPPER_MATCH_FWD(D, T)                                            \
  if (head_dim_rounded == D && std::is_same_v<T, cutlass::bfloat16_t> == is_bf16) { \
    return &flash::run_flash_fwd<D, T>;                                              \
  }
  FLASH_ATTN_HOPPER_FOR_EACH_FWD(FLASH_ATTN_HOPPER_MATCH_FWD)
#undef FLASH_ATTN_HOPPER_MATCH_FWD
  return nullptr;
}

int device_attribute(cudaDeviceAttr attr, int device) {
  int value = 0;
  cudaError_t err = cudaDeviceGetAttribute(&value, attr, device);
  TORCH_CHECK(err == cudaSuccess, "flash_attn_hopper: cudaDeviceGetAttribute failed: ", cudaGetErrorString(err));
  return value;
}

// TMA needs a 16-byte aligned base and 16-byte multiples for every stride but the last.
bool tma_compatible(at::Tensor const& t) {
  int64_t const elem = t.element_size();
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  for (int i = 0; i < 3; ++i) {
    if ((t.stride(i) * elem) % 16 != 0) return false;
  }
  return true;
}

at::Tensor tma_ready(at::Tensor const& t) { return tma_compatible(t) ? t : t.contiguous(); }

std::tuple<at::Tensor, at::Tensor> mha_fwd(at::Tensor const& q, at::Tensor const& k, at::Tensor const& v,
                                           double softmax_scale, bool causal, int64_t window_size_left,
                                           int64_t window_size_right, bool top_left) {
  TORCH_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda(), "flash_attn_hopper: q, k and v must be CUDA tensors");
  TORCH_CHECK(k.device() == q.device() && v.device() == q.device(),
              "flash_attn_hopper: q, k and v must be on the same device");
  auto const dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16,
              "flash_attn_hopper: only float16 and bfloat16 are supported, got ", dtype);
  TORCH_CHECK(k.scalar_type() == dtype && v.scalar_type() == dtype,
              "flash_attn_hopper: q, k and v must have the same dtype");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "flash_attn_hopper: q, k and v must be 4-D (batch, seqlen, nheads, headdim)");
  int64_t const batch = q.size(0), seqlen_q = q.size(1), heads_q = q.size(2), head_dim = q.size(3);
  int64_t const seqlen_k = k.size(1), heads_kv = k.size(2);
  TORCH_CHECK(k.size(0) == batch && v.size(0) == batch, "flash_attn_hopper: batch sizes of q, k, v differ");
  TORCH_CHECK(k.size(3) == head_dim && v.size(3) == head_dim,
              "flash_attn_hopper: q, k and v must have the same head dim");
  TORCH_CHECK(v.size(1) == seqlen_k && v.size(2) == heads_kv, "flash_attn_hopper: k and v shapes differ");
  TORCH_CHECK(head_dim > 0 && head_dim <= 256 && head_dim % 8 == 0,
              "flash_attn_hopper: head dim must be a multiple of 8 and at most 256, got ", head_dim);
  TORCH_CHECK(heads_kv > 0 && heads_q % heads_kv == 0,
              "flash_attn_hopper: nheads of q (", heads_q, ") must be a multiple of nheads of k/v (", heads_kv, ")");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1,
              "flash_attn_hopper: the last dimension of q, k and v must be contiguous");
  TORCH_CHECK(seqlen_q + seqlen_k < (int64_t(1) << 29) && batch < 65536 && heads_q < 65536,
              "flash_attn_hopper: sizes too large (seqlen_q + seqlen_k must be < 2^29, batch and nheads < 65536)");

  c10::cuda::CUDAGuard device_guard(q.device());
  int const device = q.get_device();
  int const cc_major = device_attribute(cudaDevAttrComputeCapabilityMajor, device);
  int const cc_minor = device_attribute(cudaDevAttrComputeCapabilityMinor, device);
  TORCH_CHECK(cc_major == 9 && cc_minor == 0, "flash_attn_hopper: needs an sm_90 (Hopper) GPU, this device is sm_",
              cc_major, cc_minor);

  int const head_dim_rounded = round_head_dim(int(head_dim));
  bool const is_bf16 = dtype == at::kBFloat16;
  FwdFn const fwd = find_fwd(head_dim_rounded, is_bf16);
  TORCH_CHECK(fwd != nullptr, "flash_attn_hopper: the forward kernel for head dim ", head_dim_rounded, " and ",
              is_bf16 ? "bf16" : "fp16", " was not compiled in; rebuild with FLASH_ATTN_HOPPER_HDIMS including ",
              head_dim_rounded, " and FLASH_ATTN_HOPPER_DTYPES including ", is_bf16 ? "bf16" : "fp16");

  at::Tensor out = at::empty({batch, seqlen_q, heads_q, head_dim}, q.options());
  at::Tensor lse = at::empty({batch, heads_q, seqlen_q}, q.options().dtype(at::kFloat));
  if (batch == 0 || seqlen_q == 0 || heads_q == 0) { return {out, lse}; }
  if (seqlen_k == 0) {  // nothing to attend to: O = 0, LSE = -inf
    out.zero_();
    lse.fill_(-std::numeric_limits<float>::infinity());
    return {out, lse};
  }

  at::Tensor const qt = tma_ready(q), kt = tma_ready(k), vt = tma_ready(v);
  flash::FwdParams params{};
  params.q_ptr = qt.data_ptr();
  params.k_ptr = kt.data_ptr();
  params.v_ptr = vt.data_ptr();
  params.o_ptr = out.data_ptr();
  params.lse_ptr = lse.data_ptr<float>();
  params.q_batch_stride = qt.stride(0);
  params.q_row_stride = qt.stride(1);
  params.q_head_stride = qt.stride(2);
  params.k_batch_stride = kt.stride(0);
  params.k_row_stride = kt.stride(1);
  params.k_head_stride = kt.stride(2);
  params.v_batch_stride = vt.stride(0);
  params.v_row_stride = vt.stride(1);
  params.v_head_stride = vt.stride(2);
  params.o_batch_stride = out.stride(0);
  params.o_row_stride = out.stride(1);
  params.o_head_stride = out.stride(2);
  params.batch = int(batch);
  params.heads_q = int(heads_q);
  params.heads_kv = int(heads_kv);
  params.seqlen_q = int(seqlen_q);
  params.seqlen_k = int(seqlen_k);
  params.head_dim = int(head_dim);
  params.softmax_scale = float(softmax_scale);
  params.softmax_scale_log2 = float(softmax_scale * M_LOG2E);
  // Windows as FlashAttention defines them (-1 = unbounded; causal = right window 0), measured
  // from the bottom-right diagonal, or from the top-left one as torch's SDPA does.
  int const unbounded = int(seqlen_q + seqlen_k);
  int64_t const right = causal ? 0 : window_size_right;
  params.is_local = causal || window_size_left >= 0 || window_size_right >= 0;
  params.window_left = window_size_left < 0 ? unbounded : int(std::min<int64_t>(window_size_left, unbounded));
  params.window_right = right < 0 ? unbounded : int(std::min<int64_t>(right, unbounded));
  params.diag_offset = top_left ? 0 : int(seqlen_k - seqlen_q);
  params.num_sms = device_attribute(cudaDevAttrMultiProcessorCount, device);

  fwd(params, c10::cuda::getCurrentCUDAStream(device).stream());
  return {out, lse};
}

}  // namespace

// Developer builds of kernel variants (tools/variants.py) load side by side under other names.
#ifndef FLASH_ATTN_HOPPER_OP_NAMESPACE
#define FLASH_ATTN_HOPPER_OP_NAMESPACE flash_attn_hopper
#endif
#define FLASH_ATTN_HOPPER_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define FLASH_ATTN_HOPPER_LIBRARY_IMPL(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)

FLASH_ATTN_HOPPER_LIBRARY(FLASH_ATTN_HOPPER_OP_NAMESPACE, m) {
  // window sizes: -1 = unbounded; top_left: measure the causal diagonal / window from the top-left
  // corner (torch SDPA's is_causal) instead of the bottom-right one (FlashAttention's).
  m.def("fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, int window_size_left=-1, "
        "int window_size_right=-1, bool top_left=False) -> (Tensor out, Tensor softmax_lse)");
}

FLASH_ATTN_HOPPER_LIBRARY_IMPL(FLASH_ATTN_HOPPER_OP_NAMESPACE, CUDA, m) { m.impl("fwd", &mha_fwd); }

// Importing the extension module loads this library, which registers the ops above.
#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME _C
#endif
#define FLASH_ATTN_HOPPER_CONCAT_(a, b) a##b
#define FLASH_ATTN_HOPPER_CONCAT(a, b) FLASH_ATTN_HOPPER_CONCAT_(a, b)
#define FLASH_ATTN_HOPPER_STR_(a) #a
#define FLASH_ATTN_HOPPER_STR(a) FLASH_ATTN_HOPPER_STR_(a)

extern "C" PyMODINIT_FUNC FLASH_ATTN_HOPPER_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, FLASH_ATTN_HOPPER_STR(TORCH_EXTENSION_NAME),
                                   "flash_attn_hopper kernels (the ops live in torch.ops)", -1, nullptr};
  return PyModule_Create(&module_def);
}
