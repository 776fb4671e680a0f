"""FlashAttention-3's ``qv`` argument: MLA decode's extra query.

DeepSeek-style models decode with the latent KV cache as both the "rope" keys ``k`` (head dim 64)
and the values ``v`` (head dim 512), and two queries: ``q`` against ``k`` and ``qv`` against ``v``.
The scores are ``softmax_scale * (q kᵀ + qv vᵀ)`` and the output ``softmax(scores) v``, with
FA3's default scale ``(headdim + headdim_v) ** -0.5``. The qv kernels (``FwdPolicy::kWideV``,
``csrc/kernel/fwd/mainloop_qv.h``) take q / k head dims up to 64 (multiples of 8) and v head dims
in (64, 512] (multiples of 8); forward only, as FA3 (the forward runs on inputs that require grad,
the backward raises); softcap, windows, a learnable sink and split-KV (``num_splits``) as everywhere
else, PackGQA as rows where exact.

``flash_attn_func`` and ``flash_attn_varlen_func`` hand calls with ``qv`` to :func:`dense`,
:func:`varlen` and (with a page table: vLLM's MLA decode over one latent cache viewed as v and k)
:func:`paged`; everything about q and k (shapes, dtypes, GQA, strides, the compiled set, the
device) is judged by the usual checks on q, k and the first headdim columns of v, the rest here.
"""

from __future__ import annotations

import torch

from . import manifest, offsets, ops, packgqa, sinks, support, support_varlen

MAX_HEAD_DIM = 64  # q / k
MAX_HEAD_DIM_V = 512


def _refuse(message: str, error=ValueError):
    raise error(f"flash_attn_hopper: {message}")


def check(q, k, v, qv, *, varlen: bool) -> None:
    """Clear errors, before any launch, for what the qv kernels do not take."""
    dims = 3 if varlen else 4
    layout = "(total_q, nheads, headdim_v)" if varlen else "(batch, seqlen_q, nheads, headdim_v)"
    for name, t in (("q", q), ("k", k), ("v", v), ("qv", qv)):
        if not isinstance(t, torch.Tensor):
            _refuse(f"{name} must be a torch.Tensor, got {type(t).__name__}", TypeError)
        if t.dim() != dims:
            _refuse(f"with qv, {name} must be a {dims}-D tensor, got shape {tuple(t.shape)}")
    d, dv = q.shape[-1], v.shape[-1]
    if k.shape[-1] != d or d > MAX_HEAD_DIM or d % manifest.HEAD_DIM_MULTIPLE:
        _refuse(f"qv needs q and k of one head dim, a multiple of {manifest.HEAD_DIM_MULTIPLE} up to {MAX_HEAD_DIM} "
                f"(MLA decode's 64); got {d} and {k.shape[-1]}")
    if not (MAX_HEAD_DIM < dv <= MAX_HEAD_DIM_V) or dv % manifest.HEAD_DIM_MULTIPLE:
        _refuse(f"qv needs v's head dim in ({MAX_HEAD_DIM}, {MAX_HEAD_DIM_V}], a multiple of "
                f"{manifest.HEAD_DIM_MULTIPLE} (MLA decode's 512); got {dv}")
    if tuple(qv.shape) != tuple(q.shape[:-1]) + (dv,):
        _refuse(f"qv must be {layout} = {tuple(q.shape[:-1]) + (dv,)} (q's shape with v's head dim), "
                f"got {tuple(qv.shape)}")
    if qv.dtype != q.dtype or qv.device != q.device:
        _refuse(f"qv must have q's dtype and device ({q.dtype} on {q.device}), got {qv.dtype} on {qv.device}")
    if qv.stride(-1) != 1:
        _refuse("the last dimension of qv must be contiguous")


def _check_compiled(q) -> None:
    """The qv kernels (their own files, FLASH_ATTN_HOPPER_HDIMS including 64) in the recorded build."""
    name = manifest.dtype_name(str(q.dtype).removeprefix("torch."))
    refusal = support.not_compiled_refusal("qv", 64, name) if name is not None else None
    if refusal is not None:
        raise refusal.exception()


def _scale(softmax_scale, d: int, dv: int) -> float:
    return (d + dv) ** (-0.5) if softmax_scale is None else float(softmax_scale)


def _packs(pack_gqa, q, k, seqlen_q: int, answer, window, learnable_sink) -> bool:
    """PackGQA as rows (packgqa.py) where exact and without a sink (one logit per query head): MLA
    decode's query heads of the one KV head then run as rows of one tile, the cache read once."""
    group = q.shape[-2] // k.shape[-2]
    return learnable_sink is None and packgqa.packs(pack_gqa, group, seqlen_q, answer.causal, window)


