"""Refusals for torch's flash-attention registry: when an overridden aten op keeps the replaced kernel.

Each function takes an aten op's arguments and returns why our kernels cannot
compute that call exactly (a short reason), or None when they can.  The
overrides in ``torch_registry`` ask them before every kernel launch.
"""

from __future__ import annotations

import torch

from . import ops, support, support_varlen


def sdpa_flash_refusal(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    """Why ``aten::_scaled_dot_product_flash_attention`` falls back (None: our kernel runs).

    Arguments are that op's; query (batch, heads, L, E), key and value (batch, heads_kv, S, E).
    """
    if dropout_p != 0.0:
        return f"dropout_p={dropout_p}"
    if return_debug_mask:
        return "return_debug_mask=True"
    return _forward_refusal(query, key, value, "bhsd", is_causal, (None, None), scale)


def _quantized_refusal(query, key, value) -> str | None:
    """The ``.quantized`` overloads (FP8 with descales): ours for float8_e4m3fn inputs on a build with
    the FP8 ops; other dtypes keep torch's kernel. What the FP8 kernels do not take then raises
    fp8.py's clear error rather than falling back (torch's own kernel has no FP8 either)."""
    from . import fp8

    if not all(isinstance(t, torch.Tensor) and t.dtype == fp8.DTYPE for t in (query, key, value)):
        return "inputs are not all float8_e4m3fn"
    if not (ops.extension_loaded() and hasattr(torch.ops.flash_attn_hopper, "fwd_fp8")):
        return "this build has no FP8 forward op"
    return None


def sdpa_flash_quantized_refusal(query, key, value, q_descale=None, k_descale=None, v_descale=None, dropout_p=0.0,
                                 is_causal=False, return_debug_mask=False, *, scale=None):
    """Why ``aten::_scaled_dot_product_flash_attention.quantized`` falls back (None: our FP8 kernel runs)."""
    if dropout_p != 0.0:
        return f"dropout_p={dropout_p}"
    if return_debug_mask:
        return "return_debug_mask=True"
    return _quantized_refusal(query, key, value)


def flash_attention_forward_quantized_refusal(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                                              is_causal, return_debug_mask, q_descale=None, k_descale=None,
                                              v_descale=None, *, scale=None, window_size_left=None,
                                              window_size_right=None, seqused_k=None, alibi_slopes=None, **newer):
    """Why ``aten::_flash_attention_forward.quantized`` falls back (None: our FP8 kernel runs)."""
    if (cum_seq_q is None) != (cum_seq_k is None):
        return "only one of cum_seq_q and cum_seq_k is given"
    if seqused_k is not None and cum_seq_q is None:
        return "seqused_k is given without cum_seq_q / cum_seq_k"
    if dropout_p != 0.0:
        return f"dropout_p={dropout_p}"
    if return_debug_mask:
        return "return_debug_mask=True"
    if alibi_slopes is not None:
        return "alibi_slopes is given"
    return _unknown_arguments(newer) or _quantized_refusal(query, key, value)


def flash_attention_forward_refusal(
    query,
    key,
    value,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    return_debug_mask,
    *,
    scale=None,
    window_size_left=None,
    window_size_right=None,
    seqused_k=None,
    alibi_slopes=None,
    block_table=None,
    num_splits=None,
    **newer,
):
    """Why ``aten::_flash_attention_forward`` falls back (None: our kernel runs).

    Arguments are that op's (query, key, value in (batch, seqlen, heads, head_dim)).
    ``num_splits`` goes to our split-KV kernels (None: no split); it changes the result only by rounding.
    Keyword arguments of a later torch that this version does not know make it fall back.
    """
    varlen = cum_seq_q is not None or cum_seq_k is not None
    if varlen and (cum_seq_q is None or cum_seq_k is None) and block_table is None:
        return "only one of cum_seq_q and cum_seq_k is given"
    if dropout_p != 0.0:
        return f"dropout_p={dropout_p}"
    if return_debug_mask:
        return "return_debug_mask=True"
    if seqused_k is not None and not varlen:
        return "seqused_k is given without cum_seq_q / cum_seq_k"
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0):
        return f"num_splits={num_splits!r} (not an int >= 0)"
    if alibi_slopes is not None:
        return "alibi_slopes is given"
    reason = _unknown_arguments(newer)
    if reason is not None:
        return reason
    if block_table is not None:
        return _paged_refusal(query, key, value, cum_seq_q, cum_seq_k, seqused_k, block_table, max_q, max_k,
                              is_causal, (window_size_left, window_size_right), scale)
    if varlen:
        return _varlen_refusal(
            query, key, value, cum_seq_q, cum_seq_k, seqused_k, max_q, max_k, is_causal,
            (window_size_left, window_size_right), scale,
        )
    return _forward_refusal(query, key, value, "bshd", is_causal, (window_size_left, window_size_right), scale)


