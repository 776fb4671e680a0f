"""Paged KV caches: attention of packed queries over caches read in place through a page table.

The caches are ``(num_pages, page_size, nheads_k, d)`` (any page size >= 1, any strides in 16-byte
units, so both the NHD layout and a head-major allocation viewed as NHD work); ``page_table`` is
int32 ``(batch, max_pages)``: sequence b's key at logical position p is row ``p % page_size`` of
page ``page_table[b, p // page_size]``. Its keys are ``seqused_k[b]`` positions from
``cu_seqlens_k[b]`` (default 0). The kernels gather each key block's rows page by page (cp.async)
and clamp page numbers to the cache and lengths to the table's capacity; nothing here reads index
contents on the host, so a decode step can be captured in a CUDA graph.

Used by ``flash_attn_varlen_func(..., page_table=...)`` and ``flash_attn_with_kvcache(...,
page_table=...)`` (kvcache.py appends new tokens to the pages). No backward, as in FlashAttention-3.
"""

from __future__ import annotations

import torch

from . import manifest, offsets, ops, packgqa, sinks, support, support_varlen
from .support import Refusal

#: The paged_fwd op's schema, as csrc/flash_api.cpp defines it (tests/test_paged_cpu.py compares them).
PAGED_FWD_SCHEMA = (
    "paged_fwd(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, Tensor cu_seqlens_q, "
    "Tensor cu_seqlens_k, Tensor seqused_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, "
    "bool causal, int window_size_left=-1, int window_size_right=-1, bool top_left=False, float softcap=0.0, "
    "Tensor? sink=None, int num_splits=1, int pack_gqa=1) -> (Tensor out, Tensor softmax_lse)"
)
#: The argument names of the paged_fwd schema, checked against the compiled op before each call.
PAGED_FWD_SCHEMA_ARGS = (
    "q", "k_cache", "v_cache", "page_table", "cu_seqlens_q", "cu_seqlens_k", "seqused_k", "max_seqlen_q",
    "max_seqlen_k", "softmax_scale", "causal", "window_size_left", "window_size_right", "top_left", "softcap",
    "sink", "num_splits", "pack_gqa",
)


def has_paged_op() -> bool:
    """Whether ``torch.ops.flash_attn_hopper.paged_fwd`` exists (builds of this version define it)."""
    return ops.extension_loaded() and hasattr(torch.ops.flash_attn_hopper, "paged_fwd")


def paged_fwd_op():
    if not has_paged_op():
        raise RuntimeError(
            "flash_attn_hopper: this build of the extension has no paged-KV op (paged_fwd); rebuild it from this "
            f"version: {ops.build_hint()}"
        )
    return ops._checked_op("paged_fwd", PAGED_FWD_SCHEMA_ARGS)


def _paged_fwd_fake(q, k_cache, v_cache, page_table, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                    max_seqlen_k, softmax_scale, causal, window_size_left=-1, window_size_right=-1, top_left=False,
                    softcap=0.0, sink=None, num_splits=1, pack_gqa=1):
    # out like q's head dim (v is padded to it), softmax_lse float32; per query head with pack_gqa.
    out_shape, lse_shape = ops.packed_output_shapes(q, q.shape[-1], pack_gqa)
    return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32)


def register_paged_fake(lib=None) -> None:
    torch.library.register_fake("flash_attn_hopper::paged_fwd", _paged_fwd_fake, lib=lib)


if has_paged_op():
    register_paged_fake()


def _zeros(n: int, device) -> torch.Tensor:
    return offsets.constant("full", n, 0, device)


