"""FP8 (e4m3) attention: FlashAttention-3's FP8 forward.

q, k and v in ``torch.float8_e4m3fn`` with optional float32 descales ``(batch, nheads_kv)`` (None = 1,
FA3's per-(batch, KV head) scales, e.g. a per-layer scale expanded): the scores are
``softmax_scale * q_descale * k_descale * q kᵀ``, the output ``v_descale * softmax(scores) v`` in
bfloat16 (FA3's convention) and the LSE float32. The kernels (``FwdPolicy::kFp8``,
``csrc/kernel/fwd/fp8.h``) quantize P to e4m3 with FA3's offset (P in [0, 256]) and transpose V on
chip; head dims that are multiples of 16 up to 256 run on the hdim 64 / 128 / 256 kernels.

``flash_attn_func`` and ``flash_attn_varlen_func`` hand calls with FP8 inputs to :func:`dense` and
:func:`varlen`: causal, windows, GQA, softcap, a learnable sink and ``attention_chunk`` (on the
varlen kernels over the chunk segments, each taking its sequence's descales) as everywhere else.
Varlen calls and KV caches (contiguous or paged: ``page_table``, paged.py's layout, read in place by
kernels whose producer gathers the rows and transposes V) split the keys (``num_splits``, 0 = choose)
and pack the query heads of a KV head into rows (``pack_gqa``, packgqa.py) as the 16-bit ones do;
dense calls run unsplit and unpacked (the same result). Forward only, as FA3's: the
forward runs on inputs that require grad, the backward raises. Refused with a clear error before any
launch: inputs mixing FP8 with other dtypes, descales of the wrong shape / dtype / device, qv and dv != d.
"""

from __future__ import annotations

import torch

from . import _build_info, manifest, offsets, ops, packgqa, sinks, support
from . import paged as paged_cache

DTYPE = torch.float8_e4m3fn
HEAD_DIMS = (64, 128, 256)  # the FP8 kernels' (manifest direction "fp8")
HEAD_DIM_MULTIPLE = 16  # 16-byte rows for TMA


def _refuse(message: str, error=ValueError):
    raise error(f"flash_attn_hopper: {message}")


def is_fp8(*tensors) -> bool:
    """Whether any of the tensors is FP8 (such a call is this module's, or refused here)."""
    return any(isinstance(t, torch.Tensor) and t.dtype == DTYPE for t in tensors)


def kernel_head_dim(head_dim: int) -> int | None:
    """The FP8 kernels' head dim for q's, or None."""
    if head_dim <= 0 or head_dim % HEAD_DIM_MULTIPLE:
        return None
    return next((d for d in HEAD_DIMS if head_dim <= d), None)


def check(q, k, v, descales, *, varlen: bool, batch: int | None = None, qv=None, paged: bool = False) -> None:
    """Clear errors, before any launch, for what the FP8 kernels do not take (paged: k and v are
    (num_pages, page_size, nheads_kv, d) caches)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            _refuse(f"{name} must be a torch.Tensor, got {type(t).__name__}", TypeError)
        if t.dtype != DTYPE:
            _refuse(f"FP8 attention needs q, k and v all in {DTYPE}; got q {q.dtype}, k {k.dtype}, v {v.dtype} "
                    "(cast all three, with their descales, or none)", TypeError)
        dims = 4 if not varlen or (paged and name != "q") else 3
        if t.dim() != dims:
            _refuse(f"{name} must be a {dims}-D tensor, got shape {tuple(t.shape)}")
    if qv is not None:
        _refuse("FP8 inputs with qv have no kernels in this version; pass bf16/fp16 inputs for it", RuntimeError)
    d, dv = q.shape[-1], v.shape[-1]
    if k.shape[-1] != d or dv != d:
        _refuse(f"FP8 attention needs one head dim for q, k and v; got {d}, {k.shape[-1]}, {dv}")
    if kernel_head_dim(d) is None:
        _refuse(f"FP8 attention takes head dims that are multiples of {HEAD_DIM_MULTIPLE} up to {HEAD_DIMS[-1]}, "
                f"got {d}")
    heads_kv = k.shape[-2]
    batch = q.shape[0] if batch is None else batch
    for name, t in descales.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or tuple(t.shape) != (batch, heads_kv):
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            _refuse(f"{name} must be a float32 tensor of shape (batch, nheads_kv) = ({batch}, {heads_kv}), got {got}")
        if t.device != q.device:
            _refuse(f"{name} must be on q's device ({q.device}), got {t.device}")


def _check_compiled(head_dim: int) -> None:
    """The FP8 kernels (FLASH_ATTN_HOPPER_DTYPES including fp8) in the recorded build."""
    compiled = _build_info.COMPILED
    hdim = kernel_head_dim(head_dim)
    if compiled is None or manifest.Instantiation("fp8", hdim, "fp8") in compiled:
        return
    _refuse(f"this build has no FP8 forward kernels for head dim {head_dim} (the hdim-{hdim} ones); rebuild with "
            f"{manifest.ENV_DTYPES} including fp8 and {manifest.ENV_HDIMS} including {hdim}: "
            f"{manifest.rebuild_hint([hdim], ['fp8'])}", RuntimeError)


def _descales(q_descale, k_descale, v_descale) -> dict:
    return {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}


def _scale_and_window(q, k, v, softmax_scale, causal, window_size, softcap, seqlen_q: int, seqlen_k: int):
    """The scale (default headdim^-0.5), softcap, FA3's window rules, then the compiled set and the
    device: (scale, causal, left, right), -1 = unbounded. Shapes, strides and sizes are the op's to
    check (before it allocates anything)."""
    refusal = support.scale_refusal(softmax_scale) or support.softcap_refusal(softcap, softmax_scale, q.shape[-1])
    if refusal is not None:
        raise refusal.exception()
    _check_compiled(q.shape[-1])
    refusal = support.device_refusal(q, k, v)
    if refusal is not None:
        raise refusal.exception()
    left, right = support.fa3_window(window_size, bool(causal), seqlen_q, seqlen_k)
    scale = q.shape[-1] ** (-0.5) if softmax_scale is None else float(softmax_scale)
    return scale, bool(causal) or (left, right) == (-1, 0), left, right


def _per_segment(descales: dict, segments: int) -> dict:
    """attention_chunk: each sequence's descales for each of its `segments` chunk segments."""
    return {n: None if t is None else t.repeat_interleave(segments, dim=0) for n, t in descales.items()}


