// Torch binding: op schemas, argument checks, and dispatch to the compiled kernels.
// The only file that includes torch headers; kernels see a plain FwdParams.
//
// It uses only torch's stable C++ ABI (torch/csrc/stable: the op registration, the tensor handle
// and the ops it calls through the dispatcher), targeted at TORCH_TARGET_VERSION (setup.py sets
// it to the oldest torch supported, flash_attn_hopper/_version.py), so one build loads under
// every torch from that version on; and only Python's limited API (one abi3 module).
#include <Python.h>

#ifndef USE_CUDA
#define USE_CUDA  // declares the shim's CUDA entry points (aoti_torch_get_current_cuda_stream)
#endif
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <cuda_runtime.h>
#include <cutlass/numeric_types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "generated/manifest.h"  // head dims, dtypes and size limits from flash_attn_hopper/manifest.py
#include "kernel/common/policy.h"
#include "params/fwd_params.h"
#ifndef FLASH_ATTN_HOPPER_REGISTRY_PROVIDED  // developer variant builds define their own list
#include "generated/fwd_registry.h"
#endif

#if defined(FLASH_ATTN_HOPPER_HAS_BWD) && FLASH_ATTN_HOPPER_HAS_BWD
#include "params/bwd_params.h"
#define FLASH_ATTN_HOPPER_BUILD_BWD 1
#else
#define FLASH_ATTN_HOPPER_BUILD_BWD 0
#endif

namespace flash {
template <int kHeadDim, typename Element>
void run_flash_fwd(FwdParams& params, cudaStream_t stream);
#if FLASH_ATTN_HOPPER_BUILD_BWD
template <int kHeadDim, typename Element>
void run_flash_bwd(BwdParams& params, cudaStream_t stream);
#endif
}  // namespace flash