def dense(q, k, v, qv, softmax_scale, causal, window_size, softcap, learnable_sink, return_attn_probs,
          pack_gqa=None, num_splits=1):
    """flash_attn_func with qv (attention_chunk: as varlen segments, interface._chunked)."""
    check(q, k, v, qv, varlen=False)
    _check_compiled(q)
    scale = _scale(softmax_scale, q.shape[-1], v.shape[-1])
    answer = support.check(q, k, v[..., : q.shape[-1]], causal=causal, window_size=window_size, softmax_scale=scale,
                           softcap=softcap)
    if isinstance(answer, support.Refusal):
        raise answer.exception()
    left, right = answer.window if answer.window is not None else (-1, 0 if answer.causal else -1)
    if _packs(pack_gqa, q, k, q.shape[1], answer, (left, right), learnable_sink):
        batch, seqlen_q, heads, _ = q.shape
        heads_k, group, dv = k.shape[2], heads // k.shape[2], v.shape[-1]

        def rows(t):
            return packgqa.pack_rows(t.reshape(batch * seqlen_q, heads, t.shape[-1]), heads_k).view(
                batch, seqlen_q * group, heads_k, t.shape[-1])

        out, lse = ops.op_of_build("fwd_qv", "qv")(rows(q), k, v, rows(qv), scale, False, -1, -1,
                                                   softcap=float(softcap),
                                 num_splits=num_splits)
        out = packgqa.unpack_rows(out.reshape(batch * seqlen_q * group, heads_k, dv), group)
        out = out.view(batch, seqlen_q, heads, dv)
        return (out, packgqa.unpack_lse(lse, group)) if return_attn_probs else out
    out, lse = ops.op_of_build("fwd_qv", "qv")(q, k, v, qv, scale, answer.causal, left, right,
                                               softcap=float(softcap),
                                               sink=sinks.kernel_sink(learnable_sink, q.shape[2], q),
                                               num_splits=num_splits)
    return (out, lse) if return_attn_probs else out


def varlen(q, k, v, qv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
           softmax_scale, causal, window_size, softcap, learnable_sink, return_attn_probs, pack_gqa=None,
           num_splits=1):
    """flash_attn_varlen_func with qv (no page table; attention_chunk: chunked.varlen's segments)."""
    check(q, k, v, qv, varlen=True)
    _check_compiled(q)
    scale = _scale(softmax_scale, q.shape[-1], v.shape[-1])
    answer = support_varlen.check_varlen(
        q, k, v[..., : q.shape[-1]], cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
        causal=causal, window_size=window_size, softmax_scale=scale, softcap=softcap)
    if isinstance(answer, support.Refusal):
        raise answer.exception()
    left, right = answer.window if answer.window is not None else (-1, 0 if answer.causal else -1)
    if _packs(pack_gqa, q, k, answer.max_seqlen_q, answer, (left, right), learnable_sink):
        heads_k, group = k.shape[1], q.shape[1] // k.shape[1]
        out, lse = ops.op_of_build("varlen_fwd_qv", "qv")(
            packgqa.pack_rows(q, heads_k), k, v, packgqa.pack_rows(qv, heads_k), offsets.scaled(cu_seqlens_q, group),
            cu_seqlens_k, None if seqused_q is None else seqused_q * group, seqused_k, answer.max_seqlen_q * group,
            answer.max_seqlen_k, scale, False, -1, -1, softcap=float(softcap), num_splits=num_splits)
        out = packgqa.unpack_rows(out, group)
        return (out, packgqa.unpack_lse(lse, group)) if return_attn_probs else out
    out, lse = ops.op_of_build("varlen_fwd_qv", "qv")(
        q, k, v, qv, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, answer.max_seqlen_q, answer.max_seqlen_k,
        scale, answer.causal, left, right, softcap=float(softcap),
        sink=sinks.kernel_sink(learnable_sink, q.shape[1], q),
        num_splits=num_splits)
    return (out, lse) if return_attn_probs else out