def _varlen_refusal(query, key, value, cum_seq_q, cum_seq_k, seqused_k, max_q, max_k, is_causal, window_size, scale):
    """support_varlen.check_varlen's answer for an aten varlen call (FlashAttention-2's window rules), as a reason or None."""
    for name, t in (("query", query), ("key", key)):
        if isinstance(t, torch.Tensor) and t.numel() == 0:
            return f"{name} is empty (shape {tuple(t.shape)})"
    answer = support_varlen.check_varlen(
        query, key, value, cum_seq_q, cum_seq_k, None, seqused_k, max_q, max_k, causal=bool(is_causal),
        window_size=window_size, window_rules="fa2", softmax_scale=scale, names=("query", "key", "value"),
    )
    return str(answer) if isinstance(answer, support.Refusal) else None


def _paged_refusal(query, key, value, cum_seq_q, cum_seq_k, seqused_k, block_table, max_q, max_k, is_causal,
                   window_size, scale) -> str | None:
    """A paged call (block_table, key / value (total_pages, page_size, heads_kv, head_dim)): our paged
    op serves it when the varlen checks pass with one page as the keys; forward only."""
    reason = _paged_reason(query, key, value, cum_seq_q, cum_seq_k, seqused_k, block_table, max_q, max_k, is_causal,
                           window_size, scale)
    return None if reason is None else f"block_table (paged KV): {reason}"


def _paged_reason(query, key, value, cum_seq_q, cum_seq_k, seqused_k, block_table, max_q, max_k, is_causal,
                  window_size, scale) -> str | None:
    from . import paged

    if cum_seq_q is None or seqused_k is None:
        return "given without cum_seq_q and seqused_k"
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (query, key, value)):
        return "inputs that require grad (the paged kernels have no backward)"
    if not paged.has_paged_op():
        return "this build of flash_attn_hopper has no paged_fwd op"
    if isinstance(query, torch.Tensor) and query.numel() == 0:
        return f"query is empty (shape {tuple(query.shape)})"
    refusal = paged.cache_refusal(key, value, block_table, query)
    if refusal is not None:
        return str(refusal)
    cum_k = cum_seq_k if cum_seq_k is not None else cum_seq_q  # any int32 (batch + 1,) passes the shape check
    answer = support_varlen.check_varlen(
        query, key[0], value[0], cum_seq_q, cum_k, None, seqused_k, max_q, max_k, causal=bool(is_causal),
        window_size=window_size, window_rules="fa2", softmax_scale=scale, names=("query", "key", "value"),
    )
    if isinstance(answer, support.Refusal):
        return str(answer)
    if block_table.shape[0] != cum_seq_q.numel() - 1:
        return f"{block_table.shape[0]} rows for {cum_seq_q.numel() - 1} sequences"
    return None