namespace {

using Tensor = torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;
using FwdFn = void (*)(flash::FwdParams&, cudaStream_t);

// A failed check: std::runtime_error (RuntimeError in Python) with the parts streamed together.
template <typename... Parts>
std::string concat(Parts const&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
#define FLASH_CHECK(cond, ...)                                                  \
  do {                                                                          \
    if (!(cond)) { throw std::runtime_error(concat(__VA_ARGS__)); }             \
  } while (0)
#define FLASH_CUDA_CHECK(call)                                                              \
  do {                                                                                      \
    cudaError_t const flash_err_ = (call);                                                  \
    FLASH_CHECK(flash_err_ == cudaSuccess, "flash_attn_hopper: ", #call, " failed: ",       \
                cudaGetErrorString(flash_err_));                                            \
  } while (0)

constexpr ScalarType kFloat = ScalarType::Float;
constexpr ScalarType kInt = ScalarType::Int;

bool same_sizes(Tensor const& a, Tensor const& b) {
  if (a.dim() != b.dim()) return false;
  for (int64_t i = 0; i < a.dim(); ++i) {
    if (a.size(i) != b.size(i)) return false;
  }
  return true;
}

bool same_device(Tensor const& a, Tensor const& b) {
  return a.is_cuda() == b.is_cuda() && a.get_device() == b.get_device();
}

// Uninitialized / zeroed tensors on t's device.
Tensor empty_like_dev(Tensor const& t, std::vector<int64_t> const& sizes, std::optional<ScalarType> dtype = {}) {
  return torch::stable::new_empty(t, sizes, dtype);
}
Tensor zeros_like_dev(Tensor const& t, std::vector<int64_t> const& sizes, std::optional<ScalarType> dtype = {}) {
  return torch::stable::new_zeros(t, sizes, dtype);
}
std::vector<int64_t> sizes_of(Tensor const& t) {
  std::vector<int64_t> sizes(t.dim());
  for (int64_t i = 0; i < t.dim(); ++i) sizes[i] = t.size(i);
  return sizes;
}

cudaStream_t current_stream(int device) {
  void* stream = nullptr;
  FLASH_CHECK(aoti_torch_get_current_cuda_stream(device, &stream) == AOTI_TORCH_SUCCESS,
              "flash_attn_hopper: could not get the current CUDA stream");
  return static_cast<cudaStream_t>(stream);
}

// The manifest name ("fp16", "bf16") of a dtype with kernels; nullptr for any other dtype.
char const* manifest_dtype_name(ScalarType dtype) {
#define FLASH_ATTN_HOPPER_MATCH_DTYPE(NAME, T, ATEN) \
  if (dtype == ScalarType::ATEN) return #NAME;
  FLASH_ATTN_HOPPER_FOR_EACH_DTYPE(FLASH_ATTN_HOPPER_MATCH_DTYPE)
#undef FLASH_ATTN_HOPPER_MATCH_DTYPE
  return nullptr;
}

// "float16 and bfloat16": the torch dtypes the manifest has kernels for.
std::string supported_dtypes() {
  std::string names;
  for (int i = 0; i < flash::manifest::kNumDtypes; ++i) {
    if (i > 0) names += i + 1 == flash::manifest::kNumDtypes ? " and " : ", ";
    names += flash::manifest::kTorchDtypeNames[i];
  }
  return names;
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
  FLASH_CHECK(err == cudaSuccess, "flash_attn_hopper: cudaDeviceGetAttribute failed: ", cudaGetErrorString(err));
  return value;
}

// TMA needs a 16-byte aligned base and 16-byte multiples for every stride but the last.
bool tma_compatible(Tensor const& t) {
  int64_t const elem = t.element_size();
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  for (int i = 0; i < 3; ++i) {
    if ((t.stride(i) * elem) % 16 != 0) return false;
  }
  return true;
}

Tensor tma_ready(Tensor const& t) { return tma_compatible(t) ? t : torch::stable::contiguous(t); }

// Sizes of one attention problem, after the checks both directions share.
struct Problem {
  int64_t batch, seqlen_q, heads_q, head_dim, seqlen_k, heads_kv;
  int head_dim_rounded;
  bool is_bf16;
  int device;
};

Problem check_problem(Tensor const& q, Tensor const& k, Tensor const& v) {
  FLASH_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda(), "flash_attn_hopper: q, k and v must be CUDA tensors");
  FLASH_CHECK(same_device(k, q) && same_device(v, q),
              "flash_attn_hopper: q, k and v must be on the same device");
  auto const dtype = q.scalar_type();
  FLASH_CHECK(manifest_dtype_name(dtype) != nullptr, "flash_attn_hopper: only ", supported_dtypes(),
              " are supported, got ", dtype);
  FLASH_CHECK(k.scalar_type() == dtype && v.scalar_type() == dtype,
              "flash_attn_hopper: q, k and v must have the same dtype");
  FLASH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "flash_attn_hopper: q, k and v must be 4-D (batch, seqlen, nheads, headdim)");
  Problem pb{};
  pb.batch = q.size(0);
  pb.seqlen_q = q.size(1);
  pb.heads_q = q.size(2);
  pb.head_dim = q.size(3);
  pb.seqlen_k = k.size(1);
  pb.heads_kv = k.size(2);
  FLASH_CHECK(k.size(0) == pb.batch && v.size(0) == pb.batch, "flash_attn_hopper: batch sizes of q, k, v differ");
  FLASH_CHECK(k.size(3) == pb.head_dim && v.size(3) == pb.head_dim,
              "flash_attn_hopper: q, k and v must have the same head dim");
  FLASH_CHECK(v.size(1) == pb.seqlen_k && v.size(2) == pb.heads_kv, "flash_attn_hopper: k and v shapes differ");
  pb.head_dim_rounded = flash::manifest::round_up_head_dim(pb.head_dim);
  FLASH_CHECK(pb.head_dim_rounded != 0, "flash_attn_hopper: head dim must be a multiple of ",
              flash::manifest::kHeadDimMultiple, " and at most ", flash::manifest::kMaxHeadDim, ", got ", pb.head_dim);
  FLASH_CHECK(pb.heads_kv > 0 && pb.heads_q % pb.heads_kv == 0, "flash_attn_hopper: nheads of q (", pb.heads_q,
              ") must be a multiple of nheads of k/v (", pb.heads_kv, ")");
  FLASH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1,
              "flash_attn_hopper: the last dimension of q, k and v must be contiguous");
  FLASH_CHECK(pb.seqlen_q + pb.seqlen_k <= flash::manifest::kMaxSeqlenSum && pb.batch <= flash::manifest::kMaxBatch &&
                  pb.heads_q <= flash::manifest::kMaxHeads,
              "flash_attn_hopper: sizes too large (seqlen_q + seqlen_k must be at most ", flash::manifest::kMaxSeqlenSum,
              ", batch at most ", flash::manifest::kMaxBatch, ", nheads at most ", flash::manifest::kMaxHeads, ")");
  pb.device = q.get_device();
  int const cc_major = device_attribute(cudaDevAttrComputeCapabilityMajor, pb.device);
  int const cc_minor = device_attribute(cudaDevAttrComputeCapabilityMinor, pb.device);
  FLASH_CHECK(cc_major == 9 && cc_minor == 0, "flash_attn_hopper: needs an sm_90 (Hopper) GPU, this device is sm_",
              cc_major, cc_minor);
  pb.is_bf16 = dtype == ScalarType::BFloat16;
  return pb;
}

// The kernels take each row's max of the unscaled scores, so the scale must be positive. Checked
// before anything is allocated: the same check thrown from fill_common, after the outputs were
// allocated, ended the process on the H200 (tools/exception_diag.py, 2026-11-30).
void check_scale(double softmax_scale) {
  FLASH_CHECK(std::isfinite(softmax_scale) && softmax_scale > 0,
              "flash_attn_hopper: softmax_scale must be a positive finite number");
}

