"""PackGQA as rows: the query heads that share a KV head run as query rows of one head.

Where every query of a sequence sees the same keys (no causal/local mask; or one query per
sequence under a plain causal mask, whose single query, at the end of the keys, sees them all),
the ``group = nheads / nheads_k`` query heads of KV head ``hk`` are exactly ``group`` more query
rows of one head: row ``t`` of query head ``hk * group + j`` becomes row ``t * group + j`` of head
``hk``, with no mask. Each KV head is then read once instead of once per query head, and one
query tile carries the group's rows instead of one row per head (decode). The rows are a copy of
q (small where it applies: few queries); out and the LSE are permuted back. FlashAttention-3
packs inside its kernels, which also covers causal chunks of several queries; this covers decode
and non-causal calls without a kernel change (decision 059).
"""

from __future__ import annotations

import torch

from . import offsets, ops


def check_pack_gqa(pack_gqa) -> None:
    if pack_gqa is not None and not isinstance(pack_gqa, bool):
        raise TypeError(f"pack_gqa must be None, True or False, got {pack_gqa!r}")


def packs(pack_gqa, group: int, seqlen_q: int, causal: bool, window_size) -> bool:
    """Whether ``group`` query heads per KV head run as rows of one head: never with pack_gqa=False
    or no group; only where it is exact (above); pack_gqa=None at decode (seqlen_q <= 1), where one
    row per head would leave a tile nearly empty and the copies are a few KB."""
    if group <= 1 or pack_gqa is False:
        return False
    left, right = window_size
    same_keys = (not causal and (left, right) == (-1, -1)) or (seqlen_q <= 1 and (left, right) in ((-1, -1), (-1, 0)))
    return same_keys and (bool(pack_gqa) or seqlen_q <= 1)


#: The split kernels' grid holds batch x splits <= 65535 entries (csrc/api/split.h), two splits each here.
_MAX_IN_OP_BATCH = 65535 // 2


def unpacks_in_op(seqlen_q: int, batch: int, softcap, seqused_q, *tensors) -> bool:
    """Whether the op itself returns out and the LSE per query head (its pack_gqa argument), so that
    no copy unpacks them: at decode (one query per sequence), where the split-KV combine writes the
    rows (not with softcap, whose kernels do not split, nor seqused_q), and without gradients."""
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    return (seqlen_q <= 1 and batch <= _MAX_IN_OP_BATCH and not softcap and seqused_q is None
            and not needs_grad)


def pack_rows(q: torch.Tensor, heads_k: int) -> torch.Tensor:
    """(rows, nheads, d) -> (rows * group, nheads_k, d): row t of head hk * group + j -> row t * group + j."""
    rows, heads, d = q.shape
    group = heads // heads_k
    return q.reshape(rows, heads_k, group, d).transpose(1, 2).reshape(rows * group, heads_k, d)


def unpack_rows(out: torch.Tensor, group: int) -> torch.Tensor:
    """pack_rows' inverse on the output: (rows * group, nheads_k, dv) -> (rows, nheads, dv)."""
    packed_rows, heads_k, dv = out.shape
    rows = packed_rows // group
    return out.reshape(rows, group, heads_k, dv).transpose(1, 2).reshape(rows, heads_k * group, dv)


def unpack_lse(lse: torch.Tensor, group: int) -> torch.Tensor:
    """The LSE of packed rows back per query head: (..., nheads_k, rows * group) -> (..., nheads, rows)."""
    *lead, heads_k, packed_rows = lse.shape
    rows = packed_rows // group
    return lse.reshape(*lead, heads_k, rows, group).transpose(-1, -2).reshape(*lead, heads_k * group, rows)


def call_packed(call, q, heads_k: int, cu_seqlens_q, max_seqlen_q: int, causal: bool, left: int, right: int,
                softcap, learnable_sink, seqused_q, num_splits, pack_gqa, return_lse: bool):
    """call(q_rows, cu_seqlens_q, max_seqlen_q, causal, left, right, **kwargs) -> (out, lse) of a
    varlen / paged forward op, kwargs its num_splits and pack_gqa (ops.optional_args). Where packs()
    says it is exact (and with no sink, per query head, nor seqused_q), q's heads of a KV head go as
    rows: unpacked by the op's combine at decode (unpacks_in_op), else here. 1-byte (FP8) rows are
    moved as bytes."""
    group = q.shape[1] // heads_k
    if (seqused_q is None and learnable_sink is None
            and packs(pack_gqa, group, max_seqlen_q, causal, (left, right))):
        in_op = unpacks_in_op(max_seqlen_q, cu_seqlens_q.shape[0] - 1, softcap, None)
        rows = (pack_rows(q.view(torch.uint8), heads_k).view(q.dtype) if q.element_size() == 1
                else pack_rows(q, heads_k))
        out, lse = call(rows, offsets.scaled(cu_seqlens_q, group), max_seqlen_q * group, False, -1, -1,
                        **ops.optional_args(0, num_splits, group if in_op else 1))
        if not in_op:
            out = unpack_rows(out, group)
            lse = unpack_lse(lse, group) if return_lse else None
        return out, lse
    return call(q, cu_seqlens_q, max_seqlen_q, causal, left, right, **ops.optional_args(0, num_splits))
