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
#ifndef FLASH_ATTN_HOPPER_FOR_EACH_PAGED  // a registry without paged-KV kernels
#define FLASH_ATTN_HOPPER_FOR_EACH_PAGED(X)
#endif
#ifndef FLASH_ATTN_HOPPER_FOR_EACH_QV  // a registry without qv kernels
#define FLASH_ATTN_HOPPER_FOR_EACH_QV(X)
#endif
#ifndef FLASH_ATTN_HOPPER_FOR_EACH_FP8  // a registry without FP8 kernels
#define FLASH_ATTN_HOPPER_FOR_EACH_FP8(X)
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
template <int kHeadDim, typename Element>
void run_flash_fwd_paged(FwdParams& params, cudaStream_t stream);
template <int kHeadDim, typename Element>
void run_flash_fwd_qv(FwdParams& params, cudaStream_t stream);
template <int kHeadDim, typename Element>
void run_flash_fwd_fp8(FwdParams& params, cudaStream_t stream);
#if FLASH_ATTN_HOPPER_BUILD_BWD
template <int kHeadDim, typename Element>
void run_flash_bwd(BwdParams& params, cudaStream_t stream);
#endif
}  // namespace flash

#include "api/checks.h"  // tensor helpers and argument checks
#include "api/combine_op.h"  // fwd_combine
#include "api/split.h"       // split-KV calls