// Windows as FlashAttention defines them (-1 = unbounded; causal = right window 0), measured
// from the bottom-right diagonal, or from the top-left one as torch's SDPA does.
struct Window {
  bool is_local;
  int left, right, diag_offset;
};

Window make_window(Problem const& pb, bool causal, int64_t window_size_left, int64_t window_size_right,
                   bool top_left) {
  int const unbounded = int(pb.seqlen_q + pb.seqlen_k);
  int64_t const right = causal ? 0 : window_size_right;
  Window w{};
  w.is_local = causal || window_size_left >= 0 || window_size_right >= 0;
  w.left = window_size_left < 0 ? unbounded : int(std::min<int64_t>(window_size_left, unbounded));
  w.right = right < 0 ? unbounded : int(std::min<int64_t>(right, unbounded));
  w.diag_offset = top_left ? 0 : int(pb.seqlen_k - pb.seqlen_q);
  return w;
}

// What both directions' params share: q, k, v pointers and strides, sizes, scale, window, SMs.
template <typename Params>
void fill_common(Params& params, Problem const& pb, Tensor const& qt, Tensor const& kt, Tensor const& vt,
                 double softmax_scale, Window const& window) {
  params.q_ptr = qt.data_ptr();
  params.k_ptr = kt.data_ptr();
  params.v_ptr = vt.data_ptr();
  params.q_batch_stride = qt.stride(0);
  params.q_row_stride = qt.stride(1);
  params.q_head_stride = qt.stride(2);
  params.k_batch_stride = kt.stride(0);
  params.k_row_stride = kt.stride(1);
  params.k_head_stride = kt.stride(2);
  params.v_batch_stride = vt.stride(0);
  params.v_row_stride = vt.stride(1);
  params.v_head_stride = vt.stride(2);
  params.batch = int(pb.batch);
  params.heads_q = int(pb.heads_q);
  params.heads_kv = int(pb.heads_kv);
  params.seqlen_q = int(pb.seqlen_q);
  params.seqlen_k = int(pb.seqlen_k);
  params.head_dim = int(pb.head_dim);
  params.softmax_scale = float(softmax_scale);
  params.softmax_scale_log2 = float(softmax_scale * M_LOG2E);
  params.is_local = window.is_local;
  params.window_left = window.left;
  params.window_right = window.right;
  params.diag_offset = window.diag_offset;
  params.num_sms = device_attribute(cudaDevAttrMultiProcessorCount, pb.device);
}

std::string not_compiled(char const* direction, Problem const& pb, ScalarType dtype) {
  char const* dt = manifest_dtype_name(dtype);
  return std::string("flash_attn_hopper: the ") + direction + " kernel for head dim " +
         std::to_string(pb.head_dim_rounded) + " and " + dt + " was not compiled in; rebuild with " +
         flash::manifest::kEnvHdims + " including " + std::to_string(pb.head_dim_rounded) + " and " +
         flash::manifest::kEnvDtypes + " including " + dt;
}

std::tuple<Tensor, Tensor> mha_fwd(Tensor const& q, Tensor const& k, Tensor const& v,
                                           double softmax_scale, bool causal, int64_t window_size_left,
                                           int64_t window_size_right, bool top_left) {
  Problem const pb = check_problem(q, k, v);
  check_scale(softmax_scale);
  torch::stable::accelerator::DeviceGuard device_guard(q.get_device());
  auto const [batch, seqlen_q, heads_q, head_dim, seqlen_k, heads_kv, head_dim_rounded, is_bf16, device] = pb;
  FwdFn const fwd = find_fwd(head_dim_rounded, is_bf16);
  FLASH_CHECK(fwd != nullptr, not_compiled("forward", pb, q.scalar_type()));

  Tensor out = empty_like_dev(q, {batch, seqlen_q, heads_q, head_dim});
  Tensor lse = empty_like_dev(q, {batch, heads_q, seqlen_q}, kFloat);
  if (batch == 0 || seqlen_q == 0 || heads_q == 0) { return {out, lse}; }
  if (seqlen_k == 0) {  // nothing to attend to: O = 0, LSE = -inf
    torch::stable::zero_(out);
    torch::stable::fill_(lse, -std::numeric_limits<float>::infinity());
    return {out, lse};
  }

  Tensor const qt = tma_ready(q), kt = tma_ready(k), vt = tma_ready(v);
  flash::FwdParams params{};
  fill_common(params, pb, qt, kt, vt, softmax_scale,
              make_window(pb, causal, window_size_left, window_size_right, top_left));
  params.o_ptr = out.data_ptr();
  params.lse_ptr = lse.mutable_data_ptr<float>();
  params.o_batch_stride = out.stride(0);
  params.o_row_stride = out.stride(1);
  params.o_head_stride = out.stride(2);
  cudaStream_t const stream = current_stream(device);
  Tensor tile_counter;  // dynamic persistent scheduling of causal/local tiles
  if (flash::fwd_needs_tile_counter(head_dim_rounded, params.is_local, params.seqlen_k)) {
    // A 4-byte memset on the stream rather than a zeros op's fill kernel.
    tile_counter = empty_like_dev(q, {1}, kInt);
    params.tile_counter = tile_counter.mutable_data_ptr<int32_t>();
    FLASH_CUDA_CHECK(cudaMemsetAsync(params.tile_counter, 0, sizeof(int), stream));
  }

  fwd(params, stream);
  return {out, lse};
}

