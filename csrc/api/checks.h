// The binding's helpers and argument checks, for flash_api.cpp alone (it includes this after the
// registry and params headers; internal linkage): stable-ABI tensor helpers, the problem and window
// checks both directions share, and the variable-length checks.
#pragma once

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

// t with a leading dimension of 1 (a varlen tensor as one batch entry): the view made directly
// through the shim rather than through the dispatcher's unsqueeze (a few us per call on the host).
Tensor unsqueeze0(Tensor const& t) {
  int64_t const dim = t.dim();
  std::vector<int64_t> sizes(dim + 1), strides(dim + 1);
  sizes[0] = 1;
  strides[0] = dim > 0 ? t.size(0) * t.stride(0) : 1;  // as torch's unsqueeze(0)
  for (int64_t i = 0; i < dim; ++i) {
    sizes[i + 1] = t.size(i);
    strides[i + 1] = t.stride(i);
  }
  AtenTensorHandle view = nullptr;  // the offset argument is added to t's own storage offset: 0
  FLASH_CHECK(aoti_torch__reinterpret_tensor(t.get(), dim + 1, sizes.data(), strides.data(), 0, &view) ==
                  AOTI_TORCH_SUCCESS,
              "flash_attn_hopper: could not view a varlen tensor as one batch entry");
  Tensor out(view);
  FLASH_CHECK(out.data_ptr() == t.data_ptr(), "flash_attn_hopper: a varlen tensor's view moved its data pointer");
  return out;
}

// Binds the device's primary context to the calling thread once per (thread, device): torch's device
// guard skips cudaSetDevice when the device already matches, and in a thread where no CUDA call ran
// yet (autograd's backward thread) the TMA descriptors' driver calls then fail with no context.
void bind_primary_context(int device) {
  thread_local int bound = -1;
  if (bound == device) { return; }
  FLASH_CHECK(cudaSetDevice(device) == cudaSuccess, "flash_attn_hopper: could not make the CUDA device current");
  bound = device;
}