def dense(q, k, v, q_descale, k_descale, v_descale, softmax_scale, causal, window_size, learnable_sink,
          return_attn_probs, softcap=0.0, attention_chunk=0, qv=None):
    """flash_attn_func with FP8 inputs."""
    descales = _descales(q_descale, k_descale, v_descale)
    check(q, k, v, descales, varlen=False, qv=qv)
    if attention_chunk:
        from .interface import _chunk_segments, _chunked  # interface imports this module

        support.check_attention_chunk(attention_chunk)
        batch = q.shape[0]
        segments = (len(_chunk_segments(batch, q.shape[1], k.shape[1], attention_chunk)[0]) - 1) // max(batch, 1)
        return _chunked(q, k, v, attention_chunk, return_attn_probs, softmax_scale=softmax_scale, causal=causal,
                        window_size=window_size, softcap=softcap, learnable_sink=learnable_sink,
                        **_per_segment(descales, segments))
    scale, causal, left, right = _scale_and_window(q, k, v, softmax_scale, causal, window_size, softcap, q.shape[1],
                                                   k.shape[1])
    op = ops.op_of_build("fwd_fp8", "FP8")
    out, lse = op(q, k, v, q_descale, k_descale, v_descale, scale, causal, left, right, softcap=float(softcap),
                  sink=sinks.kernel_sink(learnable_sink, q.shape[2], q))
    return (out, lse) if return_attn_probs else out