// The sequences of a variable-length call: cu_seqlens (batch + 1) and seqused (batch) int32 on q's
// device. Their contents are not read here (that would need a sync): the kernels clamp them.
struct Varlen {
  int64_t batch, total_q, total_k, max_seqlen_q, max_seqlen_k;
};

Varlen check_varlen(Tensor const& q, Tensor const& k, Tensor const& cu_seqlens_q,
                    Tensor const& cu_seqlens_k, std::optional<Tensor> const& seqused_q,
                    std::optional<Tensor> const& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k) {
  FLASH_CHECK(q.dim() == 3 && k.dim() == 3,
              "flash_attn_hopper: varlen q, k and v must be 3-D (total_tokens, nheads, headdim)");
  auto check_index = [&](Tensor const& t, char const* name, int64_t numel) {
    FLASH_CHECK(t.scalar_type() == kInt && t.dim() == 1 && t.is_contiguous(), "flash_attn_hopper: ", name,
                " must be a contiguous 1-D int32 tensor");
    FLASH_CHECK(same_device(t, q), "flash_attn_hopper: ", name, " must be on q's device");
    FLASH_CHECK(numel < 0 || t.numel() == numel, "flash_attn_hopper: ", name, " must have ", numel,
                " entries, got ", t.numel());
  };
  check_index(cu_seqlens_q, "cu_seqlens_q", -1);
  FLASH_CHECK(cu_seqlens_q.numel() >= 1, "flash_attn_hopper: cu_seqlens_q must have batch + 1 >= 1 entries");
  Varlen vl{};
  vl.batch = cu_seqlens_q.numel() - 1;
  check_index(cu_seqlens_k, "cu_seqlens_k", vl.batch + 1);
  if (seqused_q) { check_index(*seqused_q, "seqused_q", vl.batch); }
  if (seqused_k) { check_index(*seqused_k, "seqused_k", vl.batch); }
  FLASH_CHECK(max_seqlen_q >= 0 && max_seqlen_k >= 0, "flash_attn_hopper: max_seqlen_q and max_seqlen_k must be >= 0");
  FLASH_CHECK(vl.batch <= flash::manifest::kMaxBatch, "flash_attn_hopper: at most ", flash::manifest::kMaxBatch,
              " sequences");
  vl.total_q = q.size(0);
  vl.total_k = k.size(0);
  // No sequence is longer than its packed tensor: larger bounds would only widen the grid.
  vl.max_seqlen_q = std::min(max_seqlen_q, vl.total_q);
  vl.max_seqlen_k = std::min(max_seqlen_k, vl.total_k);
  return vl;
}

flash::VarlenArgs varlen_args(Varlen const& vl, Tensor const& cu_seqlens_q, Tensor const& cu_seqlens_k,
                              std::optional<Tensor> const& seqused_q, std::optional<Tensor> const& seqused_k,
                              bool top_left) {
  flash::VarlenArgs args;
  args.cu_seqlens_q = cu_seqlens_q.mutable_data_ptr<int32_t>();
  args.cu_seqlens_k = cu_seqlens_k.mutable_data_ptr<int32_t>();
  args.seqused_q = seqused_q ? seqused_q->mutable_data_ptr<int32_t>() : nullptr;
  args.seqused_k = seqused_k ? seqused_k->mutable_data_ptr<int32_t>() : nullptr;
  args.total_q = int(vl.total_q);
  args.total_k = int(vl.total_k);
  args.top_left = top_left;
  args.batch = int(vl.batch);
  return args;
}

