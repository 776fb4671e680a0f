// The variable-length forward ops (flash_attn_varlen_func): 16-bit, qv and FP8 inputs on one
// implementation. Included by flash_api.cpp after api/fp8.h and launch_varlen.
#pragma once

namespace {

// Variable-length forward: q (total_q, heads, d), k and v (total_k, heads_kv, d), sequence b at
// rows cu_seqlens[b] (FwdParams says how the kernels read them). Returns out like q and the LSE
// (heads, total_q). With seqused_q, rows outside every sequence's used part are 0 (LSE -inf).
// qv: FA3's extra query on the qv kernels. fp8 (varlen_fwd_fp8): e4m3 q, k, v with their descales on
// the FP8 kernels, out bf16.
std::tuple<Tensor, Tensor> mha_varlen_fwd_impl(Tensor const& q, Tensor const& k, Tensor const& v,
                                                  Tensor const& cu_seqlens_q, Tensor const& cu_seqlens_k,
                                                  std::optional<Tensor> const& seqused_q,
                                                  std::optional<Tensor> const& seqused_k, int64_t max_seqlen_q,
                                                  int64_t max_seqlen_k, double softmax_scale, bool causal,
                                                  int64_t window_size_left, int64_t window_size_right, bool top_left,
                                                  double softcap, std::optional<Tensor> const& sink,
                                                  int64_t num_splits, int64_t pack_gqa,
                                                  std::optional<Tensor> const& qv, Fp8Descales const* fp8 = nullptr) {
  auto const [vl, q4, k4, v4, pb] =
      check_varlen_call(/*value_head_dim=*/!fp8, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
                        max_seqlen_q, max_seqlen_k, qv.has_value(), fp8 != nullptr);
  check_scale(softmax_scale, softcap);
  check_qv(qv, q, {vl.total_q, pb.heads_q, pb.head_dim_v});
  FLASH_CHECK(!qv || pack_gqa == 1, "flash_attn_hopper: qv runs without pack_gqa");
  float const* const sink_ptr = sink_pointer(sink, q, pb.heads_q);
  torch::stable::accelerator::DeviceGuard device_guard(q.get_device());
  FwdFn const fwd = fp8 ? fp8_kernels(pb) : find_fwd_for(pb.head_dim_rounded, pb.is_bf16, qv.has_value());
  FLASH_CHECK(fwd != nullptr, not_compiled(qv ? "qv forward" : "forward", pb, q.scalar_type()));
  flash::FwdParams params{};
  if (fp8) { set_descales(params, pb, vl.batch, q, fp8->q, fp8->k, fp8->v); }

  check_pack_gqa(pack_gqa, vl.total_q, vl.batch, softcap > 0, seqused_q.has_value(), sink.has_value());
  int64_t const rows = vl.total_q / pack_gqa, heads = pb.heads_q * pack_gqa;  // of out and the LSE
  bool const gaps = seqused_q.has_value();  // rows no sequence uses: 0 / -inf (the sink's logit), as rows without keys
  std::vector<int64_t> const o_sizes{rows, heads, pb.head_dim_v};
  std::optional<ScalarType> const o_dtype = fp8 ? std::optional(ScalarType::BFloat16) : std::nullopt;
  Tensor out = gaps ? zeros_like_dev(q, o_sizes, o_dtype) : empty_like_dev(q, o_sizes, o_dtype);
  Tensor lse = empty_like_dev(q, {heads, rows}, kFloat);
  if (vl.batch == 0 || vl.total_q == 0 || pb.heads_q == 0) { return {out, lse}; }
  if (vl.total_k == 0 || vl.max_seqlen_k == 0 || vl.max_seqlen_q == 0) {  // nothing to attend to
    torch::stable::zero_(out);
    fill_empty_lse(lse, sink, {heads, 1});
    return {out, lse};
  }
  if (gaps) { fill_empty_lse(lse, sink, {pb.heads_q, 1}); }

  Tensor const qt = tma_ready(q4), kt = tma_ready(k4), vt = tma_ready(v4);
  fill_common(params, pb, qt, kt, vt, softmax_scale, softcap,
              make_window(pb, causal, window_size_left, window_size_right, top_left));
  set_varlen(params, vl, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, top_left);
  Tensor const qvt = qv ? tma_ready(unsqueeze0(*qv)) : Tensor{};
  if (qv) { set_qv(params, qvt); }
  launch_varlen(fwd, params, vl, pb, q, out, lse, sink_ptr, softcap > 0, num_splits, /*tile_counter=*/!qv && !fp8,
                pack_gqa);
  return {out, lse};
}

// The schemas' entry points: varlen_fwd, varlen_fwd_qv (FA3's qv), varlen_fwd_fp8 (descales).
std::tuple<Tensor, Tensor> mha_varlen_fwd(Tensor const& q, Tensor const& k, Tensor const& v,
                                          Tensor const& cu_seqlens_q, Tensor const& cu_seqlens_k,
                                          std::optional<Tensor> const& seqused_q,
                                          std::optional<Tensor> const& seqused_k, int64_t max_seqlen_q,
                                          int64_t max_seqlen_k, double softmax_scale, bool causal,
                                          int64_t window_size_left, int64_t window_size_right, bool top_left,
                                          double softcap, std::optional<Tensor> const& sink, int64_t num_splits,
                                          int64_t pack_gqa) {
  return mha_varlen_fwd_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                             softmax_scale, causal, window_size_left, window_size_right, top_left, softcap, sink,
                             num_splits, pack_gqa, std::nullopt);
}
std::tuple<Tensor, Tensor> mha_varlen_fwd_qv(Tensor const& q, Tensor const& k, Tensor const& v, Tensor const& qv,
                                             Tensor const& cu_seqlens_q, Tensor const& cu_seqlens_k,
                                             std::optional<Tensor> const& seqused_q,
                                             std::optional<Tensor> const& seqused_k, int64_t max_seqlen_q,
                                             int64_t max_seqlen_k, double softmax_scale, bool causal,
                                             int64_t window_size_left, int64_t window_size_right, bool top_left,
                                             double softcap, std::optional<Tensor> const& sink, int64_t num_splits) {
  return mha_varlen_fwd_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                             softmax_scale, causal, window_size_left, window_size_right, top_left, softcap, sink,
                             num_splits, 1, qv);
}
std::tuple<Tensor, Tensor> mha_varlen_fwd_fp8(Tensor const& q, Tensor const& k, Tensor const& v,
                                              Tensor const& cu_seqlens_q, Tensor const& cu_seqlens_k,
                                              std::optional<Tensor> const& seqused_q,
                                              std::optional<Tensor> const& seqused_k, int64_t max_seqlen_q,
                                              int64_t max_seqlen_k, std::optional<Tensor> const& q_descale,
                                              std::optional<Tensor> const& k_descale,
                                              std::optional<Tensor> const& v_descale, double softmax_scale,
                                              bool causal, int64_t window_size_left, int64_t window_size_right,
                                              bool top_left, double softcap, std::optional<Tensor> const& sink,
                                              int64_t num_splits, int64_t pack_gqa) {
  Fp8Descales const fp8{q_descale, k_descale, v_descale};
  return mha_varlen_fwd_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                             softmax_scale, causal, window_size_left, window_size_right, top_left, softcap, sink,
                             num_splits, pack_gqa, std::nullopt, &fp8);
}

}  // namespace