def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k, q_descale,
           k_descale, v_descale, softmax_scale, causal, window_size, learnable_sink, return_attn_probs,
           softcap=0.0, attention_chunk=0, qv=None, page_table=None, num_splits=1, pack_gqa=None):
    """flash_attn_varlen_func with FP8 inputs (descales per sequence and KV head)."""
    if page_table is not None:
        if attention_chunk:
            _refuse("flash_attn_varlen_func takes attention_chunk or page_table, not both: flash_attn_with_kvcache "
                    "runs chunked attention over a paged cache")
        if seqused_q is not None:
            _refuse("seqused_q is not taken with a page table: pass cu_seqlens_q of the used queries")
        return paged(q, k, v, page_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
                     q_descale, k_descale, v_descale, softmax_scale, causal, window_size, learnable_sink,
                     return_attn_probs, softcap=softcap, qv=qv, num_splits=num_splits, pack_gqa=pack_gqa)
    if not isinstance(cu_seqlens_q, torch.Tensor) or not isinstance(cu_seqlens_k, torch.Tensor):
        _refuse("cu_seqlens_q and cu_seqlens_k must be int32 tensors (batch + 1,)", TypeError)
    descales = _descales(q_descale, k_descale, v_descale)
    check(q, k, v, descales, varlen=True, batch=cu_seqlens_q.shape[0] - 1, qv=qv)
    if attention_chunk:
        from . import chunked
        from .interface import flash_attn_varlen_func  # interface imports this module

        support.check_attention_chunk(attention_chunk)
        segments = -(-int(max_seqlen_q) // attention_chunk) + 2  # chunked.segments' per sequence
        return chunked.varlen(flash_attn_varlen_func, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              seqused_q, seqused_k, attention_chunk, softmax_scale=softmax_scale, causal=causal,
                              window_size=window_size, softcap=softcap, return_attn_probs=return_attn_probs,
                              learnable_sink=learnable_sink, **_per_segment(descales, segments))
    scale, causal, left, right = _scale_and_window(q, k, v, softmax_scale, causal, window_size, softcap,
                                                   int(max_seqlen_q), int(max_seqlen_k))
    op = ops.op_of_build("varlen_fwd_fp8", "FP8")
    sink = sinks.kernel_sink(learnable_sink, q.shape[1], q)
    out, lse = packgqa.call_packed(
        lambda rows, cu_q, max_q, causal, left, right, **kw: op(
            rows, k, v, cu_q, cu_seqlens_k, seqused_q, seqused_k, max_q, int(max_seqlen_k), q_descale, k_descale,
            v_descale, scale, causal, left, right, softcap=float(softcap), sink=sink, **kw),
        q, k.shape[1], cu_seqlens_q, int(max_seqlen_q), causal, left, right, softcap, learnable_sink, seqused_q,
        num_splits, pack_gqa, return_attn_probs)
    return (out, lse) if return_attn_probs else out


def paged(q, k_cache, v_cache, page_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
          q_descale, k_descale, v_descale, softmax_scale, causal, window_size, learnable_sink, return_attn_probs,
          softcap=0.0, qv=None, num_splits=1, pack_gqa=None):
    """A paged FP8 cache (paged.py's layout and rules; seqused_k required, cu_seqlens_k None = keys from
    position 0): flash_attn_varlen_func / flash_attn_with_kvcache with a page table and FP8 inputs."""
    if not isinstance(cu_seqlens_q, torch.Tensor):
        _refuse("cu_seqlens_q must be an int32 tensor of batch + 1 offsets", TypeError)
    descales = _descales(q_descale, k_descale, v_descale)
    check(q, k_cache, v_cache, descales, varlen=True, batch=cu_seqlens_q.shape[0] - 1, qv=qv, paged=True)
    refusal = paged_cache.cache_refusal(k_cache, v_cache, page_table, q)
    if refusal is not None:
        raise refusal.exception()
    if seqused_k is None:
        _refuse("with a page table, seqused_k (int32 (batch,): each sequence's number of keys) is required")
    if cu_seqlens_k is None:
        cu_seqlens_k = offsets.constant("full", cu_seqlens_q.shape[0], 0, q.device)
    max_k = min(int(max_seqlen_k), page_table.shape[1] * k_cache.shape[1])  # a page-table row's capacity
    scale, causal, left, right = _scale_and_window(q, k_cache, v_cache, softmax_scale, causal, window_size, softcap,
                                                   int(max_seqlen_q), max_k)
    op = ops.op_of_build("paged_fwd_fp8", "paged FP8")
    sink = sinks.kernel_sink(learnable_sink, q.shape[1], q)
    out, lse = packgqa.call_packed(
        lambda rows, cu_q, max_q, causal, left, right, **kw: op(
            rows, k_cache, v_cache, page_table, cu_q, cu_seqlens_k, seqused_k, max_q, max_k, q_descale, k_descale,
            v_descale, scale, causal, left, right, softcap=float(softcap), sink=sink, **kw),
        q, k_cache.shape[2], cu_seqlens_q, int(max_seqlen_q), causal, left, right, softcap, learnable_sink, None,
        num_splits, pack_gqa, return_attn_probs)
    return (out, lse) if return_attn_probs else out


# torch.compile / export: shapes without running the kernels.
def _fwd_fp8_fake(q, k, v, q_descale, k_descale, v_descale, softmax_scale, causal, window_size_left=-1,
                  window_size_right=-1, top_left=False, softcap=0.0, sink=None):
    batch, seqlen_q, heads, d = q.shape
    return (q.new_empty((batch, seqlen_q, heads, d), dtype=torch.bfloat16),
            q.new_empty((batch, heads, seqlen_q), dtype=torch.float32))


def _varlen_fwd_fp8_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                         q_descale, k_descale, v_descale, softmax_scale, causal, window_size_left=-1,
                         window_size_right=-1, top_left=False, softcap=0.0, sink=None, num_splits=1, pack_gqa=1):
    out_shape, lse_shape = ops.packed_output_shapes(q, q.shape[-1], pack_gqa)
    return q.new_empty(out_shape, dtype=torch.bfloat16), q.new_empty(lse_shape, dtype=torch.float32)


def _paged_fwd_fp8_fake(q, k_cache, v_cache, page_table, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                        max_seqlen_k, q_descale, k_descale, v_descale, softmax_scale, causal, window_size_left=-1,
                        window_size_right=-1, top_left=False, softcap=0.0, sink=None, num_splits=1, pack_gqa=1):
    return _varlen_fwd_fp8_fake(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, None, seqused_k, max_seqlen_q,
                                max_seqlen_k, q_descale, k_descale, v_descale, softmax_scale, causal,
                                pack_gqa=pack_gqa)


if ops._PY_LIBRARY is not None:  # fake kernels; the backward raises
    ops.register_forward_only(ops._PY_LIBRARY, {"fwd_fp8": _fwd_fp8_fake, "varlen_fwd_fp8": _varlen_fwd_fp8_fake,
                                                "paged_fwd_fp8": _paged_fwd_fp8_fake},
                              "flash_attn_hopper: FP8 attention has no backward (as FlashAttention-3)")