// Variable-length forward: q (total_q, heads, d), k and v (total_k, heads_kv, d), sequence b at
// rows cu_seqlens[b] (FwdParams says how the kernels read them). Returns out like q and the LSE
// (heads, total_q). With seqused_q, rows outside every sequence's used part are 0 (LSE -inf).
std::tuple<Tensor, Tensor> mha_varlen_fwd(Tensor const& q, Tensor const& k, Tensor const& v,
                                                  Tensor const& cu_seqlens_q, Tensor const& cu_seqlens_k,
                                                  std::optional<Tensor> const& seqused_q,
                                                  std::optional<Tensor> const& seqused_k, int64_t max_seqlen_q,
                                                  int64_t max_seqlen_k, double softmax_scale, bool causal,
                                                  int64_t window_size_left, int64_t window_size_right, bool top_left) {
  FLASH_CHECK(v.dim() == 3, "flash_attn_hopper: varlen q, k and v must be 3-D (total_tokens, nheads, headdim)");
  Varlen const vl = check_varlen(q, k, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k);
  // One packed "batch entry" of total rows: the dense checks (dtypes, head dim, GQA, strides, sizes).
  Tensor const q4 = torch::stable::unsqueeze(q, 0), k4 = torch::stable::unsqueeze(k, 0), v4 = torch::stable::unsqueeze(v, 0);
  Problem const pb = check_problem(q4, k4, v4);
  check_scale(softmax_scale);
  torch::stable::accelerator::DeviceGuard device_guard(q.get_device());
  FwdFn const fwd = find_fwd(pb.head_dim_rounded, pb.is_bf16);
  FLASH_CHECK(fwd != nullptr, not_compiled("forward", pb, q.scalar_type()));

  bool const gaps = seqused_q.has_value();  // rows no sequence uses: defined as 0 / -inf
  Tensor out = gaps ? zeros_like_dev(q, {vl.total_q, pb.heads_q, pb.head_dim})
                        : empty_like_dev(q, {vl.total_q, pb.heads_q, pb.head_dim});
  Tensor lse = empty_like_dev(q, {pb.heads_q, vl.total_q}, kFloat);
  if (vl.batch == 0 || vl.total_q == 0 || pb.heads_q == 0) { return {out, lse}; }
  if (vl.total_k == 0 || vl.max_seqlen_k == 0 || vl.max_seqlen_q == 0) {  // nothing to attend to
    torch::stable::zero_(out);
    torch::stable::fill_(lse, -std::numeric_limits<float>::infinity());
    return {out, lse};
  }
  if (gaps) { torch::stable::fill_(lse, -std::numeric_limits<float>::infinity()); }

  Tensor const qt = tma_ready(q4), kt = tma_ready(k4), vt = tma_ready(v4);
  Tensor const o4 = torch::stable::unsqueeze(out, 0);
  flash::FwdParams params{};
  fill_common(params, pb, qt, kt, vt, softmax_scale,
              make_window(pb, causal, window_size_left, window_size_right, top_left));
  params.batch = int(vl.batch);
  params.seqlen_q = int(vl.max_seqlen_q);
  params.seqlen_k = int(vl.max_seqlen_k);
  params.varlen = varlen_args(vl, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, top_left);
  params.o_ptr = out.data_ptr();
  params.lse_ptr = lse.mutable_data_ptr<float>();
  params.o_batch_stride = o4.stride(0);
  params.o_row_stride = o4.stride(1);
  params.o_head_stride = o4.stride(2);
  cudaStream_t const stream = current_stream(pb.device);
  Tensor tile_counter;
  if (flash::fwd_needs_tile_counter(pb.head_dim_rounded, params.is_local, params.seqlen_k)) {
    tile_counter = empty_like_dev(q, {1}, kInt);
    params.tile_counter = tile_counter.mutable_data_ptr<int32_t>();
    FLASH_CUDA_CHECK(cudaMemsetAsync(params.tile_counter, 0, sizeof(int), stream));
  }
  fwd(params, stream);
  return {out, lse};
}

#if FLASH_ATTN_HOPPER_BUILD_BWD
using BwdFn = void (*)(flash::BwdParams&, cudaStream_t);

BwdFn find_bwd(int head_dim_rounded, bool is_bf16) {
#define FLASH_ATTN_HOPPER_MATCH_BWD(D, T)                                            \
  if (head_dim_rounded == D && std::is_same_v<T, cutlass::bfloat16_t> == is_bf16) { \
    return &flash::run_flash_bwd<D, T>;                                              \
  }
  FLASH_ATTN_HOPPER_FOR_EACH_BWD(FLASH_ATTN_HOPPER_MATCH_BWD)
#undef FLASH_ATTN_HOPPER_MATCH_BWD
  return nullptr;
}