namespace {

// The LSE of rows that see no key: -inf, or with a sink that head's logit (sink viewed as `shape`,
// broadcast over the rows).
void fill_empty_lse(Tensor& lse, std::optional<Tensor> const& sink, std::vector<int64_t> const& shape) {
  if (sink) {
    torch::stable::copy_(lse, torch::stable::view(*sink, shape));
  } else {
    torch::stable::fill_(lse, -std::numeric_limits<float>::infinity());
  }
}

// Launches the forward on the current stream, with the zeroed tile counter that the dynamic
// persistent causal/local kernels draw from where tile_counter_needed (a 4-byte memset rather than a
// zeros op's fill kernel).
void run_fwd_counted(FwdFn fwd, flash::FwdParams& params, bool tile_counter_needed, Tensor const& like, int device) {
  cudaStream_t const stream = current_stream(device);
  Tensor tile_counter;
  if (tile_counter_needed) {
    tile_counter = empty_like_dev(like, {1}, kInt);
    params.tile_counter = tile_counter.mutable_data_ptr<int32_t>();
    FLASH_CUDA_CHECK(cudaMemsetAsync(params.tile_counter, 0, sizeof(int), stream));
  }
  fwd(params, stream);
}
// The 16-bit kernels: the counter where policy.h's fwd_needs_tile_counter says the kernel is dynamic.
void run_fwd(FwdFn fwd, flash::FwdParams& params, int head_dim_rounded, Tensor const& like, int device) {
  run_fwd_counted(fwd, params, flash::fwd_needs_tile_counter(head_dim_rounded, params.is_local, params.seqlen_k),
                  like, device);
}

// The forward's outputs in its params: out viewed as (batch, rows, heads, d), the LSE, the sink.
void set_outputs(flash::FwdParams& params, Tensor const& out4, Tensor& lse, float const* sink_ptr) {
  params.o_ptr = out4.data_ptr();
  params.lse_ptr = lse.mutable_data_ptr<float>();
  params.sink_ptr = sink_ptr;
  params.o_batch_stride = out4.stride(0);
  params.o_row_stride = out4.stride(1);
  params.o_head_stride = out4.stride(2);
}

// PackGQA inside the op (pack_gqa = g > 1, decode steps): q comes as (total_q, heads_kv, d) rows
// t * g + j holding query head h * g + j of token t (packgqa.py's pack_rows), and out / the LSE go
// back per query head, (total_q / g, heads_kv * g, dv) and (heads_kv * g, total_q / g), written by
// the combine, so no copy unpacks them. Not with softcap (unsplit), seqused_q or a sink.
void check_pack_gqa(int64_t pack_gqa, int64_t total_q, int64_t batch, bool softcap, bool seqused_q, bool sink) {
  FLASH_CHECK(pack_gqa >= 1, "flash_attn_hopper: pack_gqa must be >= 1, got ", pack_gqa);
  FLASH_CHECK(pack_gqa == 1 || (total_q % pack_gqa == 0 && !softcap && !seqused_q && !sink),
              "flash_attn_hopper: pack_gqa > 1 needs total_q a multiple of it and no softcap, seqused_q or sink");
  FLASH_CHECK(pack_gqa == 1 || 2 * batch <= kMaxGridBatches,
              "flash_attn_hopper: pack_gqa > 1 splits every sequence at least in two; too many sequences (", batch,
              ")");
}

// A varlen (or paged) forward whose params hold the problem: out / LSE pointers (out (total_q,
// heads, d), LSE (heads, total_q)), the split plan, and the kernels, with the combine when split
// (the partial buffers hold the packed rows as one batch entry) and the tile counter where asked.
// With PackGQA (pack_gqa > 1, see packed_outputs) the call always splits, at least in two: the
// combine writes out and the LSE per query head.
void launch_varlen(FwdFn fwd, flash::FwdParams& params, Varlen const& vl, Problem const& pb, Tensor const& q,
                   Tensor const& out, Tensor& lse, float const* sink_ptr, bool softcap, int64_t num_splits,
                   bool tile_counter, int64_t pack_gqa = 1) {
  set_outputs(params, unsqueeze0(out), lse, sink_ptr);
  int splits = choose_splits(num_splits, vl.batch, vl.max_seqlen_q, vl.max_seqlen_k, pb.heads_q,
                             pb.head_dim_rounded, softcap, params.num_sms,
                             q.scalar_type() == ScalarType::Float8_e4m3fn);
  if (pack_gqa > 1) { splits = std::max(splits, 2); }
  cudaStream_t const stream = current_stream(pb.device);
  if (splits > 1) {
    SplitRun const run(params, q, splits, /*varlen=*/true, 1, vl.total_q, pb.heads_q, pb.head_dim_v, out,
                       out.stride(0), out.stride(1), 0, int(pack_gqa));
    fwd(params, stream);
    run.finish(out.scalar_type() == ScalarType::BFloat16, stream);  // FP8 calls' out is bf16
  } else if (tile_counter) {
    run_fwd(fwd, params, pb.head_dim_rounded, q, pb.device);
  } else {
    fwd(params, stream);
  }
}

// qv (the fwd_qv op): FA3's extra query, on the qv kernels (d 64, dv in (64, 512]).
std::tuple<Tensor, Tensor> mha_fwd_impl(Tensor const& q, Tensor const& k, Tensor const& v,
                                           double softmax_scale, bool causal, int64_t window_size_left,
                                           int64_t window_size_right, bool top_left, double softcap,
                                           std::optional<Tensor> const& sink, int64_t num_splits,
                                           std::optional<Tensor> const& qv) {
  Problem const pb = check_problem(q, k, v, /*value_head_dim=*/true, qv.has_value());
  check_scale(softmax_scale, softcap);
  check_qv(qv, q, {pb.batch, pb.seqlen_q, pb.heads_q, pb.head_dim_v});
  float const* const sink_ptr = sink_pointer(sink, q, pb.heads_q);
  torch::stable::accelerator::DeviceGuard device_guard(q.get_device());
  auto const [batch, seqlen_q, heads_q, head_dim, seqlen_k, heads_kv, head_dim_rounded, is_bf16, device,
              head_dim_v] = pb;
  FwdFn const fwd = find_fwd_for(head_dim_rounded, is_bf16, qv.has_value());
  FLASH_CHECK(fwd != nullptr, not_compiled(qv ? "qv forward" : "forward", pb, q.scalar_type()));

  Tensor out = empty_like_dev(q, {batch, seqlen_q, heads_q, head_dim_v});
  Tensor lse = empty_like_dev(q, {batch, heads_q, seqlen_q}, kFloat);
  if (batch == 0 || seqlen_q == 0 || heads_q == 0) { return {out, lse}; }
  if (seqlen_k == 0) {  // nothing to attend to: O = 0, LSE = -inf (or the sink's logit)
    torch::stable::zero_(out);
    fill_empty_lse(lse, sink, {1, heads_q, 1});
    return {out, lse};
  }

  Tensor const qt = tma_ready(q), kt = tma_ready(k), vt = tma_ready(v);
  flash::FwdParams params{};
  fill_common(params, pb, qt, kt, vt, softmax_scale, softcap,
              make_window(pb, causal, window_size_left, window_size_right, top_left));
  set_outputs(params, out, lse, sink_ptr);
  Tensor const qvt = qv ? tma_ready(*qv) : Tensor{};
  if (qv) { set_qv(params, qvt); }
  int const splits = choose_splits(num_splits, batch, seqlen_q, seqlen_k, heads_q, head_dim_rounded, softcap > 0,
                                   params.num_sms);
  if (splits > 1) {
    SplitRun const run(params, q, splits, /*varlen=*/false, batch, batch * seqlen_q, heads_q, head_dim_v, out,
                       out.stride(1), out.stride(2), out.stride(0));
    fwd(params, current_stream(device));
    run.finish(is_bf16, current_stream(device));
    return {out, lse};
  }
  run_fwd(fwd, params, head_dim_rounded, q, device);
  return {out, lse};
}

// The schemas' entry points: fwd without qv, fwd_qv with it (varlen ones: api/varlen.h).
std::tuple<Tensor, Tensor> mha_fwd(Tensor const& q, Tensor const& k, Tensor const& v, double softmax_scale,
                                   bool causal, int64_t window_size_left, int64_t window_size_right, bool top_left,
                                   double softcap, std::optional<Tensor> const& sink, int64_t num_splits) {
  return mha_fwd_impl(q, k, v, softmax_scale, causal, window_size_left, window_size_right, top_left, softcap, sink,
                      num_splits, std::nullopt);
}
std::tuple<Tensor, Tensor> mha_fwd_qv(Tensor const& q, Tensor const& k, Tensor const& v, Tensor const& qv,
                                      double softmax_scale, bool causal, int64_t window_size_left,
                                      int64_t window_size_right, bool top_left, double softcap,
                                      std::optional<Tensor> const& sink, int64_t num_splits) {
  return mha_fwd_impl(q, k, v, softmax_scale, causal, window_size_left, window_size_right, top_left, softcap, sink,
                      num_splits, qv);
}
#include "api/fp8.h"     // fwd_fp8 and the FP8 descales (after set_outputs, fill_empty_lse)
#include "api/varlen.h"  // varlen_fwd, varlen_fwd_qv, varlen_fwd_fp8 (after fp8.h, launch_varlen)
#include "api/paged.h"   // paged_fwd, paged_fwd_qv, paged_fwd_fp8 (after fp8.h)

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

// The backward's tensors beside q, k, v: dout, out and dq as 4-D (batch, rows, heads, d) views,
// the LSE, dk and dv (contiguous), and the float32 workspaces.
struct BwdTensors {
  Tensor dout, out, lse, dq, dk, dv, lse_log2, dsum, dq_accum, dq_semaphore, dsink_rows;
};

// Fills the backward params from t; returns the tile counter of the dynamic persistent causal/local
// and varlen kernels (zeroed by the preprocess kernel), or an empty tensor.
Tensor fill_bwd(flash::BwdParams& params, BwdTensors const& t, Tensor const& like, int head_dim_rounded,
                int64_t seqlen_q_padded, bool deterministic) {
  params.do_ptr = t.dout.data_ptr();
  params.do_batch_stride = t.dout.stride(0);
  params.do_row_stride = t.dout.stride(1);
  params.do_head_stride = t.dout.stride(2);
  params.o_ptr = t.out.data_ptr();
  params.o_batch_stride = t.out.stride(0);
  params.o_row_stride = t.out.stride(1);
  params.o_head_stride = t.out.stride(2);
  params.lse_ptr = t.lse.mutable_data_ptr<float>();
  params.dq_ptr = t.dq.data_ptr();
  params.dq_batch_stride = t.dq.stride(0);
  params.dq_row_stride = t.dq.stride(1);
  params.dq_head_stride = t.dq.stride(2);
  params.dk_ptr = t.dk.data_ptr();
  params.dv_ptr = t.dv.data_ptr();
  params.dq_accum_ptr = t.dq_accum.mutable_data_ptr<float>();
  params.lse_log2_ptr = t.lse_log2.mutable_data_ptr<float>();
  params.dsum_ptr = t.dsum.mutable_data_ptr<float>();
  params.dq_semaphore_ptr = deterministic ? t.dq_semaphore.mutable_data_ptr<int32_t>() : nullptr;
  params.dsink_rows_ptr = params.sink_ptr != nullptr ? t.dsink_rows.mutable_data_ptr<float>() : nullptr;
  params.seqlen_q_padded = int(seqlen_q_padded);
  params.head_dim_rounded = head_dim_rounded;
  Tensor tile_counter;
  bool const varlen = params.varlen.cu_seqlens_q != nullptr;  // set_varlen ran before
  if (flash::bwd_needs_tile_counter(head_dim_rounded, params.is_local, deterministic, varlen)) {
    tile_counter = empty_like_dev(like, {1}, kInt);
    params.tile_counter = tile_counter.mutable_data_ptr<int32_t>();
  }
  return tile_counter;
}

// Gradients of fwd: preprocess (D = rowsum(dO * O), LSE in the log2 domain), the main kernel and the
// dQ postprocess all run in run_flash_bwd; here only the workspaces are allocated (the preprocess zeroes dq_accum).
// With a sink (the forward's), dsink is its gradient, -sum over rows of exp(sink - LSE) * D, from
// the preprocess's per-row terms; else an empty tensor.
std::tuple<Tensor, Tensor, Tensor, Tensor> mha_bwd(Tensor const& dout, Tensor const& q, Tensor const& k,
                                                   Tensor const& v, Tensor const& out, Tensor const& softmax_lse,
                                                   double softmax_scale, bool causal, int64_t window_size_left,
                                                   int64_t window_size_right, bool top_left, bool deterministic,
                                                   double softcap, std::optional<Tensor> const& sink) {
  Problem const pb = check_problem(q, k, v, /*value_head_dim=*/true);
  check_scale(softmax_scale, softcap);
  float const* const sink_ptr = sink_pointer(sink, q, pb.heads_q);
  torch::stable::accelerator::DeviceGuard device_guard(q.get_device());
  auto const [batch, seqlen_q, heads_q, head_dim, seqlen_k, heads_kv, head_dim_rounded, is_bf16, device,
              head_dim_v] = pb;
  std::vector<int64_t> const o_sizes{batch, seqlen_q, heads_q, head_dim_v};
  FLASH_CHECK(sizes_of(dout) == o_sizes && sizes_of(out) == o_sizes,
              "flash_attn_hopper: dout and out must be (batch, seqlen_q, nheads, headdim_v) as fwd returns out");
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
  Tensor dv = empty_like_dev(q, {batch, seqlen_k, heads_kv, head_dim_v});
  Tensor dsink = empty_like_dev(q, {sink_ptr ? heads_q : 0}, kFloat);
  if (batch == 0 || heads_q == 0 || seqlen_q == 0 || seqlen_k == 0) {  // no query sees any key (out = 0: D = 0)
    torch::stable::zero_(dq);
    torch::stable::zero_(dk);
    torch::stable::zero_(dv);
    torch::stable::zero_(dsink);
    return {dq, dk, dv, dsink};
  }

  int64_t const seqlen_q_padded = (seqlen_q + flash::kBwdPadM - 1) / flash::kBwdPadM * flash::kBwdPadM;
  ScalarType const f32 = kFloat;
  // Workspaces; the preprocess kernel fills lse_log2 and dsum and zeroes dq_accum, the main kernel adds into it.
  Tensor lse_log2 = empty_like_dev(q, {batch, heads_q, seqlen_q_padded}, f32);
  Tensor dsum = empty_like_dev(q, {batch, heads_q, seqlen_q_padded}, f32);
  Tensor dq_accum = empty_like_dev(q, {batch, heads_q, seqlen_q_padded, head_dim_rounded}, f32);  // zeroed by the preprocess
  // Deterministic mode: one counter per dQ block orders the key blocks' additions into it.
  Tensor dq_semaphore;
  if (deterministic) {
    dq_semaphore = zeros_like_dev(q, {batch, heads_q, seqlen_q_padded / flash::kBwdMinBlockM}, kInt);
  }
  Tensor dsink_rows;  // every row written by the preprocess
  if (sink_ptr) { dsink_rows = empty_like_dev(q, {batch, heads_q, seqlen_q_padded}, f32); }

  Tensor const qt = tma_ready(q), kt = tma_ready(k), vt = tma_ready(v), dot = tma_ready(dout);
  Tensor const ot = tma_ready(out);
  Tensor const lse = torch::stable::contiguous(softmax_lse);
  flash::BwdParams params{};
  fill_common(params, pb, qt, kt, vt, softmax_scale, softcap,
              make_window(pb, causal, window_size_left, window_size_right, top_left));
  params.sink_ptr = sink_ptr;
  Tensor const tile_counter =
      fill_bwd(params, {dot, ot, lse, dq, dk, dv, lse_log2, dsum, dq_accum, dq_semaphore, dsink_rows}, q,
               head_dim_rounded, seqlen_q_padded, deterministic);

  bwd(params, current_stream(device));
  if (sink_ptr) { dsink = torch::stable::sum(dsink_rows, std::vector<int64_t>{0, 2}); }
  return {dq, dk, dv, dsink};
}

// Gradients of varlen_fwd: the packed dq, dk, dv (zero on rows no sequence uses when seqused is
// given), with the per-row workspaces padded per sequence (BwdParams).
std::tuple<Tensor, Tensor, Tensor, Tensor> mha_varlen_bwd(
    Tensor const& dout, Tensor const& q, Tensor const& k, Tensor const& v, Tensor const& out,
    Tensor const& softmax_lse, Tensor const& cu_seqlens_q, Tensor const& cu_seqlens_k,
    std::optional<Tensor> const& seqused_q, std::optional<Tensor> const& seqused_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, double softmax_scale, bool causal, int64_t window_size_left, int64_t window_size_right,
    bool top_left, bool deterministic, double softcap, std::optional<Tensor> const& sink) {
  auto const [vl, q4, k4, v4, pb] =
      check_varlen_call(/*value_head_dim=*/true, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
                        max_seqlen_q, max_seqlen_k);
  check_scale(softmax_scale, softcap);
  float const* const sink_ptr = sink_pointer(sink, q, pb.heads_q);
  torch::stable::accelerator::DeviceGuard device_guard(q.get_device());
  std::vector<int64_t> const o_sizes{vl.total_q, pb.heads_q, pb.head_dim_v};
  FLASH_CHECK(sizes_of(dout) == o_sizes && sizes_of(out) == o_sizes,
              "flash_attn_hopper: dout and out must be (total_q, nheads, headdim_v) as varlen_fwd returns out");
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
  Tensor dsink = empty_like_dev(q, {sink_ptr ? pb.heads_q : 0}, kFloat);
  if (vl.batch == 0 || pb.heads_q == 0 || vl.total_q == 0 || vl.total_k == 0 || vl.max_seqlen_q == 0 ||
      vl.max_seqlen_k == 0) {  // no query sees any key (out = 0: D = 0)
    torch::stable::zero_(dq);
    torch::stable::zero_(dk);
    torch::stable::zero_(dv);
    torch::stable::zero_(dsink);
    return {dq, dk, dv, dsink};
  }

  // Each sequence's rows at a kBwdPadM-aligned offset of its own (seqlen.h, offset_q_padded).
  int64_t const rows_padded =
      (vl.total_q + vl.batch * flash::kBwdPadM + flash::kBwdPadM - 1) / flash::kBwdPadM * flash::kBwdPadM;
  ScalarType const f32 = kFloat;
  Tensor lse_log2 = empty_like_dev(q, {pb.heads_q, rows_padded}, f32);
  Tensor dsum = empty_like_dev(q, {pb.heads_q, rows_padded}, f32);
  Tensor dq_accum = empty_like_dev(q, {pb.heads_q, rows_padded, pb.head_dim_rounded}, f32);  // zeroed by the preprocess
  Tensor dq_semaphore;
  if (deterministic) {
    dq_semaphore = zeros_like_dev(q, {pb.heads_q, rows_padded / flash::kBwdMinBlockM}, kInt);
  }
  Tensor dsink_rows;  // zeroed: the rows between the sequences' padded ones are not written
  if (sink_ptr) { dsink_rows = zeros_like_dev(q, {pb.heads_q, rows_padded}, f32); }

  Tensor const qt = tma_ready(q4), kt = tma_ready(k4), vt = tma_ready(v4);
  Tensor const dot = tma_ready(unsqueeze0(dout));
  Tensor const ot = tma_ready(unsqueeze0(out));
  Tensor const lse = torch::stable::contiguous(softmax_lse);
  Tensor const dq4 = unsqueeze0(dq);
  flash::BwdParams params{};
  fill_common(params, pb, qt, kt, vt, softmax_scale, softcap,
              make_window(pb, causal, window_size_left, window_size_right, top_left));
  set_varlen(params, vl, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, top_left);
  params.sink_ptr = sink_ptr;
  Tensor const tile_counter =
      fill_bwd(params, {dot, ot, lse, dq4, dk, dv, lse_log2, dsum, dq_accum, dq_semaphore, dsink_rows}, q,
               pb.head_dim_rounded, rows_padded, deterministic);

  bwd(params, current_stream(pb.device));
  if (sink_ptr) { dsink = torch::stable::sum(dsink_rows, std::vector<int64_t>{1}); }
  return {dq, dk, dv, dsink};
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
  // corner (torch SDPA's is_causal) instead of the bottom-right one (FlashAttention's); softcap: 0 =
  // off, else scores softcap * tanh(softmax_scale * q.k / softcap) (FlashAttention-3's); sink: None, or
  // a float32 (nheads,) logit per head in every row's softmax denominator (the LSE includes it);
  // num_splits: split-KV (1 none, 0 choose, n at most n splits; ignored with softcap).
  m.def("fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, int window_size_left=-1, "
        "int window_size_right=-1, bool top_left=False, float softcap=0.0, Tensor? sink=None, int num_splits=1) "
        "-> (Tensor out, Tensor softmax_lse)");
  // q (total_q, nheads, d), k and v (total_k, nheads_kv, d), sequence b at rows cu_seqlens[b]; the
  // LSE is (nheads, total_q). pack_gqa = g > 1: q's rows are PackGQA's (t * g + j: query head
  // h * g + j of token t) and out / the LSE come back per query head (check_pack_gqa).
  m.def("varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? seqused_q, "
        "Tensor? seqused_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool causal, "
        "int window_size_left=-1, int window_size_right=-1, bool top_left=False, float softcap=0.0, "
        "Tensor? sink=None, int num_splits=1, int pack_gqa=1) -> (Tensor out, Tensor softmax_lse)");
  // FA3's qv (MLA decode): scores softmax_scale * (q.k + qv.v) with qv (batch, seqlen_q, nheads, dv)
  // [varlen: (total_q, nheads, dv)], q/k head dim <= 64, dv in (64, 512]; softcap, sink and num_splits
  // as fwd's; no backward (as FA3).
  m.def("fwd_qv(Tensor q, Tensor k, Tensor v, Tensor qv, float softmax_scale, bool causal, "
        "int window_size_left=-1, int window_size_right=-1, bool top_left=False, float softcap=0.0, "
        "Tensor? sink=None, int num_splits=1) -> (Tensor out, Tensor softmax_lse)");
  m.def("varlen_fwd_qv(Tensor q, Tensor k, Tensor v, Tensor qv, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
        "Tensor? seqused_q, Tensor? seqused_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, "
        "bool causal, int window_size_left=-1, int window_size_right=-1, bool top_left=False, float softcap=0.0, "
        "Tensor? sink=None, int num_splits=1) -> (Tensor out, Tensor softmax_lse)");
  // q (total_q, nheads, d); k_cache and v_cache (num_pages, page_size, nheads_kv, d) read through
  // page_table (batch, max_pages): sequence b's keys are seqused_k[b] positions from cu_seqlens_k[b]
  // of its pages. The LSE is (nheads, total_q). No backward.
  m.def("paged_fwd(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, Tensor cu_seqlens_q, "
        "Tensor cu_seqlens_k, Tensor seqused_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, "
        "bool causal, int window_size_left=-1, int window_size_right=-1, bool top_left=False, float softcap=0.0, "
        "Tensor? sink=None, int num_splits=1, int pack_gqa=1) -> (Tensor out, Tensor softmax_lse)");
  // paged_fwd with FA3's qv (as fwd_qv): v_cache (num_pages, page_size, nheads_kv, dv), qv (total_q, nheads, dv).
  m.def("paged_fwd_qv(Tensor q, Tensor k_cache, Tensor v_cache, Tensor qv, Tensor page_table, Tensor cu_seqlens_q, "
        "Tensor cu_seqlens_k, Tensor seqused_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, "
        "bool causal, int window_size_left=-1, int window_size_right=-1, bool top_left=False, float softcap=0.0, "
        "Tensor? sink=None, int num_splits=1) -> (Tensor out, Tensor softmax_lse)");
  // FP8 (e4m3) q, k, v with float32 descales (batch, nheads_kv) (None = 1), out bf16; forward only.
  m.def("fwd_fp8(Tensor q, Tensor k, Tensor v, Tensor? q_descale, Tensor? k_descale, Tensor? v_descale, "
        "float softmax_scale, bool causal, int window_size_left=-1, int window_size_right=-1, bool top_left=False, "
        "float softcap=0.0, Tensor? sink=None) -> (Tensor out, Tensor softmax_lse)");
  m.def("varlen_fwd_fp8(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? seqused_q, "
        "Tensor? seqused_k, int max_seqlen_q, int max_seqlen_k, Tensor? q_descale, Tensor? k_descale, "
        "Tensor? v_descale, float softmax_scale, bool causal, int window_size_left=-1, int window_size_right=-1, "
        "bool top_left=False, float softcap=0.0, Tensor? sink=None, int num_splits=1, int pack_gqa=1) "
        "-> (Tensor out, Tensor softmax_lse)");
  m.def("paged_fwd_fp8(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, Tensor cu_seqlens_q, "
        "Tensor cu_seqlens_k, Tensor seqused_k, int max_seqlen_q, int max_seqlen_k, Tensor? q_descale, "
        "Tensor? k_descale, Tensor? v_descale, float softmax_scale, bool causal, int window_size_left=-1, "
        "int window_size_right=-1, bool top_left=False, float softcap=0.0, Tensor? sink=None, int num_splits=1, "
        "int pack_gqa=1) -> (Tensor out, Tensor softmax_lse)");
  // The split-KV combine (flash_attn_combine): out_partial (num_splits, batch, seqlen, nheads, d) and
  // lse_partial (num_splits, batch, seqlen, nheads), float32 -> out (batch, seqlen, nheads, d), lse
  // (batch, seqlen, nheads).
  m.def("fwd_combine(Tensor out_partial, Tensor lse_partial, ScalarType? out_dtype=None) "
        "-> (Tensor out, Tensor softmax_lse)");
#if FLASH_ATTN_HOPPER_BUILD_BWD
  // sink: the forward's (its out and LSE hold it); dsink: the sink's float32 (nheads,) gradient,
  // an empty tensor without a sink.
  m.def("bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, float softmax_scale, "
        "bool causal, int window_size_left=-1, int window_size_right=-1, bool top_left=False, "
        "bool deterministic=False, float softcap=0.0, Tensor? sink=None) "
        "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dsink)");
  m.def("varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
        "Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? seqused_q, Tensor? seqused_k, int max_seqlen_q, "
        "int max_seqlen_k, float softmax_scale, bool causal, int window_size_left=-1, int window_size_right=-1, "
        "bool top_left=False, bool deterministic=False, float softcap=0.0, Tensor? sink=None) "
        "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dsink)");
#endif
}

FLASH_ATTN_HOPPER_LIBRARY_IMPL(FLASH_ATTN_HOPPER_OP_NAMESPACE, CUDA, m) {
  m.impl("fwd", TORCH_BOX(&mha_fwd));
  m.impl("varlen_fwd", TORCH_BOX(&mha_varlen_fwd));
  m.impl("fwd_qv", TORCH_BOX(&mha_fwd_qv));
  m.impl("varlen_fwd_qv", TORCH_BOX(&mha_varlen_fwd_qv));
  m.impl("fwd_combine", TORCH_BOX(&mha_combine));
  m.impl("paged_fwd", TORCH_BOX(&mha_paged_fwd));
  m.impl("paged_fwd_qv", TORCH_BOX(&mha_paged_fwd_qv));
  m.impl("fwd_fp8", TORCH_BOX(&mha_fwd_fp8));
  m.impl("varlen_fwd_fp8", TORCH_BOX(&mha_varlen_fwd_fp8));
  m.impl("paged_fwd_fp8", TORCH_BOX(&mha_paged_fwd_fp8));
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
