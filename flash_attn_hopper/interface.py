"""FlashAttention-3's Python API on flash_attn_hopper's kernels.

Names, argument order and defaults follow FlashAttention-3's
``hopper/flash_attn_interface.py`` so code written for it runs unchanged where
this version has kernels.  Everything is checked before any launch, by
:func:`flash_attn_hopper.support.check` (the check the SDPA drop-in and the
registry override fall back on), with messages that say what was asked, what
is supported and how to fix it; arguments that ask for features without
kernels in this version raise instead of returning a made-up result.

Layout is ``(batch, seqlen, nheads, headdim)`` (``(total, nheads, headdim)`` for the
varlen function); ``softmax_lse`` is float32
``(batch, nheads, seqlen_q)`` (``(nheads, total_q)`` for varlen) in natural log; ``causal`` is aligned to the
bottom-right corner of the attention matrix.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import chunked, fp8, manifest, offsets, ops, packgqa, paged, qv as qv_calls, sinks, support, support_varlen

# --------------------------------------------------------------------------
# Checks: argument types here, everything else in support.check
# --------------------------------------------------------------------------


def _check_scale_and_causal(softmax_scale, causal) -> None:
    """softmax_scale a Python number or None, causal a bool."""
    if softmax_scale is not None and (
        isinstance(softmax_scale, torch.Tensor) or not isinstance(softmax_scale, (int, float))
    ):
        raise TypeError(f"softmax_scale must be a Python float or None, got {type(softmax_scale).__name__}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")


def _check_fwd_args(q, k, v, softmax_scale, causal, window_size, softcap):
    """Validate a forward call; return (softmax_scale, causal, window) for the op.

    ``window`` is None for no window or plain causal, else the effective
    (left, right) of a sliding window, -1 = unbounded.  The argument types are
    checked here; what the kernels support (structure, scale, features, the
    compiled set, the device, in that order) by :func:`support.check`, whose
    refusal is raised as it is.
    """
    _check_scale_and_causal(softmax_scale, causal)
    answer = support.check(
        q, k, v, causal=causal, window_size=window_size,
        softmax_scale=None if softmax_scale is None else float(softmax_scale), softcap=softcap,
    )
    if isinstance(answer, support.Refusal):
        raise answer.exception()
    scale = answer.head_dim ** (-0.5) if answer.softmax_scale is None else answer.softmax_scale
    return scale, answer.causal, answer.window


def _pad_head_dim(q, k, v, softmax_scale):
    """Head dims the kernels do not take as they are run on zero-padded copies: a head dim that is
    not a multiple of 8 (FA3's tests use 59 and 111; TMA needs 16-byte rows), and v's head dim
    differing from q / k's (dv != d: FA3's 192 / 128 and 64 / 256). q, k and v are padded to one
    width, the larger head dim rounded up to 8; zero columns change neither q kᵀ nor the kept
    columns of the output, so only the cost differs from kernels of their own (the padded
    columns' share of the work and the copies). Returns (q, k, v, softmax_scale of q's real head
    dim, the head dim to cut the output back to (v's), or None when nothing was padded). Anything
    else is left for support.check to judge (q and k of different head dims, widths past 256,
    non-tensors)."""
    if not all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in (q, k, v)):
        return q, k, v, softmax_scale, None
    d, dv = q.shape[-1], v.shape[-1]
    multiple = manifest.HEAD_DIM_MULTIPLE
    width = max(d + -d % multiple, dv + -dv % multiple)
    if k.shape[-1] != d or width > manifest.MAX_HEAD_DIM or (d == dv and d % multiple == 0) \
            or manifest.own_value_kernels(d, dv):  # kernels of their own take the pair as it is
        return q, k, v, softmax_scale, None
    scale = d ** (-0.5) if softmax_scale is None else softmax_scale

    def pad(t):
        return F.pad(t, (0, width - t.shape[-1])) if t.shape[-1] != width else t

    return pad(q), pad(k), pad(v), scale, dv


def _value_chunks(q, k, v):
    """v's head dim in pieces when it is wider than the widest kernel (FA3's d 64 / dv 512): pieces
    of q's head dim rounded up to 8 (the last one narrower), each its own call over the same q and k.
    Every piece's softmax is the same one, so the pieces of out side by side are out, every piece's
    LSE is the LSE, and autograd sums the pieces' dq and dk (both linear in dS, which is the sum of
    the pieces' dS). Costs one more q kᵀ per piece. None where v fits, or where q / k are not for
    this (the checks then say why)."""
    if not all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in (q, k, v)):
        return None
    d, dv = q.shape[-1], v.shape[-1]
    if dv <= manifest.MAX_HEAD_DIM or k.shape[-1] != d or d > manifest.MAX_HEAD_DIM:
        return None
    width = d + -d % manifest.HEAD_DIM_MULTIPLE
    return [(a, min(a + width, dv)) for a in range(0, dv, width)]


def _over_value_chunks(call, v, chunks, return_lse: bool):
    """call(v_piece, return_lse) per piece of v's head dim, the outputs side by side (_value_chunks)."""
    results = [call(v[..., a:b], return_lse and i == 0) for i, (a, b) in enumerate(chunks)]
    out = torch.cat([r[0] if isinstance(r, tuple) else r for r in results], dim=-1)
    return (out, results[0][1]) if return_lse else out


def _chunk_segments(batch: int, seqlen_q: int, seqlen_k: int, chunk: int):
    """Chunked attention as variable-length segments: query i of a batch entry sits at key position
    i + seqlen_k - seqlen_q (bottom-right) and sees only the keys of its chunk of ``chunk`` keys
    (FA3's attention_chunk). Each (batch entry, key chunk) is one segment of the packed rows, its
    queries and keys ending at the same position, so the segments' own bottom-right diagonal is the
    problem's; queries before key 0 form a segment without keys. Returns host lists cu_q, cu_k and
    the longest segments."""
    offset = seqlen_k - seqlen_q
    cu_q, cu_k = [0], [0]
    for b in range(batch):
        row_q, row_k = b * seqlen_q, b * seqlen_k
        blind = min(max(-offset, 0), seqlen_q)  # queries at negative key positions
        if blind:
            cu_q.append(row_q + blind)
            cu_k.append(row_k)
        for c in range(-(-seqlen_k // chunk)):
            cu_q.append(row_q + min(max((c + 1) * chunk - offset, blind), seqlen_q))
            cu_k.append(row_k + min((c + 1) * chunk, seqlen_k))
        cu_q[-1], cu_k[-1] = row_q + seqlen_q, row_k + seqlen_k
    max_q = max((b - a for a, b in zip(cu_q, cu_q[1:])), default=0)
    max_k = max((b - a for a, b in zip(cu_k, cu_k[1:])), default=0)
    return cu_q, cu_k, max_q, max_k


def _chunked(q, k, v, attention_chunk, return_attn_probs, **kwargs):
    """flash_attn_func with attention_chunk: the varlen kernels over the chunk segments of the
    packed rows (views where the batch and sequence dims merge), out and lse back in q's layout."""
    support.check_attention_chunk(attention_chunk)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (batch, seqlen, nheads, headdim) with attention_chunk")
    if q.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "flash_attn_hopper: attention_chunk copies its chunk offsets to the GPU per call, which a CUDA graph "
            "capture cannot hold; run chunked attention outside the capture"
        )
    batch, seqlen_q, heads, _ = q.shape
    seqlen_k = k.shape[1]
    cu_q, cu_k, max_q, max_k = _chunk_segments(batch, seqlen_q, seqlen_k, attention_chunk)
    device = q.device
    out, lse = flash_attn_varlen_func(
        q.reshape(batch * seqlen_q, heads, q.shape[-1]), k.reshape(batch * seqlen_k, *k.shape[2:]),
        v.reshape(batch * seqlen_k, *v.shape[2:]), torch.tensor(cu_q, dtype=torch.int32, device=device),
        torch.tensor(cu_k, dtype=torch.int32, device=device), max_q, max_k, return_attn_probs=True, **kwargs,
    )
    out = out.reshape(batch, seqlen_q, heads, out.shape[-1])
    lse = lse.reshape(heads, batch, seqlen_q).transpose(0, 1)
    return (out, lse) if return_attn_probs else out


def _check_unsupported_extras(q_descale, k_descale, v_descale, attention_chunk, sm_margin) -> None:
    refusal = None
    for name, value in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if refusal is None and value is not None:
            refusal = support.Refusal(f"flash_attn_hopper: {name} applies to FP8 (float8_e4m3fn) inputs only",
                                      "Pass q, k and v in torch.float8_e4m3fn with it, or no descale tensors.",
                                      ValueError)
    if refusal is None and attention_chunk != 0:
        refusal = support.feature_refusal("attention_chunk", f"attention_chunk={attention_chunk}", "Pass attention_chunk=0.")
    if refusal is None and sm_margin != 0:
        refusal = support.feature_refusal("sm_margin", f"sm_margin={sm_margin}", "The kernels use every SM; pass sm_margin=0.")
    if refusal is not None:
        raise refusal.exception()


# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------


def flash_attn_func(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
    learnable_sink=None,
):
    """Exact attention softmax(q kᵀ · softmax_scale) v on Hopper.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim), fp16 or bf16, on an sm_90 GPU.
        k, v: (batch, seqlen_k, nheads_kv, headdim), same dtype; nheads must be
            a multiple of nheads_kv (grouped-query / multi-query attention:
            query head h uses kv head h // (nheads // nheads_kv)).
            Only the last dimension must be contiguous. v may have its own head dim
            headdim_v (FA3's dv != d, e.g. 192 / 128); such calls run on zero-padded copies of
            q, k and v, and a headdim_v past 256 (64 / 512) in pieces of q's head dim, one call
            each (correct, slower than kernels of their own).
        softmax_scale: defaults to 1 / sqrt(headdim).
        causal: mask aligned to the bottom-right corner: query i sees key j
            when j <= i + seqlen_k - seqlen_q.  A query that sees no key
            gets output 0 and lse -inf.
        window_size: (left, right), -1 = unbounded: local attention, aligned
            like causal (query i sees key j when
            i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right).
        attention_chunk: FA3's chunked local attention (Llama 4): query i sees only the keys of
            its chunk of attention_chunk keys (positions bottom-right aligned), combined with
            causal / window_size; computed by the variable-length kernels over the chunks.
        softcap: 0 (off) or a positive number: the scaled scores s become
            softcap * tanh(s / softcap) before any mask (Gemma 2; FlashAttention-3's semantics),
            in the backward too; softmax_lse is then that of the capped scores.
        qv: None, or (batch, seqlen_q, nheads, headdim_v): FA3's extra query (MLA decode, headdim
            64, headdim_v 512): scores softmax_scale * (q kᵀ + qv vᵀ), softmax_scale defaulting
            to (headdim + headdim_v) ** -0.5; forward only (flash_attn_hopper/qv.py).
        q/k/v_descale: with q, k, v in torch.float8_e4m3fn, FA3's FP8 forward: None or float32
            (batch, nheads_kv) descales; out is then bfloat16 (flash_attn_hopper/fp8.py).
        sm_margin: accepted for FlashAttention-3 compatibility; only 0 runs.
        num_splits: split-KV, as FlashAttention-3: 1 (default) none, 0 choose (split when the
            query tiles leave SMs idle: decode), n > 1 at most n splits whose partial results
            the combine kernel merges (a learnable sink joins there). The result does not depend
            on it beyond rounding; calls with softcap run unsplit.
        pack_gqa: None (default) choose, True / False: run the query heads of a KV head as query
            rows of one head where that is exact (no causal/local mask, or one query per sequence
            under a plain causal mask; not with learnable_sink), so each KV head is read once
            (decode). None packs at decode (seqlen_q 1), True wherever exact (packgqa.py).
        deterministic: the backward computes bitwise reproducible gradients
            (dQ accumulated in a fixed order; slower).  Also on whenever
            torch.use_deterministic_algorithms(True) is in force at the
            forward call.  The forward pass is always deterministic.
        return_attn_probs: also return softmax_lse.
        learnable_sink: None, or a (nheads,) float32 / q-dtype tensor: one logit per head that
            joins each row's softmax denominator and contributes no value (gpt-oss; FA4's
            argument); differentiable (flash_attn_hopper/sinks.py). softmax_lse then includes it.

    Returns:
        out (batch, seqlen_q, nheads, headdim_v) in q's dtype, or
        (out, softmax_lse) with softmax_lse float32 (batch, nheads, seqlen_q),
        the natural-log logsumexp of each row of q kᵀ · softmax_scale.
    """
    if fp8.is_fp8(q, k, v):
        _check_unsupported_extras(None, None, None, 0, sm_margin)
        support.check_num_splits(num_splits)  # num_splits / pack_gqa: hints dense FP8 calls do not take
        packgqa.check_pack_gqa(pack_gqa)
        return fp8.dense(q, k, v, q_descale, k_descale, v_descale, softmax_scale, causal, window_size, learnable_sink,
                         return_attn_probs, softcap=softcap, attention_chunk=attention_chunk, qv=qv)
    _check_unsupported_extras(q_descale, k_descale, v_descale, 0, sm_margin)
    support.check_num_splits(num_splits)
    packgqa.check_pack_gqa(pack_gqa)
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    if qv is not None:
        _check_scale_and_causal(softmax_scale, causal)
        if attention_chunk:  # the chunk segments as varlen sequences, qv's rows with q's
            qv_calls.check(q, k, v, qv, varlen=False)
            return _chunked(q, k, v, attention_chunk, return_attn_probs, softmax_scale=softmax_scale, causal=causal,
                            window_size=window_size, softcap=softcap, learnable_sink=learnable_sink,
                            qv=qv.reshape(-1, *qv.shape[2:]))
        return qv_calls.dense(q, k, v, qv, softmax_scale, causal, window_size, softcap, learnable_sink,
                              return_attn_probs, pack_gqa, num_splits)
    chunks = _value_chunks(q, k, v)
    if chunks is not None:
        return _over_value_chunks(
            lambda v_piece, lse: flash_attn_func(
                q, k, v_piece, softmax_scale, causal, window_size=window_size, attention_chunk=attention_chunk,
                softcap=softcap, num_splits=num_splits, pack_gqa=pack_gqa, deterministic=deterministic,
                return_attn_probs=lse, learnable_sink=learnable_sink),
            v, chunks, return_attn_probs)
    if attention_chunk:
        return _chunked(q, k, v, attention_chunk, return_attn_probs, softmax_scale=softmax_scale, causal=causal,
                        window_size=window_size, softcap=softcap, deterministic=deterministic,
                        learnable_sink=learnable_sink)
    q, k, v, softmax_scale, head_dim = _pad_head_dim(q, k, v, softmax_scale)
    softmax_scale, causal, window = _check_fwd_args(q, k, v, softmax_scale, causal, window_size, softcap)
    if learnable_sink is not None:
        sinks.check_sink(learnable_sink, q.shape[2], q)
        left, right = window if window is not None else (-1, 0 if causal else -1)
        out, softmax_lse = torch.ops.flash_attn_hopper.fwd_sink(
            q, k, v, learnable_sink, softmax_scale, causal, left, right, deterministic,
            **ops.optional_args(softcap, num_splits)
        )
    else:
        # Same kernel either way; the op's autograd formula picks the backward (see ops.py).
        if deterministic:
            fwd = getattr(torch.ops.flash_attn_hopper, ops.DETERMINISTIC_FWD_NAME)
        else:
            fwd = torch.ops.flash_attn_hopper.fwd
        left, right = window if window is not None else (-1, -1)
        group = q.shape[2] // k.shape[2]
        if packgqa.packs(pack_gqa, group, q.shape[1], causal, (left, right)):
            batch, seqlen_q, heads, d = q.shape
            packed = packgqa.pack_rows(q.reshape(batch * seqlen_q, heads, d), k.shape[2])
            out, softmax_lse = fwd(packed.view(batch, seqlen_q * group, k.shape[2], d), k, v, softmax_scale, False,
                                   -1, -1, **ops.optional_args(softcap, num_splits))
            out = packgqa.unpack_rows(out.reshape(batch * seqlen_q * group, k.shape[2], -1), group)
            out = out.view(batch, seqlen_q, heads, -1)
            softmax_lse = packgqa.unpack_lse(softmax_lse, group) if return_attn_probs else None
        else:
            out, softmax_lse = fwd(q, k, v, softmax_scale, causal, left, right,
                                   **ops.optional_args(softcap, num_splits))
    if head_dim is not None:
        out = out[..., :head_dim]
    return (out, softmax_lse) if return_attn_probs else out


def flash_attn_qkvpacked_func(
    qkv,
    softmax_scale=None,
    causal=False,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    deterministic=False,
    num_heads_q=None,
    sm_margin=0,
    return_attn_probs=False,
):
    """Attention over a packed tensor, without copying q, k and v out of it.

    qkv is either (batch, seqlen, 3, nheads, headdim), or
    (batch, seqlen, nheads_q + 2 * nheads_kv, headdim) with ``num_heads_q``
    given (grouped-query attention: q heads first, then k, then v).
    Other arguments and the result are those of :func:`flash_attn_func`.
    """
    if not isinstance(qkv, torch.Tensor):
        raise TypeError(f"qkv must be a torch.Tensor, got {type(qkv).__name__}")
    if qkv.dim() == 5:
        if qkv.shape[2] != 3:
            raise ValueError(
                f"qkv of 5 dimensions must be (batch, seqlen, 3, nheads, headdim), got shape {tuple(qkv.shape)}"
            )
        if num_heads_q is not None and num_heads_q != qkv.shape[3]:
            raise ValueError(
                f"num_heads_q={num_heads_q} but qkv of shape {tuple(qkv.shape)} has {qkv.shape[3]} heads "
                "per q/k/v; leave num_heads_q=None for the 5-dimensional layout"
            )
        q, k, v = qkv.unbind(dim=2)
    elif qkv.dim() == 4:
        if num_heads_q is None:
            raise ValueError(
                "qkv of 4 dimensions (batch, seqlen, nheads_q + 2 * nheads_kv, headdim) needs num_heads_q; "
                "or pass the 5-dimensional (batch, seqlen, 3, nheads, headdim) layout"
            )
        total_heads = qkv.shape[2]
        num_heads_kv = (total_heads - num_heads_q) // 2
        if num_heads_q <= 0 or num_heads_kv <= 0 or num_heads_q + 2 * num_heads_kv != total_heads:
            raise ValueError(
                f"qkv has {total_heads} heads, which is not num_heads_q ({num_heads_q}) + 2 * nheads_kv "
                "for a positive nheads_kv"
            )
        q, k, v = qkv.split([num_heads_q, num_heads_kv, num_heads_kv], dim=2)
    else:
        raise ValueError(
            "qkv must be (batch, seqlen, 3, nheads, headdim) or (batch, seqlen, nheads_q + 2 * nheads_kv, headdim), "
            f"got shape {tuple(qkv.shape)}"
        )
    return flash_attn_func(
        q,
        k,
        v,
        softmax_scale=softmax_scale,
        causal=causal,
        q_descale=q_descale,
        k_descale=k_descale,
        v_descale=v_descale,
        window_size=window_size,
        attention_chunk=attention_chunk,
        softcap=softcap,
        deterministic=deterministic,
        sm_margin=sm_margin,
        return_attn_probs=return_attn_probs,
    )


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    seqused_q=None,
    seqused_k=None,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
    learnable_sink=None,
    page_table=None,
):
    """Attention over a batch of sequences of different lengths, packed along one dimension.

    Arguments:
        q: (total_q, nheads, headdim), the batch's queries one sequence after the other;
            fp16 or bf16 on an sm_90 GPU.
        k, v: (total_k, nheads_kv, headdim), same dtype; nheads a multiple of nheads_kv
            (GQA / MQA as in :func:`flash_attn_func`).  Only the last dimension must be
            contiguous.
        cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) on q's device: sequence b is rows
            cu_seqlens_q[b] : cu_seqlens_q[b + 1] of q (likewise of k and v).  Without
            seqused_q, cu_seqlens_q[-1] must be total_q.
        max_seqlen_q, max_seqlen_k: Python ints, at least every sequence's length (they
            size the launch; known on the host, so no device sync happens).
        seqused_q, seqused_k: None or int32 (batch,) on q's device: only the first
            seqused[b] rows of sequence b's segment take part (a KV cache filled up to
            seqused_k, a batch padded per sequence).  With seqused_q, rows outside every
            used part get out 0 and lse -inf; their gradients are 0.  seqused_k is read as
            FlashAttention-3 reads it, the keys' length from cu_seqlens_k[b] (at most
            max_seqlen_k), so with it cu_seqlens_k[:-1] may be offsets in any order.
        softmax_scale: defaults to 1 / sqrt(headdim).
        causal, window_size: per sequence, aligned to the bottom-right corner of that
            sequence's attention matrix, as :func:`flash_attn_func` does per batch entry;
            a query that sees no key gets output 0 and lse -inf.
        deterministic: a bitwise reproducible backward (also under
            torch.use_deterministic_algorithms(True) at the forward call).
        softcap: as in :func:`flash_attn_func`.
        attention_chunk: as in :func:`flash_attn_func`, per sequence (positions bottom-right
            aligned within each sequence); the chunk segments are made on the GPU (chunked.py),
            so nothing is read on the host. Not with a page_table (flash_attn_with_kvcache
            takes both).
        qv: None, or (total_q, nheads, headdim_v): as in :func:`flash_attn_func`, also with a
            page_table (v's cache then of headdim_v: vLLM's MLA decode).
        q/k/v_descale: with FP8 q, k, v as in :func:`flash_attn_func`, per sequence (batch =
            the number of sequences). sm_margin: only 0 runs.
        num_splits: as in :func:`flash_attn_func` (split-KV over each sequence's keys).
        pack_gqa: as in :func:`flash_attn_func` (per sequence, max_seqlen_q for the choice).
        return_attn_probs: also return softmax_lse.
        learnable_sink: None, or a (nheads,) tensor: one logit per head in every row's softmax
            denominator, as in flash_attn_func.
        page_table: None, or int32 (batch, max_pages) (vLLM's block_table): k and v are then a
            paged cache (num_pages, page_size, nheads_kv, headdim) read in place, sequence b's
            keys seqused_k[b] positions of its pages from cu_seqlens_k[b] (cu_seqlens_k may be
            None: from 0); see flash_attn_hopper/paged.py. Forward only; no seqused_q.

    Contents of cu_seqlens / seqused are not checked on the host (that would need a
    device sync); the kernels clamp them so that no memory outside the tensors is
    touched, but malformed offsets give meaningless results.

    Returns:
        out (total_q, nheads, headdim) in q's dtype, or (out, softmax_lse) with
        softmax_lse float32 (nheads, total_q), FlashAttention's varlen layout.
    """
    if fp8.is_fp8(q, k, v):
        _check_unsupported_extras(None, None, None, 0, sm_margin)
        support.check_num_splits(num_splits)
        packgqa.check_pack_gqa(pack_gqa)
        return fp8.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
                          q_descale, k_descale, v_descale, softmax_scale, causal, window_size, learnable_sink,
                          return_attn_probs, softcap=softcap, attention_chunk=attention_chunk, qv=qv,
                          page_table=page_table, num_splits=num_splits, pack_gqa=pack_gqa)
    _check_unsupported_extras(q_descale, k_descale, v_descale, 0, sm_margin)
    support.check_num_splits(num_splits)
    packgqa.check_pack_gqa(pack_gqa)
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    _check_scale_and_causal(softmax_scale, causal)
    if attention_chunk:
        if page_table is not None:
            raise ValueError("flash_attn_varlen_func takes attention_chunk or page_table, not both: "
                             "flash_attn_with_kvcache runs chunked attention over a paged cache")
        return chunked.varlen(
            flash_attn_varlen_func, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q,
            seqused_k, attention_chunk, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
            softcap=softcap, num_splits=num_splits, pack_gqa=pack_gqa, deterministic=deterministic,
            return_attn_probs=return_attn_probs, learnable_sink=learnable_sink, qv=qv)
    support.check_attention_chunk(attention_chunk)
    if qv is not None and page_table is None:
        return qv_calls.varlen(q, k, v, qv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q,
                               seqused_k, softmax_scale, causal, window_size, softcap, learnable_sink,
                               return_attn_probs, pack_gqa, num_splits)
    if page_table is not None:
        if seqused_q is not None:
            raise ValueError("seqused_q is not taken with a page table: pass cu_seqlens_q of the used queries")
        if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v)):
            raise RuntimeError("flash_attn_varlen_func with a page table has no backward (as FlashAttention-3): call "
                               "it under torch.no_grad() / torch.inference_mode()")
        if qv is not None:
            return qv_calls.paged(q, k, v, qv, page_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  seqused_k, softmax_scale, causal, window_size, softcap, learnable_sink,
                                  return_attn_probs, pack_gqa, num_splits)
        return paged.varlen_paged(q, k, v, page_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  seqused_k, softmax_scale, causal, window_size, softcap, num_splits, pack_gqa,
                                  return_attn_probs, learnable_sink)
    chunks = _value_chunks(q, k, v)
    if chunks is not None:
        return _over_value_chunks(
            lambda v_piece, lse: flash_attn_varlen_func(
                q, k, v_piece, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k,
                softmax_scale, causal, window_size=window_size, softcap=softcap, num_splits=num_splits,
                pack_gqa=pack_gqa, deterministic=deterministic, return_attn_probs=lse,
                learnable_sink=learnable_sink),
            v, chunks, return_attn_probs)
    q, k, v, softmax_scale, head_dim = _pad_head_dim(q, k, v, softmax_scale)
    answer = support_varlen.check_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
        causal=causal, window_size=window_size,
        softmax_scale=None if softmax_scale is None else float(softmax_scale), softcap=softcap,
    )
    if isinstance(answer, support.Refusal):
        raise answer.exception()
    scale = answer.head_dim ** (-0.5) if answer.softmax_scale is None else answer.softmax_scale
    left, right = answer.window if answer.window is not None else (-1, 0 if answer.causal else -1)
    if learnable_sink is not None:
        sinks.check_sink(learnable_sink, q.shape[1], q)
        out, softmax_lse = torch.ops.flash_attn_hopper.varlen_fwd_sink(
            q, k, v, learnable_sink, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, answer.max_seqlen_q,
            answer.max_seqlen_k, scale, answer.causal, left, right, deterministic,
            **ops.optional_args(softcap, num_splits),
        )
        if head_dim is not None:
            out = out[..., :head_dim]
        return (out, softmax_lse) if return_attn_probs else out
    if deterministic:
        ops.varlen_fwd_op()  # a clear error for a build without the op or with another schema
        fwd = getattr(torch.ops.flash_attn_hopper, ops.VARLEN_DETERMINISTIC_FWD_NAME)
    else:
        fwd = ops.varlen_fwd_op()
    group = q.shape[1] // k.shape[1]
    if packgqa.packs(pack_gqa, group, answer.max_seqlen_q, answer.causal, (left, right)):
        in_op = packgqa.unpacks_in_op(answer.max_seqlen_q, answer.batch, softcap, seqused_q, q, k, v)
        out, softmax_lse = fwd(
            packgqa.pack_rows(q, k.shape[1]), k, v, offsets.scaled(cu_seqlens_q, group), cu_seqlens_k,
            None if seqused_q is None else seqused_q * group, seqused_k, answer.max_seqlen_q * group,
            answer.max_seqlen_k, scale, False, -1, -1,
            **ops.optional_args(softcap, num_splits, group if in_op else 1),
        )
        if not in_op:
            out = packgqa.unpack_rows(out, group)
            softmax_lse = packgqa.unpack_lse(softmax_lse, group) if return_attn_probs else None
    else:
        out, softmax_lse = fwd(
            q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, answer.max_seqlen_q, answer.max_seqlen_k,
            scale, answer.causal, left, right, **ops.optional_args(softcap, num_splits),
        )
    if head_dim is not None:
        out = out[..., :head_dim]
    return (out, softmax_lse) if return_attn_probs else out
