// The FP8 forward (launch/fp8_launch.cuh): q, k, v float8_e4m3fn with optional float32 descales
// (batch, nheads_kv) as FA3 takes them, out bf16, the LSE float32; causal / window / softcap / sink.
// Here the kernel lookup, the descales and the dense op fwd_fp8; varlen_fwd_fp8 and paged_fwd_fp8 are
// the 16-bit ops' implementations with the descales (api/varlen.h, api/paged.h: split-KV and PackGQA
// as there). Forward only, as FA3; no qv or dv != d (flash_attn_hopper/fp8.py refuses them first).
// Included by flash_api.cpp.
#pragma once

namespace {

// The FP8 kernels' head dim for q's (a multiple of 16: 16-byte TMA rows), 0 if none.
int fp8_head_dim(int64_t head_dim) {
  if (head_dim <= 0 || head_dim % 16 != 0) { return 0; }
  return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : head_dim <= 256 ? 256 : 0;
}

FwdFn find_fp8(int head_dim) {
#define FLASH_ATTN_HOPPER_MATCH_FP8(D, T) \
  if (head_dim == D) { return &flash::run_flash_fwd_fp8<D, T>; }
  FLASH_ATTN_HOPPER_FOR_EACH_FP8(FLASH_ATTN_HOPPER_MATCH_FP8)
#undef FLASH_ATTN_HOPPER_MATCH_FP8
  return nullptr;
}

// The FP8 kernels of the call's head dim, or a clear error naming the build knob.
FwdFn fp8_kernels(Problem const& pb) {
  int const head_dim = fp8_head_dim(pb.head_dim);
  FLASH_CHECK(head_dim != 0, "flash_attn_hopper: the FP8 forward takes head dims that are multiples of 16 up to 256, got ",
              pb.head_dim);
  FwdFn const fwd = find_fp8(head_dim);
  FLASH_CHECK(fwd != nullptr, "flash_attn_hopper: this build has no FP8 forward kernels for head dim ", pb.head_dim,
              " (hdim ", head_dim, "); rebuild with ", flash::manifest::kEnvDtypes, " including fp8 and ",
              flash::manifest::kEnvHdims, " including ", head_dim);
  return fwd;
}

// A descale: null, or float32 (batch, heads_kv) on q's device, any strides (FA3 takes expanded ones).
void set_descale(std::optional<Tensor> const& t, char const* name, Problem const& pb, int64_t batch, Tensor const& q,
                 float const*& ptr, int64_t& batch_stride, int64_t& head_stride) {
  if (!t) { return; }
  FLASH_CHECK(t->scalar_type() == kFloat && t->dim() == 2 && t->size(0) == batch && t->size(1) == pb.heads_kv,
              "flash_attn_hopper: ", name, " must be a float32 tensor of shape (batch, nheads_kv) = (", batch, ", ",
              pb.heads_kv, ")");
  FLASH_CHECK(same_device(*t, q), "flash_attn_hopper: ", name, " must be on q's device");
  ptr = t->const_data_ptr<float>();
  batch_stride = t->stride(0);
  head_stride = t->stride(1);
}

// The three descales of an FP8 call (the paged op passes them through mha_paged_fwd_impl).
struct Fp8Descales {
  std::optional<Tensor> const& q;
  std::optional<Tensor> const& k;
  std::optional<Tensor> const& v;
};

void set_descales(flash::FwdParams& params, Problem const& pb, int64_t batch, Tensor const& q,
                  std::optional<Tensor> const& q_descale, std::optional<Tensor> const& k_descale,
                  std::optional<Tensor> const& v_descale) {
  set_descale(q_descale, "q_descale", pb, batch, q, params.q_descale_ptr, params.q_descale_batch_stride,
              params.q_descale_head_stride);
  set_descale(k_descale, "k_descale", pb, batch, q, params.k_descale_ptr, params.k_descale_batch_stride,
              params.k_descale_head_stride);
  set_descale(v_descale, "v_descale", pb, batch, q, params.v_descale_ptr, params.v_descale_batch_stride,
              params.v_descale_head_stride);
}

std::tuple<Tensor, Tensor> mha_fwd_fp8(Tensor const& q, Tensor const& k, Tensor const& v,
                                       std::optional<Tensor> const& q_descale, std::optional<Tensor> const& k_descale,
                                       std::optional<Tensor> const& v_descale, double softmax_scale, bool causal,
                                       int64_t window_size_left, int64_t window_size_right, bool top_left,
                                       double softcap, std::optional<Tensor> const& sink) {
  Problem const pb = check_problem(q, k, v, /*value_head_dim=*/false, /*qv=*/false, /*fp8=*/true);
  check_scale(softmax_scale, softcap);
  FwdFn const fwd = fp8_kernels(pb);
  float const* const sink_ptr = sink_pointer(sink, q, pb.heads_q);
  flash::FwdParams params{};
  set_descales(params, pb, pb.batch, q, q_descale, k_descale, v_descale);
  torch::stable::accelerator::DeviceGuard device_guard(q.get_device());

  Tensor out = empty_like_dev(q, {pb.batch, pb.seqlen_q, pb.heads_q, pb.head_dim}, ScalarType::BFloat16);
  Tensor lse = empty_like_dev(q, {pb.batch, pb.heads_q, pb.seqlen_q}, kFloat);
  if (pb.batch == 0 || pb.seqlen_q == 0 || pb.heads_q == 0) { return {out, lse}; }
  if (pb.seqlen_k == 0) {  // nothing to attend to: O = 0, LSE = -inf (or the sink's logit)
    torch::stable::zero_(out);
    fill_empty_lse(lse, sink, {1, pb.heads_q, 1});
    return {out, lse};
  }
  Tensor const qt = tma_ready(q), kt = tma_ready(k), vt = tma_ready(v);
  fill_common(params, pb, qt, kt, vt, softmax_scale, softcap,
              make_window(pb, causal, window_size_left, window_size_right, top_left));
  set_outputs(params, out, lse, sink_ptr);
  run_fwd_counted(fwd, params,
                  flash::fwd_fp8_needs_tile_counter(fp8_head_dim(pb.head_dim), params.is_local, softcap > 0,
                                                    params.seqlen_k),
                  q, pb.device);
  return {out, lse};
}

}  // namespace