def _forward_refusal(query, key, value, layout, is_causal, window_size, scale) -> str | None:
    """support.check's answer for the tensors of a forward (or backward) op, as a reason or None."""
    answer = support.check(
        query, key, value, layout=layout, causal=bool(is_causal), window_size=window_size, window_rules="fa2",
        softmax_scale=scale, names=("query", "key", "value"), allow_empty=False,
    )
    return str(answer) if isinstance(answer, support.Refusal) else None


def _unknown_arguments(newer: dict) -> str | None:
    """Keyword arguments of a later torch's schema: harmless when None (their default), else a refusal."""
    unknown = sorted(name for name, value in newer.items() if value is not None)
    if unknown:
        return f"arguments unknown to this version of flash_attn_hopper: {', '.join(unknown)}"
    return None


def _backward_call_refusal(cum_seq_q, cum_seq_k, dropout_p, newer: dict, varlen_ok: bool = False) -> str | None:
    """What both backward ops refuse before looking at the tensors (``varlen_ok``: the op serves
    variable-length calls when the build has the varlen_bwd op)."""
    varlen = cum_seq_q is not None or cum_seq_k is not None
    if varlen:
        if not varlen_ok:
            return "variable-length (cum_seq_q / cum_seq_k) inputs"
        if cum_seq_q is None or cum_seq_k is None:
            return "only one of cum_seq_q and cum_seq_k is given"
    if dropout_p != 0.0:
        return f"dropout_p={dropout_p}"
    reason = _unknown_arguments(newer)
    if reason is not None:
        return reason
    if varlen:
        return None if ops.has_varlen_bwd_op() else "this build of flash_attn_hopper has no varlen_bwd op"
    if not ops.has_bwd_op():
        # Activation installs no backward override then; this guards a direct call.
        return "this build of flash_attn_hopper has no backward op"
    return None


def _undefined_tensors(**named) -> str | None:
    """Which of the named tensors are undefined (None in Python), e.g. grad_out when no gradient flows."""
    undefined = [name for name, t in named.items() if not isinstance(t, torch.Tensor)]
    if undefined:
        return f"{', '.join(undefined)} {'is' if len(undefined) == 1 else 'are'} undefined"
    return None


def _backward_tensors_refusal(grad_out, q, k, v, out, logsumexp, layout, is_causal, window_size, scale) -> str | None:
    """Why the bwd op cannot take these tensors (in ``layout``, see support.check); None when it can.

    Everything the op's C++ checks would reject is refused here, before the
    call: a C++ argument error once ended the process on the H200 instead of
    raising, and torch's kernel either handles such a call or says what is
    wrong with it in its own terms.
    """
    reason = _undefined_tensors(grad_out=grad_out, query=q, key=k, value=v, out=out, logsumexp=logsumexp)
    if reason is not None:
        return reason
    answer = support.check(
        q, k, v, layout=layout, causal=bool(is_causal), window_size=window_size, window_rules="fa2",
        softmax_scale=scale, names=("query", "key", "value"), allow_empty=False,
    )
    if isinstance(answer, support.Refusal):
        return str(answer)
    refusal = support.not_compiled_refusal("bwd", answer.head_dim, answer.dtype)
    if refusal is not None:
        return str(refusal)
    if grad_out.shape != q.shape or out.shape != q.shape:
        return f"grad_out {tuple(grad_out.shape)} or out {tuple(out.shape)} does not have the query's shape"
    if grad_out.dtype != q.dtype or out.dtype != q.dtype:
        return f"grad_out ({grad_out.dtype}) or out ({out.dtype}) does not have the query's dtype"
    lse_shape = (answer.batch, answer.heads_q, answer.seqlen_q)
    if logsumexp.dtype != torch.float32 or logsumexp.shape != lse_shape:
        return (
            f"logsumexp is {logsumexp.dtype} {tuple(logsumexp.shape)}, not float32 "
            f"(batch, heads, seqlen_q) = {lse_shape}"
        )
    if grad_out.device != q.device or out.device != q.device or logsumexp.device != q.device:
        return "grad_out, out or logsumexp is not on the query's device"
    return None