def paged(q, k_cache, v_cache, qv, page_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
          softmax_scale, causal, window_size, softcap, learnable_sink, return_attn_probs, pack_gqa=None,
          num_splits=1):
    """flash_attn_varlen_func / flash_attn_with_kvcache with qv over a paged cache (paged.py's layout;
    v_cache of v's head dim): vLLM's MLA decode call."""
    from . import paged as paged_cache  # paged imports ops only

    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            _refuse(f"with a page table, {name} must be a 4-D (num_pages, page_size, nheads_k, headdim) tensor")
    check(q, k_cache[0], v_cache[0], qv, varlen=True)
    refusal = paged_cache.cache_refusal(k_cache, v_cache, page_table, q, max_width=MAX_HEAD_DIM_V)
    if refusal is not None:
        raise refusal.exception()
    if seqused_k is None:
        _refuse("with a page table, seqused_k (int32 (batch,): each sequence's number of keys) is required")
    _check_compiled(q)
    if cu_seqlens_k is None:
        cu_seqlens_k = offsets.constant("full", cu_seqlens_q.numel(), 0, q.device)
    scale = _scale(softmax_scale, q.shape[-1], v_cache.shape[-1])
    answer = support_varlen.check_varlen(
        q, k_cache[0], v_cache[0][..., : q.shape[-1]], cu_seqlens_q, cu_seqlens_k, None, seqused_k, max_seqlen_q,
        max_seqlen_k, causal=causal, window_size=window_size, softmax_scale=scale, softcap=softcap,
        names=("q", "k_cache", "v_cache"))
    if isinstance(answer, support.Refusal):
        raise answer.exception()
    if page_table.shape[0] != answer.batch:
        _refuse(f"page_table must have one row per sequence ({answer.batch}), got {page_table.shape[0]}")
    capacity = page_table.shape[1] * k_cache.shape[1]
    if capacity + q.shape[0] > manifest.MAX_SEQLEN_SUM:
        _refuse(f"max_pages x page_size + total_q = {capacity + q.shape[0]} is over the kernels' limit of "
                f"{manifest.MAX_SEQLEN_SUM}")
    max_k = min(answer.max_seqlen_k, capacity)
    left, right = answer.window if answer.window is not None else (-1, 0 if answer.causal else -1)
    op = ops.op_of_build("paged_fwd_qv", "qv")
    if _packs(pack_gqa, q, k_cache, answer.max_seqlen_q, answer, (left, right), learnable_sink):
        heads_k, group = k_cache.shape[2], q.shape[1] // k_cache.shape[2]
        out, lse = op(packgqa.pack_rows(q, heads_k), k_cache, v_cache, packgqa.pack_rows(qv, heads_k), page_table,
                      offsets.scaled(cu_seqlens_q, group), cu_seqlens_k, seqused_k, answer.max_seqlen_q * group,
                      max_k, scale, False, -1, -1, softcap=float(softcap), num_splits=num_splits)
        out = packgqa.unpack_rows(out, group)
        return (out, packgqa.unpack_lse(lse, group)) if return_attn_probs else out
    out, lse = op(q, k_cache, v_cache, qv, page_table, cu_seqlens_q, cu_seqlens_k, seqused_k, answer.max_seqlen_q,
                  max_k, scale, answer.causal, left, right, softcap=float(softcap),
                  sink=sinks.kernel_sink(learnable_sink, q.shape[1], q), num_splits=num_splits)
    return (out, lse) if return_attn_probs else out


def _paged_fwd_qv_fake(q, k_cache, v_cache, qv, page_table, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                       max_seqlen_k, softmax_scale, causal, window_size_left=-1, window_size_right=-1, top_left=False,
                       softcap=0.0, sink=None, num_splits=1):
    total_q, heads, _ = q.shape
    return q.new_empty((total_q, heads, v_cache.shape[-1])), q.new_empty((heads, total_q), dtype=torch.float32)


def _fwd_qv_fake(q, k, v, qv, softmax_scale, causal, window_size_left=-1, window_size_right=-1, top_left=False,
                 softcap=0.0, sink=None, num_splits=1):
    batch, seqlen_q, heads, _ = q.shape
    return q.new_empty((batch, seqlen_q, heads, v.shape[-1])), q.new_empty((batch, heads, seqlen_q),
                                                                           dtype=torch.float32)


def _varlen_fwd_qv_fake(q, k, v, qv, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                        softmax_scale, causal, window_size_left=-1, window_size_right=-1, top_left=False, softcap=0.0,
                        sink=None, num_splits=1):
    total_q, heads, _ = q.shape
    return q.new_empty((total_q, heads, v.shape[-1])), q.new_empty((heads, total_q), dtype=torch.float32)


if ops._PY_LIBRARY is not None:  # fake kernels; the backward raises
    ops.register_forward_only(
        ops._PY_LIBRARY,
        {"fwd_qv": _fwd_qv_fake, "varlen_fwd_qv": _varlen_fwd_qv_fake, "paged_fwd_qv": _paged_fwd_qv_fake},
        "flash_attn_hopper: qv has no backward (as FlashAttention-3); the forward ran, gradients through it "
        "cannot be computed: run it under torch.no_grad() / torch.inference_mode()")
