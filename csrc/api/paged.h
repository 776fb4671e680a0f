// The paged-KV forward ops (flash_attn_with_kvcache / flash_attn_varlen_func with a page table):
// 16-bit, qv and FP8 caches. Included by flash_api.cpp after api/checks.h, api/split.h and api/fp8.h.
#pragma once

namespace {

FwdFn find_paged(int head_dim_rounded, bool is_bf16) {
#define FLASH_ATTN_HOPPER_MATCH_PAGED(D, T)                                          \
  if (head_dim_rounded == D && std::is_same_v<T, cutlass::bfloat16_t> == is_bf16) { \
    return &flash::run_flash_fwd_paged<D, T>;                                        \
  }
  FLASH_ATTN_HOPPER_FOR_EACH_PAGED(FLASH_ATTN_HOPPER_MATCH_PAGED)
#undef FLASH_ATTN_HOPPER_MATCH_PAGED
  return nullptr;
}

// q (total_q, heads, d) with cu_seqlens_q; k_cache / v_cache (num_pages, page_size, heads_kv, d)
// read in place through page_table (batch, max_pages) int32: sequence b's keys are seqused_k[b]
// logical positions from cu_seqlens_k[b] of its pages (FwdParams). Contents of the index tensors
// are never read here: the kernels clamp them. Returns out like q and the LSE (heads, total_q).
// qv (the paged_fwd_qv op): FA3's extra query on the qv kernels; v_cache then has v's head dim.
// fp8 (the paged_fwd_fp8 op): e4m3 q and caches with their descales, out bf16.
std::tuple<Tensor, Tensor> mha_paged_fwd_impl(Tensor const& q, Tensor const& k_cache, Tensor const& v_cache,
                                              Tensor const& page_table, Tensor const& cu_seqlens_q,
                                              Tensor const& cu_seqlens_k, Tensor const& seqused_k,
                                              int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
                                              bool causal, int64_t window_size_left, int64_t window_size_right,
                                              bool top_left, double softcap, std::optional<Tensor> const& sink,
                                              int64_t num_splits, int64_t pack_gqa, std::optional<Tensor> const& qv,
                                              Fp8Descales const* fp8 = nullptr) {
  FLASH_CHECK(q.dim() == 3, "flash_attn_hopper: with a page table q must be 3-D (total_q, nheads, headdim)");
  bool const same_rows = k_cache.dim() == 4 && v_cache.dim() == 4 && k_cache.size(0) == v_cache.size(0) &&
                         k_cache.size(1) == v_cache.size(1) && k_cache.size(2) == v_cache.size(2);
  FLASH_CHECK(same_rows && (qv || same_sizes(k_cache, v_cache)),
              "flash_attn_hopper: k_cache and v_cache must be (num_pages, page_size, nheads_kv, headdim) of one shape",
              qv ? " (v's head dim its own with qv)" : "");
  int64_t const num_pages = k_cache.size(0), page_size = k_cache.size(1);
  FLASH_CHECK(num_pages >= 1 && page_size >= 1, "flash_attn_hopper: a paged cache needs at least one page and row");
  FLASH_CHECK(page_table.scalar_type() == kInt && page_table.dim() == 2 && page_table.stride(1) == 1,
              "flash_attn_hopper: page_table must be an int32 (batch, max_pages) tensor with contiguous rows");
  FLASH_CHECK(same_device(page_table, q), "flash_attn_hopper: page_table must be on q's device");
  // The cache is read in place with 16-byte copies: a 16-byte aligned base and strides.
  auto copyable = [](Tensor const& t) {
    int64_t const elem = t.element_size();
    bool ok = reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(3) == 1;
    for (int i = 0; i < 3; ++i) { ok = ok && (t.stride(i) * elem) % 16 == 0; }
    return ok;
  };
  FLASH_CHECK(copyable(k_cache) && copyable(v_cache),
              "flash_attn_hopper: k_cache and v_cache must have a contiguous last dimension, 16-byte aligned "
              "data and strides that are multiples of 16 bytes");
  // One page as a (1, page_size, heads_kv, d) batch entry passes the dense checks (dtypes, head
  // dim, GQA); its batch stride is the page stride.
  Tensor k_pages = k_cache, v_pages = v_cache;  // handles: narrow takes a non-const one
  Tensor const k4 = torch::stable::narrow(k_pages, 0, 0, 1), v4 = torch::stable::narrow(v_pages, 0, 0, 1);
  Tensor const q4 = unsqueeze0(q);
  Problem pb = check_problem(q4, k4, v4, /*value_head_dim=*/qv.has_value(), qv.has_value(), fp8 != nullptr);
  Varlen vl = check_varlen(q, torch::stable::select(k_pages, 0, 0), cu_seqlens_q, cu_seqlens_k, std::nullopt,
                           seqused_k, max_seqlen_q, max_seqlen_k);
  FLASH_CHECK(page_table.size(0) == vl.batch, "flash_attn_hopper: page_table must have one row per sequence (",
              vl.batch, "), got ", page_table.size(0));
  int64_t const capacity = page_table.size(1) * page_size;  // the longest key list a page-table row holds
  FLASH_CHECK(page_table.size(1) >= 1 && capacity + vl.total_q <= flash::manifest::kMaxSeqlenSum,
              "flash_attn_hopper: page_table needs at least one column, and max_pages x page_size + total_q must "
              "be at most ", flash::manifest::kMaxSeqlenSum);
  vl.total_k = capacity;
  vl.max_seqlen_k = std::min(max_seqlen_k, capacity);
  pb.seqlen_k = vl.max_seqlen_k;
  check_scale(softmax_scale, softcap);
  float const* const sink_ptr = sink_pointer(sink, q, pb.heads_q);
  torch::stable::accelerator::DeviceGuard device_guard(q.get_device());
  check_qv(qv, q, {vl.total_q, pb.heads_q, pb.head_dim_v});
  FLASH_CHECK(!qv || pack_gqa == 1, "flash_attn_hopper: qv runs without pack_gqa");
  FwdFn const fwd = fp8  ? fp8_kernels(pb)
                     : qv ? find_fwd_for(pb.head_dim_rounded, pb.is_bf16, true)
                          : find_paged(pb.head_dim_rounded, pb.is_bf16);
  FLASH_CHECK(fwd != nullptr, not_compiled(qv ? "qv forward" : "paged-KV forward", pb, q.scalar_type()));
  flash::FwdParams params{};
  if (fp8) { set_descales(params, pb, vl.batch, q, fp8->q, fp8->k, fp8->v); }

  check_pack_gqa(pack_gqa, vl.total_q, vl.batch, softcap > 0, false, sink.has_value());
  int64_t const rows = vl.total_q / pack_gqa, heads = pb.heads_q * pack_gqa;  // of out and the LSE
  Tensor out = empty_like_dev(q, {rows, heads, pb.head_dim_v}, fp8 ? std::optional(ScalarType::BFloat16) : std::nullopt);
  Tensor lse = empty_like_dev(q, {heads, rows}, kFloat);
  if (vl.batch == 0 || vl.total_q == 0 || pb.heads_q == 0) { return {out, lse}; }
  if (vl.max_seqlen_k == 0 || vl.max_seqlen_q == 0) {  // nothing to attend to
    torch::stable::zero_(out);
    fill_empty_lse(lse, sink, {heads, 1});
    return {out, lse};
  }

  Tensor const qt = tma_ready(q4);
  fill_common(params, pb, qt, k4, v4, softmax_scale, softcap,
              make_window(pb, causal, window_size_left, window_size_right, top_left));
  set_varlen(params, vl, cu_seqlens_q, cu_seqlens_k, std::nullopt, seqused_k, top_left);
  params.page_table = page_table.const_data_ptr<int32_t>();
  params.page_table_stride = page_table.stride(0);
  params.page_size = int(page_size);
  params.num_pages = int(std::min<int64_t>(num_pages, std::numeric_limits<int>::max()));
  Tensor const qvt = qv ? tma_ready(unsqueeze0(*qv)) : Tensor{};
  if (qv) { set_qv(params, qvt); }
  // The paged kernels are one CTA per tile: no tile counter.
  launch_varlen(fwd, params, vl, pb, q, out, lse, sink_ptr, softcap > 0, num_splits, /*tile_counter=*/false,
                pack_gqa);
  return {out, lse};
}

std::tuple<Tensor, Tensor> mha_paged_fwd(Tensor const& q, Tensor const& k_cache, Tensor const& v_cache,
                                         Tensor const& page_table, Tensor const& cu_seqlens_q,
                                         Tensor const& cu_seqlens_k, Tensor const& seqused_k, int64_t max_seqlen_q,
                                         int64_t max_seqlen_k, double softmax_scale, bool causal,
                                         int64_t window_size_left, int64_t window_size_right, bool top_left,
                                         double softcap, std::optional<Tensor> const& sink, int64_t num_splits,
                                         int64_t pack_gqa) {
  return mha_paged_fwd_impl(q, k_cache, v_cache, page_table, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                            max_seqlen_k, softmax_scale, causal, window_size_left, window_size_right, top_left,
                            softcap, sink, num_splits, pack_gqa, std::nullopt);
}
std::tuple<Tensor, Tensor> mha_paged_fwd_qv(Tensor const& q, Tensor const& k_cache, Tensor const& v_cache,
                                            Tensor const& qv, Tensor const& page_table, Tensor const& cu_seqlens_q,
                                            Tensor const& cu_seqlens_k, Tensor const& seqused_k,
                                            int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
                                            bool causal, int64_t window_size_left, int64_t window_size_right,
                                            bool top_left, double softcap, std::optional<Tensor> const& sink,
                                            int64_t num_splits) {
  return mha_paged_fwd_impl(q, k_cache, v_cache, page_table, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                            max_seqlen_k, softmax_scale, causal, window_size_left, window_size_right, top_left,
                            softcap, sink, num_splits, 1, qv);
}

std::tuple<Tensor, Tensor> mha_paged_fwd_fp8(Tensor const& q, Tensor const& k_cache, Tensor const& v_cache,
                                             Tensor const& page_table, Tensor const& cu_seqlens_q,
                                             Tensor const& cu_seqlens_k, Tensor const& seqused_k,
                                             int64_t max_seqlen_q, int64_t max_seqlen_k,
                                             std::optional<Tensor> const& q_descale,
                                             std::optional<Tensor> const& k_descale,
                                             std::optional<Tensor> const& v_descale, double softmax_scale,
                                             bool causal, int64_t window_size_left, int64_t window_size_right,
                                             bool top_left, double softcap, std::optional<Tensor> const& sink,
                                             int64_t num_splits, int64_t pack_gqa) {
  Fp8Descales const fp8{q_descale, k_descale, v_descale};
  return mha_paged_fwd_impl(q, k_cache, v_cache, page_table, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                            max_seqlen_k, softmax_scale, causal, window_size_left, window_size_right, top_left,
                            softcap, sink, num_splits, pack_gqa, std::nullopt, &fp8);
}

}  // namespace