def sdpa_flash_backward_refusal(
    grad_out,
    query,
    key,
    value,
    out,
    logsumexp,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    philox_seed,
    philox_offset,
    *,
    scale=None,
    **newer,
):
    """Why ``aten::_scaled_dot_product_flash_attention_backward`` falls back (None: our kernel runs).

    Arguments are that op's: grad_out, query, out (batch, heads, L, E), key and
    value (batch, heads_kv, S, E), logsumexp (batch, heads, L) as the forward
    returned it.  Non-optional tensors that are undefined in C++ (cum_seq_q and
    cum_seq_k of a dense batch; grad_out when no gradient flows) arrive as None.
    Keyword arguments of a later torch that this version does not know make it fall back.
    """
    reason = _backward_call_refusal(cum_seq_q, cum_seq_k, dropout_p, newer)
    if reason is not None:
        return reason
    reason = _undefined_tensors(grad_out=grad_out, query=query, key=key, value=value, out=out, logsumexp=logsumexp)
    if reason is not None:
        return reason
    return _backward_tensors_refusal(grad_out, query, key, value, out, logsumexp, "bhsd", is_causal, (None, None), scale)


def flash_attention_backward_refusal(
    grad_out,
    query,
    key,
    value,
    out,
    logsumexp,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    rng_state,
    unused,
    *,
    scale=None,
    window_size_left=None,
    window_size_right=None,
    **newer,
):
    """Why ``aten::_flash_attention_backward`` falls back (None: our kernel runs).

    Arguments are that op's (grad_out, query, key, value, out in (batch, seqlen,
    heads, head_dim); rng_state and unused, unused here, are named
    philox_seed and philox_offset in older torch versions, which pass them in
    the same place).  Windows need no refusal: the bwd op applies any window
    the forward override computes with.
    Keyword arguments of a later torch that this version does not know make it fall back.
    """
    reason = _backward_call_refusal(cum_seq_q, cum_seq_k, dropout_p, newer, varlen_ok=True)
    if reason is not None:
        return reason
    if cum_seq_q is not None:
        return _varlen_backward_tensors_refusal(
            grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, is_causal,
            (window_size_left, window_size_right), scale,
        )
    return _backward_tensors_refusal(
        grad_out, query, key, value, out, logsumexp, "bshd", is_causal, (window_size_left, window_size_right), scale
    )


def _varlen_backward_tensors_refusal(
    grad_out, q, k, v, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, is_causal, window_size, scale
) -> str | None:
    """Why varlen_bwd cannot take these tensors ((total, heads, head_dim), lse (heads, total_q)); None when it can."""
    reason = _undefined_tensors(grad_out=grad_out, query=q, key=k, value=v, out=out, logsumexp=logsumexp)
    if reason is not None:
        return reason
    reason = _varlen_refusal(q, k, v, cum_seq_q, cum_seq_k, None, max_q, max_k, is_causal, window_size, scale)
    if reason is not None:
        return reason
    refusal = support.not_compiled_refusal("bwd", q.size(-1), support.DTYPE_NAMES[q.dtype])
    if refusal is not None:
        return str(refusal)
    if grad_out.shape != q.shape or out.shape != q.shape:
        return f"grad_out {tuple(grad_out.shape)} or out {tuple(out.shape)} does not have the query's shape"
    if grad_out.dtype != q.dtype or out.dtype != q.dtype:
        return f"grad_out ({grad_out.dtype}) or out ({out.dtype}) does not have the query's dtype"
    lse_shape = (q.size(1), q.size(0))
    if logsumexp.dtype != torch.float32 or logsumexp.shape != lse_shape:
        return f"logsumexp is {logsumexp.dtype} {tuple(logsumexp.shape)}, not float32 (heads, total_q) = {lse_shape}"
    if grad_out.device != q.device or out.device != q.device or logsumexp.device != q.device:
        return "grad_out, out or logsumexp is not on the query's device"
    return None