// Gradients of fwd: preprocess (D = rowsum(dO * O), LSE in the log2 domain), the main kernel and the
// dQ postprocess all run in run_flash_bwd; here only the workspaces are allocated (dq_accum zeroed).
std::tuple<Tensor, Tensor, Tensor> mha_bwd(Tensor const& dout, Tensor const& q,
                                                       Tensor const& k, Tensor const& v,
                                                       Tensor const& out, Tensor const& softmax_lse,
                                                       double softmax_scale, bool causal, int64_t window_size_left,
                                                       int64_t window_size_right, bool top_left, bool deterministic) {
  Problem const pb = check_problem(q, k, v);
  check_scale(softmax_scale);
  torch::stable::accelerator::DeviceGuard device_guard(q.get_device());
  auto const [batch, seqlen_q, heads_q, head_dim, seqlen_k, heads_kv, head_dim_rounded, is_bf16, device] = pb;
  FLASH_CHECK(same_sizes(dout, q) && same_sizes(out, q),
              "flash_attn_hopper: dout and out must have q's shape (batch, seqlen_q, nheads, headdim)");
  FLASH_CHECK(dout.scalar_type() == q.scalar_type() && out.scalar_type() == q.scalar_type(),
              "flash_attn_hopper: dout and out must have q's dtype");
  FLASH_CHECK(same_device(dout, q) && same_device(out, q) && same_device(softmax_lse, q),
              "flash_attn_hopper: dout, out and softmax_lse must be on q's device");
  FLASH_CHECK(dout.stride(3) == 1, "flash_attn_hopper: the last dimension of dout must be contiguous");
  FLASH_CHECK(softmax_lse.scalar_type() == kFloat && softmax_lse.dim() == 3 && softmax_lse.size(0) == batch &&
                  softmax_lse.size(1) == heads_q && softmax_lse.size(2) == seqlen_q,
              "flash_attn_hopper: softmax_lse must be float32 (batch, nheads, seqlen_q) as fwd returns it");
  BwdFn const bwd = find_bwd(head_dim_rounded, is_bf16);
  FLASH_CHECK(bwd != nullptr, not_compiled("backward", pb, q.scalar_type()));

  Tensor dq = empty_like_dev(q, {batch, seqlen_q, heads_q, head_dim});
  Tensor dk = empty_like_dev(q, {batch, seqlen_k, heads_kv, head_dim});
  Tensor dv = empty_like_dev(q, {batch, seqlen_k, heads_kv, head_dim});
  if (batch == 0 || heads_q == 0 || seqlen_q == 0 || seqlen_k == 0) {  // no query sees any key
    torch::stable::zero_(dq);
    torch::stable::zero_(dk);
    torch::stable::zero_(dv);
    return {dq, dk, dv};
  }

  int64_t const seqlen_q_padded = (seqlen_q + flash::kBwdPadM - 1) / flash::kBwdPadM * flash::kBwdPadM;
  ScalarType const f32 = kFloat;
  // Workspaces; the preprocess kernel fills lse_log2 and dsum, the main kernel adds into dq_accum.
  Tensor lse_log2 = empty_like_dev(q, {batch, heads_q, seqlen_q_padded}, f32);
  Tensor dsum = empty_like_dev(q, {batch, heads_q, seqlen_q_padded}, f32);
  Tensor dq_accum = zeros_like_dev(q, {batch, heads_q, seqlen_q_padded, head_dim_rounded}, f32);
  // Deterministic mode: one counter per dQ block orders the key blocks' additions into it.
  Tensor dq_semaphore;
  if (deterministic) {
    dq_semaphore = zeros_like_dev(q, {batch, heads_q, seqlen_q_padded / flash::kBwdMinBlockM}, kInt);
  }

  Tensor const qt = tma_ready(q), kt = tma_ready(k), vt = tma_ready(v), dot = tma_ready(dout);
  Tensor const ot = tma_ready(out);
  Tensor const lse = torch::stable::contiguous(softmax_lse);
  flash::BwdParams params{};
  fill_common(params, pb, qt, kt, vt, softmax_scale,
              make_window(pb, causal, window_size_left, window_size_right, top_left));
  params.do_ptr = dot.data_ptr();
  params.do_batch_stride = dot.stride(0);
  params.do_row_stride = dot.stride(1);
  params.do_head_stride = dot.stride(2);
  params.o_ptr = ot.data_ptr();
  params.o_batch_stride = ot.stride(0);
  params.o_row_stride = ot.stride(1);
  params.o_head_stride = ot.stride(2);
  params.lse_ptr = lse.mutable_data_ptr<float>();
  params.dq_ptr = dq.data_ptr();
  params.dq_batch_stride = dq.stride(0);
  params.dq_row_stride = dq.stride(1);
  params.dq_head_stride = dq.stride(2);
  params.dk_ptr = dk.data_ptr();
  params.dv_ptr = dv.data_ptr();
  params.dq_accum_ptr = dq_accum.mutable_data_ptr<float>();
  params.lse_log2_ptr = lse_log2.mutable_data_ptr<float>();
  params.dsum_ptr = dsum.mutable_data_ptr<float>();
  params.dq_semaphore_ptr = deterministic ? dq_semaphore.mutable_data_ptr<int32_t>() : nullptr;
  Tensor tile_counter;  // dynamic persistent scheduling of causal/local tiles (zeroed by the preprocess)
  if (flash::bwd_needs_tile_counter(head_dim_rounded, params.is_local, deterministic)) {
    tile_counter = empty_like_dev(q, {1}, kInt);
    params.tile_counter = tile_counter.mutable_data_ptr<int32_t>();
  }
  params.seqlen_q_padded = int(seqlen_q_padded);
  params.head_dim_rounded = head_dim_rounded;

  bwd(params, current_stream(device));
  return {dq, dk, dv};
}