// The current stream of the device, whose context the thread now holds (every launch path asks).
cudaStream_t current_stream(int device) {
  bind_primary_context(device);
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

// The forward of a call: the qv kernels (FA3's qv; hdim 64 only, their own files) or the usual ones.
FwdFn find_fwd_for(int head_dim_rounded, bool is_bf16, bool qv) {
  if (!qv) { return find_fwd(head_dim_rounded, is_bf16); }
#define FLASH_ATTN_HOPPER_MATCH_QV(D, T)                                             \
  if (head_dim_rounded == D && std::is_same_v<T, cutlass::bfloat16_t> == is_bf16) { \
    return &flash::run_flash_fwd_qv<D, T>;                                           \
  }
  FLASH_ATTN_HOPPER_FOR_EACH_QV(FLASH_ATTN_HOPPER_MATCH_QV)
#undef FLASH_ATTN_HOPPER_MATCH_QV
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
  int64_t head_dim_v;  // v's (and out's): head_dim, or where the forward has kernels for it narrower
};

// value_head_dim: v's head dim may differ from q's where the kernels take the pair (policy.h
// fwd_value_head_dim: the forward's dv != d kernels, the backward's BwdPolicy::kNarrowV);
// otherwise q, k and v share one.
// qv: the call has a qv (FA3's MLA decode): head dim 64 only, v's up to 512 (the qv kernels).
// fp8: an FP8 call (api/fp8.h): float8_e4m3fn inputs, which every other call refuses.
Problem check_problem(Tensor const& q, Tensor const& k, Tensor const& v, bool value_head_dim = false,
                      bool qv = false, bool fp8 = false) {
  FLASH_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda(), "flash_attn_hopper: q, k and v must be CUDA tensors");
  FLASH_CHECK(same_device(k, q) && same_device(v, q),
              "flash_attn_hopper: q, k and v must be on the same device");
  auto const dtype = q.scalar_type();
  if (fp8) {
    FLASH_CHECK(dtype == ScalarType::Float8_e4m3fn, "flash_attn_hopper: the FP8 forward takes float8_e4m3fn q, k "
                "and v, got ", dtype);
  } else {
    FLASH_CHECK(manifest_dtype_name(dtype) != nullptr, "flash_attn_hopper: only ", supported_dtypes(),
                " are supported, got ", dtype);
  }
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
  pb.head_dim_v = v.size(3);
  FLASH_CHECK(v.size(1) == pb.seqlen_k && v.size(2) == pb.heads_kv, "flash_attn_hopper: k and v shapes differ");
  pb.head_dim_rounded = flash::manifest::round_up_head_dim(pb.head_dim);
  FLASH_CHECK(pb.head_dim_rounded != 0, "flash_attn_hopper: head dim must be a multiple of ",
              flash::manifest::kHeadDimMultiple, " and at most ", flash::manifest::kMaxHeadDim, ", got ", pb.head_dim);
  if (qv) {
    bool const qv_dims = pb.head_dim_rounded == 64 && k.size(3) == pb.head_dim &&
                         flash::fwd_qv_head_dim_v(int(pb.head_dim_v)) != 0 &&
                         pb.head_dim_v % flash::manifest::kHeadDimMultiple == 0;
    FLASH_CHECK(qv_dims, "flash_attn_hopper: qv needs q and k head dims of at most 64 and v's in (64, 512], a ",
                "multiple of 8; got ", pb.head_dim, ", ", k.size(3), ", ", pb.head_dim_v);
  }
  int const own_dv = qv ? 512 : value_head_dim ? flash::fwd_value_head_dim(pb.head_dim_rounded) : 0;
  bool const dv_ok = pb.head_dim_v == pb.head_dim ||
                     (pb.head_dim_v > 0 && pb.head_dim_v <= own_dv && pb.head_dim_v % flash::manifest::kHeadDimMultiple == 0);
  FLASH_CHECK(k.size(3) == pb.head_dim && dv_ok, "flash_attn_hopper: q and k must have the same head dim, and v ",
              own_dv ? "its own only up to " + std::to_string(own_dv) + " (a multiple of 8)" : std::string("too"),
              "; got ", pb.head_dim, ", ", k.size(3), ", ", pb.head_dim_v);
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
void check_scale(double softmax_scale, double softcap) {
  FLASH_CHECK(std::isfinite(softmax_scale) && softmax_scale > 0,
              "flash_attn_hopper: softmax_scale must be a positive finite number");
  // softcap 0 is off; a positive one must leave softmax_scale / softcap a finite float.
  FLASH_CHECK(softcap == 0 || (softcap > 0 && std::isfinite(float(softcap)) && std::isfinite(float(softmax_scale / softcap))),
              "flash_attn_hopper: softcap must be 0 (off) or a positive finite number with softmax_scale / softcap finite");
#ifdef FLASH_DISABLE_SOFTCAP
  FLASH_CHECK(softcap == 0, "flash_attn_hopper: this build has no softcap kernels (built with ",
              flash::manifest::kEnvDisableSoftcap, "=1)");
#endif
}

// A learnable sink: null, or float32 (heads_q,) contiguous on q's device (the Python layer casts
// the caller's dtype); its pointer for FwdParams::sink_ptr.
float const* sink_pointer(std::optional<Tensor> const& sink, Tensor const& q, int64_t heads_q) {
  if (!sink) { return nullptr; }
  FLASH_CHECK(sink->scalar_type() == kFloat && sink->dim() == 1 && sink->size(0) == heads_q && sink->is_contiguous(),
              "flash_attn_hopper: sink must be a contiguous float32 tensor of shape (nheads,) = (", heads_q, ",)");
  FLASH_CHECK(same_device(*sink, q), "flash_attn_hopper: sink must be on q's device");
  return sink->const_data_ptr<float>();
}

// qv (FA3's): q's dtype and device, sizes `sizes` (q's with v's head dim), a contiguous last
// dimension; checked before anything is allocated.
void check_qv(std::optional<Tensor> const& qv, Tensor const& q, std::vector<int64_t> const& sizes) {
  if (!qv) { return; }
  FLASH_CHECK(qv->scalar_type() == q.scalar_type() && same_device(*qv, q),
              "flash_attn_hopper: qv must have q's dtype and device");
  FLASH_CHECK(sizes_of(*qv) == sizes, "flash_attn_hopper: qv must be shaped like q with v's head dim");
  FLASH_CHECK(qv->stride(qv->dim() - 1) == 1, "flash_attn_hopper: the last dimension of qv must be contiguous");
}

// FwdParams' qv from qv4, qv as a 4-D (batch, rows, heads, dv) view ready for TMA.
void set_qv(flash::FwdParams& params, Tensor const& qv4) {
  params.qv_ptr = qv4.data_ptr();
  params.qv_batch_stride = qv4.stride(0);
  params.qv_row_stride = qv4.stride(1);
  params.qv_head_stride = qv4.stride(2);
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

// What both directions' params share: q, k, v pointers and strides, sizes, scale, softcap, window, SMs.
template <typename Params>
void fill_common(Params& params, Problem const& pb, Tensor const& qt, Tensor const& kt, Tensor const& vt,
                 double softmax_scale, double softcap, Window const& window) {
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
  if constexpr (requires { params.head_dim_v; }) { params.head_dim_v = int(pb.head_dim_v); }  // the forward's
  params.softmax_scale = float(softmax_scale);
  params.softmax_scale_log2 = float((softcap > 0 ? softcap : softmax_scale) * M_LOG2E);
  params.softcap = float(softcap);
  params.softcap_prescale = softcap > 0 ? float(softmax_scale / softcap) : 0.f;
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

// A varlen call's params: the sequences, their count, and the longest ones (the grid).
template <typename Params>
void set_varlen(Params& params, Varlen const& vl, Tensor const& cu_seqlens_q, Tensor const& cu_seqlens_k,
                std::optional<Tensor> const& seqused_q, std::optional<Tensor> const& seqused_k, bool top_left) {
  flash::VarlenArgs& args = params.varlen;
  args.cu_seqlens_q = cu_seqlens_q.mutable_data_ptr<int32_t>();
  args.cu_seqlens_k = cu_seqlens_k.mutable_data_ptr<int32_t>();
  args.seqused_q = seqused_q ? seqused_q->mutable_data_ptr<int32_t>() : nullptr;
  args.seqused_k = seqused_k ? seqused_k->mutable_data_ptr<int32_t>() : nullptr;
  args.total_q = int(vl.total_q);
  args.total_k = int(vl.total_k);
  args.top_left = top_left;
  args.batch = int(vl.batch);
  params.batch = int(vl.batch);
  params.seqlen_q = int(vl.max_seqlen_q);
  params.seqlen_k = int(vl.max_seqlen_k);
}

// A varlen call's sequences, and its packed q, k, v as one (1, total, heads, d) batch entry with
// the dense checks passed (dtypes, head dim, GQA, strides, sizes).
struct VarlenCall {
  Varlen vl;
  Tensor q4, k4, v4;
  Problem pb;
};

VarlenCall check_varlen_call(bool value_head_dim, Tensor const& q, Tensor const& k, Tensor const& v,
                             Tensor const& cu_seqlens_q,
                             Tensor const& cu_seqlens_k, std::optional<Tensor> const& seqused_q,
                             std::optional<Tensor> const& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                             bool qv = false, bool fp8 = false) {
  FLASH_CHECK(v.dim() == 3, "flash_attn_hopper: varlen q, k and v must be 3-D (total_tokens, nheads, headdim)");
  Varlen const vl = check_varlen(q, k, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k);
  Tensor const q4 = unsqueeze0(q), k4 = unsqueeze0(k), v4 = unsqueeze0(v);
  return {vl, q4, k4, v4, check_problem(q4, k4, v4, value_head_dim, qv, fp8)};
}

}  // namespace
