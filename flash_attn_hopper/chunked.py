"""FA3's attention_chunk (chunked local attention, Llama 4) as variable-length segments.

Query i of a sequence sits at key position ``K - Q + i`` (bottom-right) and sees only the keys of
its chunk of ``chunk`` keys, with causal / window on top. Each (sequence, key chunk) is one segment
of the packed rows whose queries and keys end at the same position, so the segment's own
bottom-right diagonal is the problem's and the varlen kernels run it unchanged (decision 055).
The segments are made here on the device from the sequences' offsets and lengths: nothing is read
on the host, so a CUDA-graph capture and torch.compile keep working.
"""
from __future__ import annotations

import torch

from . import support


def segments(q_starts, q_lens, k_starts, k_lens, chunk: int, max_q: int, total_q: int, total_k: int):
    """The chunk segments of sequences whose queries are rows q_starts[b] : + q_lens[b] and keys
    k_starts[b] : + k_lens[b]. Per sequence: one segment for the queries before key 0 (no keys),
    then ceil(max_q / chunk) + 1 chunk segments, enough for any sequence's queries (those past a
    sequence's queries are empty). Returns cu_q, cu_k (int32, segments + 1; the last entries
    total_q / total_k), used_k and used_q (int32, per segment: its keys from cu_k, its queries
    from cu_q; a sequence's last segment reaches to the next sequence's first row)."""
    n = -(-max_q // chunk) + 1
    q_len, k_len = q_lens.long(), k_lens.long()
    first = k_len - q_len  # the position of query 0
    blind = (-first).clamp(min=0).minimum(q_len)  # queries before key 0
    c_start = (first.clamp(min=0) // chunk)[:, None] * chunk + torch.arange(n, device=q_len.device) * chunk
    k_lo, k_hi = c_start.minimum(k_len[:, None]), (c_start + chunk).minimum(k_len[:, None])
    q_hi = (k_hi - first[:, None]).clamp(min=0).minimum(q_len[:, None]).maximum(blind[:, None])
    q_lo = torch.cat([blind[:, None], q_hi[:, :-1]], dim=1)
    zeros = torch.zeros_like(blind)[:, None]
    seg_q = q_starts.long()[:, None] + torch.cat([zeros, q_lo], dim=1)  # (batch, n + 1) segment starts
    seg_k = k_starts.long()[:, None] + torch.cat([zeros, k_lo], dim=1)
    used_k = torch.cat([zeros, k_hi - k_lo], dim=1)
    used_q = torch.cat([blind[:, None], q_hi - q_lo], dim=1)
    end_q = seg_q.new_full((1,), total_q)
    end_k = seg_k.new_full((1,), total_k)
    return (torch.cat([seg_q.flatten(), end_q]).int(), torch.cat([seg_k.flatten(), end_k]).int(),
            used_k.flatten().int(), used_q.flatten().int())


def varlen(varlen_fn, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, seqused_q,
           seqused_k, chunk: int, **kwargs):
    """flash_attn_varlen_func (varlen_fn) with attention_chunk: the same call over the chunk segments
    of every sequence. out and lse come back in the packed rows' order, so nothing is copied back;
    gradients flow through the inner call."""
    support.check_attention_chunk(chunk)
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a 3-D tensor (total, nheads, headdim) in flash_attn_varlen_func")
    for name, n in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"{name} must be a non-negative int, got {n!r}")
    for name, t, rows in (("cu_seqlens_q", cu_seqlens_q, None), ("cu_seqlens_k", cu_seqlens_k, None),
                          ("seqused_q", seqused_q, 0), ("seqused_k", seqused_k, 0)):
        if t is None and rows == 0:
            continue
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 or t.device != q.device:
            raise ValueError(f"{name} must be a 1-D int32 tensor on q's device with attention_chunk")
    batch = cu_seqlens_q.numel() - 1
    if batch < 0 or cu_seqlens_k.numel() != batch + 1 or any(
            t is not None and t.numel() != batch for t in (seqused_q, seqused_k)):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must both be (batch + 1,), seqused_q / seqused_k (batch,)")
    q_lens = seqused_q if seqused_q is not None else cu_seqlens_q[1:] - cu_seqlens_q[:-1]
    k_lens = seqused_k if seqused_k is not None else cu_seqlens_k[1:] - cu_seqlens_k[:-1]
    cu_q, cu_k, used_k, used_q = segments(cu_seqlens_q[:-1], q_lens, cu_seqlens_k[:-1], k_lens, chunk,
                                          max_seqlen_q, q.shape[0], k.shape[0])
    return varlen_fn(q, k, v, cu_q, cu_k, max_seqlen_q, min(chunk, max_seqlen_k),
                     seqused_q=None if seqused_q is None else used_q, seqused_k=used_k, **kwargs)