// Gradients of varlen_fwd: the packed dq, dk, dv (zero on rows no sequence uses when seqused is
// given), with the per-row workspaces padded per sequence (BwdParams).
std::tuple<Tensor, Tensor, Tensor> mha_varlen_bwd(
    Tensor const& dout, Tensor const& q, Tensor const& k, Tensor const& v, Tensor const& out,
    Tensor const& softmax_lse, Tensor const& cu_seqlens_q, Tensor const& cu_seqlens_k,
    std::optional<Tensor> const& seqused_q, std::optional<Tensor> const& seqused_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_size_left, int64_t window_size_right,
    bool top_left, bool deterministic) {
  FLASH_CHECK(v.dim() == 3, "flash_attn_hopper: varlen q, k and v must be 3-D (total_tokens, nheads, headdim)");
  Varlen const vl = check_varlen(q, k, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k);
  Tensor const q4 = torch::stable::unsqueeze(q, 0), k4 = torch::stable::unsqueeze(k, 0), v4 = torch::stable::unsqueeze(v, 0);
  Problem const pb = check_problem(q4, k4, v4);
  check_scale(softmax_scale);
  torch::stable::accelerator::DeviceGuard device_guard(q.get_device());
  FLASH_CHECK(same_sizes(dout, q) && same_sizes(out, q),
              "flash_attn_hopper: dout and out must have q's shape (total_q, nheads, headdim)");
  FLASH_CHECK(dout.scalar_type() == q.scalar_type() && out.scalar_type() == q.scalar_type(),
              "flash_attn_hopper: dout and out must have q's dtype");
  FLASH_CHECK(same_device(dout, q) && same_device(out, q) && same_device(softmax_lse, q),
              "flash_attn_hopper: dout, out and softmax_lse must be on q's device");
  FLASH_CHECK(dout.stride(2) == 1, "flash_attn_hopper: the last dimension of dout must be contiguous");
  FLASH_CHECK(softmax_lse.scalar_type() == kFloat && softmax_lse.dim() == 2 && softmax_lse.size(0) == pb.heads_q &&
                  softmax_lse.size(1) == vl.total_q,
              "flash_attn_hopper: softmax_lse must be float32 (nheads, total_q) as varlen_fwd returns it");
  BwdFn const bwd = find_bwd(pb.head_dim_rounded, pb.is_bf16);
  FLASH_CHECK(bwd != nullptr, not_compiled("backward", pb, q.scalar_type()));

  // Rows no sequence uses are not written by the kernels: zero them where there can be any.
  bool const gaps_q = seqused_q.has_value(), gaps_k = seqused_k.has_value();
  auto alloc = [&](Tensor const& like, bool zero) {
    return zero ? zeros_like_dev(like, sizes_of(like)) : empty_like_dev(like, sizes_of(like));
  };
  Tensor dq = alloc(q, gaps_q), dk = alloc(k, gaps_k), dv = alloc(v, gaps_k);
  if (vl.batch == 0 || pb.heads_q == 0 || vl.total_q == 0 || vl.total_k == 0 || vl.max_seqlen_q == 0 ||
      vl.max_seqlen_k == 0) {  // no query sees any key
    torch::stable::zero_(dq);
    torch::stable::zero_(dk);
    torch::stable::zero_(dv);
    return {dq, dk, dv};
  }

  // Each sequence's rows at a kBwdPadM-aligned offset of its own (seqlen.h, offset_q_padded).
  int64_t const rows_padded =
      (vl.total_q + vl.batch * flash::kBwdPadM + flash::kBwdPadM - 1) / flash::kBwdPadM * flash::kBwdPadM;
  ScalarType const f32 = kFloat;
  Tensor lse_log2 = empty_like_dev(q, {pb.heads_q, rows_padded}, f32);
  Tensor dsum = empty_like_dev(q, {pb.heads_q, rows_padded}, f32);
  Tensor dq_accum = zeros_like_dev(q, {pb.heads_q, rows_padded, pb.head_dim_rounded}, f32);
  Tensor dq_semaphore;
  if (deterministic) {
    dq_semaphore = zeros_like_dev(q, {pb.heads_q, rows_padded / flash::kBwdMinBlockM}, kInt);
  }

  Tensor const qt = tma_ready(q4), kt = tma_ready(k4), vt = tma_ready(v4), dot = tma_ready(torch::stable::unsqueeze(dout, 0));
  Tensor const ot = tma_ready(torch::stable::unsqueeze(out, 0));
  Tensor const lse = torch::stable::contiguous(softmax_lse);
  Tensor const dq4 = torch::stable::unsqueeze(dq, 0);
  flash::BwdParams params{};
  fill_common(params, pb, qt, kt, vt, softmax_scale,
              make_window(pb, causal, window_size_left, window_size_right, top_left));
  params.batch = int(vl.batch);
  params.seqlen_q = int(vl.max_seqlen_q);
  params.seqlen_k = int(vl.max_seqlen_k);
  params.varlen = varlen_args(vl, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, top_left);
  params.do_ptr = dot.data_ptr();
  params.do_batch_stride = dot.stride(0);
  params.do_row_stride = dot.stride(1);
  params.do_head_stride = dot.stride(2);
  params.o_ptr = ot.data_ptr();
  params.o_batch_stride = ot.stride(0);
  params.o_row_stride = ot.stride(1);
  params.o_head_stride = ot.stride(2);
  params.lse_ptr = lse.mutable_data_ptr<float>();
  params.dq_ptr = dq.data_ptr();
  params.dq_batch_stride = dq4.stride(0);
  params.dq_row_stride = dq4.stride(1);
  params.dq_head_stride = dq4.stride(2);
  params.dk_ptr = dk.data_ptr();
  params.dv_ptr = dv.data_ptr();
  params.dq_accum_ptr = dq_accum.mutable_data_ptr<float>();
  params.lse_log2_ptr = lse_log2.mutable_data_ptr<float>();
  params.dsum_ptr = dsum.mutable_data_ptr<float>();
  params.dq_semaphore_ptr = deterministic ? dq_semaphore.mutable_data_ptr<int32_t>() : nullptr;
  Tensor tile_counter;
  if (flash::bwd_needs_tile_counter(pb.head_dim_rounded, params.is_local, deterministic)) {
    tile_counter = empty_like_dev(q, {1}, kInt);
    params.tile_counter = tile_counter.mutable_data_ptr<int32_t>();
  }
  params.seqlen_q_padded = int(rows_padded);
  params.head_dim_rounded = pb.head_dim_rounded;

  bwd(params, current_stream(pb.device));
  return {dq, dk, dv};
}
#endif  // FLASH_ATTN_HOPPER_BUILD_BWD

}  // namespace