def cache_refusal(k_cache, v_cache, page_table, q, max_width: int = manifest.MAX_HEAD_DIM) -> Refusal | None:
    """Why (k_cache, v_cache, page_table) is no paged cache the kernels read in place, or None
    (``max_width``: the widest head dim taken; the qv kernels' v goes to 512)."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("page_table", page_table)):
        if not isinstance(t, torch.Tensor):
            return Refusal(f"{name} must be a torch.Tensor, got {type(t).__name__}", error=TypeError)
    if k_cache.dim() != 4 or v_cache.dim() != 4 or v_cache.shape[:3] != k_cache.shape[:3]:
        return Refusal(
            f"with a page table, k_cache and v_cache must be (num_pages, page_size, nheads_k, headdim) and (..., "
            f"headdim_v), got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}",
        )
    if k_cache.shape[0] < 1 or k_cache.shape[1] < 1:
        return Refusal(f"the paged cache needs at least one page of at least one row, got {tuple(k_cache.shape)}")
    if page_table.dtype != torch.int32 or page_table.dim() != 2 or page_table.shape[1] < 1 \
            or (page_table.shape[0] > 1 and page_table.stride(1) != 1) or page_table.device != q.device:
        return Refusal(f"page_table must be an int32 (batch, max_pages) tensor with max_pages >= 1 and contiguous "
                       f"rows on {q.device}, got {page_table.dtype} {tuple(page_table.shape)} on {page_table.device}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        elem = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any(s * elem % 16 for s in t.stride()[:3]):
            return Refusal(
                f"{name} is read in place with 16-byte copies: its last dimension must be contiguous, its data "
                f"16-byte aligned and its strides multiples of 16 bytes (got strides {t.stride()})",
                "allocate the cache as (num_pages, page_size, nheads_k, headdim), or as (num_pages, nheads_k, "
                "page_size, headdim) viewed with .transpose(1, 2)",
            )
    if q.dim() == 3 and k_cache.shape[-1] != q.shape[-1]:
        return Refusal(f"q's head dim ({q.shape[-1]}) and the cache's ({k_cache.shape[-1]}) must agree with a "
                       "page table")
    widths = (k_cache.shape[-1], v_cache.shape[-1])
    if any(w % manifest.HEAD_DIM_MULTIPLE for w in widths) or max(widths) > max_width:
        return Refusal(f"with a page table the head dims must be multiples of {manifest.HEAD_DIM_MULTIPLE} up to "
                       f"{max_width} (the cache is read in place, not padded), got k {widths[0]} and "
                       f"v {widths[1]}")
    return None


def varlen_paged(q, k_cache, v_cache, page_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                 seqused_k, softmax_scale, causal, window_size, softcap, num_splits, pack_gqa, return_lse,
                 learnable_sink=None):
    """flash_attn_varlen_func's paged path: q (total_q, nheads, d) with cu_seqlens_q; the cache and
    page table as in the module docstring; seqused_k int32 (batch,) required; cu_seqlens_k None
    (keys from position 0) or int32 (batch + 1,) first positions. Returns out, or (out, lse)."""
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    refusal = cache_refusal(k_cache, v_cache, page_table, q)
    if refusal is not None:
        raise refusal.exception()
    if seqused_k is None:
        raise ValueError("with a page table, seqused_k (int32 (batch,): each sequence's number of keys) is required")
    if not isinstance(cu_seqlens_q, torch.Tensor):
        raise TypeError("cu_seqlens_q must be an int32 tensor of batch + 1 offsets")
    batch = cu_seqlens_q.numel() - 1
    if cu_seqlens_k is None:
        cu_seqlens_k = _zeros(batch + 1, q.device)
    dv = v_cache.shape[-1]
    if dv != k_cache.shape[-1]:
        # FA3's dv != d: the paged kernels take one head dim, so q and both caches run on copies
        # zero-padded to the wider one (the whole cache, per call: correct, not fast; zero columns
        # change neither q kᵀ nor out's first dv columns), with q's own default scale.
        if softmax_scale is None:
            softmax_scale = q.shape[-1] ** (-0.5)
        width = max(dv, k_cache.shape[-1])
        widen = lambda t: torch.nn.functional.pad(t, (0, width - t.shape[-1]))  # noqa: E731
        q, k_cache, v_cache = widen(q), widen(k_cache), widen(v_cache)
    # The varlen checks, with one page as the keys (dtypes, heads, head dims, sequences, window, softcap).
    answer = support_varlen.check_varlen(
        q, k_cache[0], v_cache[0], cu_seqlens_q, cu_seqlens_k, None, seqused_k, max_seqlen_q, max_seqlen_k,
        causal=causal, window_size=window_size,
        softmax_scale=None if softmax_scale is None else float(softmax_scale), softcap=softcap,
        names=("q", "k_cache", "v_cache"),
    )
    if isinstance(answer, Refusal):
        raise answer.exception()
    if page_table.shape[0] != answer.batch:
        raise ValueError(f"page_table must have one row per sequence ({answer.batch}), got {page_table.shape[0]}")
    capacity = page_table.shape[1] * k_cache.shape[1]
    if capacity + q.shape[0] > manifest.MAX_SEQLEN_SUM:
        raise ValueError(f"max_pages x page_size + total_q = {capacity + q.shape[0]} is over the kernels' limit of "
                         f"{manifest.MAX_SEQLEN_SUM}")
    scale = answer.head_dim ** (-0.5) if answer.softmax_scale is None else answer.softmax_scale
    left, right = answer.window if answer.window is not None else (-1, 0 if answer.causal else -1)

    max_k = min(answer.max_seqlen_k, capacity)
    kwargs = ops.optional_args(softcap)
    if learnable_sink is not None:
        sinks.check_sink(learnable_sink, q.shape[1], q)
        kwargs["sink"] = learnable_sink.float().contiguous()
    fwd = paged_fwd_op()
    out, lse = packgqa.call_packed(
        lambda rows, cu_q, max_q, causal, left, right, **kw: fwd(
            rows, k_cache, v_cache, page_table, cu_q, cu_seqlens_k, seqused_k, max_q, max_k, scale, causal, left,
            right, **kwargs, **kw),
        q, k_cache.shape[2], cu_seqlens_q, answer.max_seqlen_q, answer.causal, left, right, softcap, learnable_sink,
        None, num_splits, pack_gqa, return_lse)
    out = out[..., :dv] if out.shape[-1] != dv else out
    return (out, lse) if return_lse else out