// Developer builds of kernel variants (tools/gpu/variants.py) load side by side under other names.
#ifndef FLASH_ATTN_HOPPER_OP_NAMESPACE
#define FLASH_ATTN_HOPPER_OP_NAMESPACE flash_attn_hopper
#endif
#define FLASH_ATTN_HOPPER_LIBRARY(ns, m) STABLE_TORCH_LIBRARY(ns, m)
#define FLASH_ATTN_HOPPER_LIBRARY_IMPL(ns, key, m) STABLE_TORCH_LIBRARY_IMPL(ns, key, m)

FLASH_ATTN_HOPPER_LIBRARY(FLASH_ATTN_HOPPER_OP_NAMESPACE, m) {
  // window sizes: -1 = unbounded; top_left: measure the causal diagonal / window from the top-left
  // corner (torch SDPA's is_causal) instead of the bottom-right one (FlashAttention's).
  m.def("fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, int window_size_left=-1, "
        "int window_size_right=-1, bool top_left=False) -> (Tensor out, Tensor softmax_lse)");
  // q (total_q, nheads, d), k and v (total_k, nheads_kv, d), sequence b at rows cu_seqlens[b]; the
  // LSE is (nheads, total_q).
  m.def("varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? seqused_q, "
        "Tensor? seqused_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool causal, "
        "int window_size_left=-1, int window_size_right=-1, bool top_left=False) "
        "-> (Tensor out, Tensor softmax_lse)");
#if FLASH_ATTN_HOPPER_BUILD_BWD
  m.def("bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, float softmax_scale, "
        "bool causal, int window_size_left=-1, int window_size_right=-1, bool top_left=False, "
        "bool deterministic=False) -> (Tensor dq, Tensor dk, Tensor dv)");
  m.def("varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
        "Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? seqused_q, Tensor? seqused_k, int max_seqlen_q, "
        "int max_seqlen_k, float softmax_scale, bool causal, int window_size_left=-1, int window_size_right=-1, "
        "bool top_left=False, bool deterministic=False) -> (Tensor dq, Tensor dk, Tensor dv)");
#endif
}

FLASH_ATTN_HOPPER_LIBRARY_IMPL(FLASH_ATTN_HOPPER_OP_NAMESPACE, CUDA, m) {
  m.impl("fwd", TORCH_BOX(&mha_fwd));
  m.impl("varlen_fwd", TORCH_BOX(&mha_varlen_fwd));
#if FLASH_ATTN_HOPPER_BUILD_BWD
  m.impl("bwd", TORCH_BOX(&mha_bwd));
  m.impl("varlen_bwd", TORCH_BOX(&mha_varlen_bwd));
#endif
}

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
