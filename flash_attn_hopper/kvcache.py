"""``flash_attn_with_kvcache``: FlashAttention-3's decode / chunked-prefill entry point on our
variable-length kernels.

A contiguous cache (batch_cache, seqlen_cache, nheads_k, d) is read in place as the packed rows
of the varlen kernels: sequence b's keys are ``seqused_k`` = its valid length of rows from
e * seqlen_cache + leftpad_b, e = cache_batch_idx[b] (default b), so nothing is copied and nothing
is read on the host (a decode step can be captured in a CUDA graph). New keys and values are appended into the cache first
(in place, with rotary embedding applied to the new keys and to q), then the attention runs with
``num_splits`` (split-KV; 0 = choose) as ``flash_attn_varlen_func`` does.

New keys come as (batch, seqlen_new, nheads_k, d), or packed (total_new, nheads_k, d) with
``cu_seqlens_k_new``. A paged cache (``page_table``; paged.py) is read in place the same way, the
new tokens written to their pages; ``cache_batch_idx`` then picks page-table rows, and
``cache_leftpad`` moves each sequence's first key as in a contiguous cache. Not in this version
(refused, naming the argument): descales with 16-bit inputs, ``sm_margin``. FP8 q and caches
(float8_e4m3fn, contiguous or paged, with FA3's (batch, nheads_k) descales) run on the FP8 kernels
(fp8.py), appends and rotary included (rotated in float32, stored as e4m3). ``qv`` (MLA decode) runs on the qv
kernels over a contiguous or a paged cache (qv.py). No backward, as in
FlashAttention-3. ``attention_chunk`` runs as chunk segments of each sequence (chunked.py).

PackGQA (packgqa.py): where exact, the query heads of a KV head run as query rows of one head, so
each KV head's cache is read once; ``pack_gqa`` None packs at decode (one query per sequence), True
wherever exact, False never (the result is the same either way, up to the split plan).

``get_scheduler_metadata`` is FlashAttention-3's way to precompute a decode step's plan so that the
step can be captured in a CUDA graph. Here the plan (the split count) follows from the shapes
alone and nothing is read on the host, so there is nothing to precompute: it checks its arguments
and returns an empty int32 tensor, which ``flash_attn_with_kvcache`` accepts as
``scheduler_metadata`` (the plan is the same with or without it).
"""

from __future__ import annotations

import torch

from . import chunked, fp8, manifest, offsets, packgqa, paged, support
from . import qv as qv_calls


def _refuse_extras(**extras) -> None:
    for name, (value, default, why) in extras.items():
        if (value is not None) if default is None else (value != default):
            raise support.feature_refusal(name, f"{name}", why).exception()


def _as_lengths(x, batch: int, default: int, device, name: str, cap: int, clamp: bool = True) -> torch.Tensor:
    """int32 (batch,) lengths on the device (contents are never read on the host), clamped to
    [0, cap] unless clamp=False (where the kernels clamp them: seqused_k)."""
    if x is None or (isinstance(x, int) and not isinstance(x, bool)):
        return offsets.constant("full", batch, default if x is None else min(max(x, 0), cap), device)
    if not isinstance(x, torch.Tensor) or x.dtype != torch.int32 or x.shape != (batch,) or x.device != device:
        raise ValueError(f"{name} must be an int or an int32 tensor of shape ({batch},) on {device}")
    return x.clamp(0, cap) if clamp else x


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, interleaved: bool):
    """Rotary embedding of the first 2 * cos.shape[1] features of x (..., s, h, d) at positions (..., s):
    pairs (2i, 2i + 1) when interleaved, else (i, i + rotary_dim / 2) (GPT-NeoX)."""
    half = cos.shape[1]
    positions = positions.clamp(0, cos.shape[0] - 1).long()
    c = cos[positions].unsqueeze(-2).float()  # (..., s, 1, half)
    s = sin[positions].unsqueeze(-2).float()
    rot, rest = x[..., : 2 * half].float(), x[..., 2 * half :]
    if interleaved:
        a, b = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
    else:
        a, b = rot[..., :half], rot[..., half:]
        out = torch.cat([a * c - b * s, a * s + b * c], dim=-1)
    return torch.cat([out.to(x.dtype), rest], dim=-1)


def _append(caches, rows, seq: torch.Tensor, idx: torch.Tensor, first: torch.Tensor, starts: torch.Tensor,
            entry: torch.Tensor | None = None, page_table: torch.Tensor | None = None) -> None:
    """cache[seq_t, starts[seq_t] + idx_t] = rows[t] in place for each (cache, rows) pair, for the new
    tokens that fit: rows (T, nheads_k, d) are the new tokens, row t being number idx_t of sequence
    seq_t, whose tokens start at row first[seq_t]. With S the cache's length, a token goes to
    min(starts + idx, S - 1), and the ones that do not fit carry the value that lands there anyway
    (their sequence's last fitting token, or the slot's own value when none fits), so every write to
    one slot writes the same value. Slots and rows are clamped: whatever the index tensors hold,
    nothing lands or is read outside the tensors. The indices are computed once for all pairs.
    entry (cache_batch_idx, clamped): sequence b's cache entry, else b. page_table: a paged cache
    (num_pages, page_size, ...), position p of sequence b at row p % page_size of page
    page_table[b, p // page_size] (clamped to the cache); S is then the table's capacity."""
    page_size = caches[0].shape[1]
    seqlen_cache = page_size if page_table is None else page_table.shape[1] * page_size
    total = rows[0].shape[0]
    start = starts.long()[seq]
    src = torch.minimum(idx, seqlen_cache - 1 - start)  # the number of the token whose value goes to the slot
    slot = torch.clamp(start + src, 0, seqlen_cache - 1)
    src_row = torch.clamp(first.long()[seq] + src, 0, max(total - 1, 0))
    fits = (src >= 0)[:, None, None]
    if page_table is None:
        where = seq if entry is None else entry.long()[seq]
    else:
        where = page_table.long()[seq, slot // page_size].clamp(0, caches[0].shape[0] - 1)
        slot = slot % page_size
    for cache, new in zip(caches, rows):
        cache[where, slot] = torch.where(fits, new[src_row], cache[where, slot])


def _new_tokens(k, batch: int, cu_seqlens_k_new):
    """The new tokens as rows (T, nheads_k, d), each row's sequence and number in it, each
    sequence's first row, and the number of new tokens per sequence: from (batch, seqlen_new,
    nheads_k, d), or from packed (total_new, nheads_k, d) rows with cu_seqlens_k_new (batch + 1
    int32 offsets; contents are never read on the host)."""
    device = k.device
    if cu_seqlens_k_new is None:
        seqlen_new = k.shape[1]
        seq = torch.arange(batch, device=device).repeat_interleave(seqlen_new)
        idx = torch.arange(seqlen_new, device=device).repeat(batch)
        first = torch.arange(batch, device=device) * seqlen_new
        counts = offsets.constant("full", batch, seqlen_new, device)
        return k.reshape(batch * seqlen_new, *k.shape[2:]), seq, idx, first, counts
    cu = cu_seqlens_k_new.long()
    t = torch.arange(k.shape[0], device=device)
    seq = torch.searchsorted(cu[1:], t, right=True).clamp(max=batch - 1)
    idx = t - cu[seq]
    # Rows outside [cu[0], cu[-1]) belong to no sequence. They repeat the write of the first
    # sequence's first token (row cu[0]), or, with no token at all, write a slot's own value:
    # either way they agree with every other write to their slot.
    seq0 = torch.searchsorted(cu[1:], cu[:1], right=True).clamp(max=batch - 1)
    outside = (t < cu[0]) | (t >= cu[-1])
    seq = torch.where(outside, seq0, seq)
    idx = torch.where(outside, torch.where(cu[-1] > cu[0], 0, -(2**40)), idx)
    counts = (cu[1:] - cu[:-1]).clamp(min=0).to(torch.int32)
    return k, seq, idx, cu[:-1], counts


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    qv=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    page_table=None,
    cu_seqlens_q=None,
    cu_seqlens_k_new=None,
    max_seqlen_q=None,
    rotary_seqlens=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    rotary_interleaved=True,
    scheduler_metadata=None,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
    return_softmax_lse=False,
    learnable_sink=None,
):
    """Attention of q over a KV cache, after appending k / v to it in place (FlashAttention-3's
    signature and semantics; see the module docstring for what this version refuses).

    Arguments:
        q: (batch, seqlen_q, nheads, d), or (total_q, nheads, d) with cu_seqlens_q (int32 (batch + 1,))
            and max_seqlen_q.
        k_cache, v_cache: (batch, seqlen_cache, nheads_k, d), fp16/bf16 like q; rows of one batch entry
            consecutive (batch stride = seqlen_cache x row stride) so the cache is read in place.
        k, v: optional (batch, seqlen_new, nheads_k, d), or (total_new, nheads_k, d) with
            cu_seqlens_k_new (int32 (batch + 1,) offsets of each sequence's new tokens): written into
            the cache at cache_seqlens
            (tokens past the cache's end are dropped) before the attention, which then covers them.
        rotary_cos, rotary_sin: optional (seqlen_ro, rotary_dim / 2): rotary embedding of the new keys
            at positions rotary_seqlens + i (default cache_seqlens + i) and of q at the same positions
            when causal or local, else at rotary_seqlens for every query; rotary_interleaved picks
            pairs (2i, 2i + 1) or (i, i + rotary_dim / 2).
        cache_seqlens: int or int32 (batch,): the cache's filled length per sequence (default: full).
        cache_leftpad: int32 (batch,): the first valid cache row per sequence (default 0).
        cache_batch_idx: int32 (batch,): the cache entry each sequence reads (and appends to),
            clamped to the cache; default b. Entries may repeat when nothing is appended (with
            new keys, two sequences appending to one entry race, as in FlashAttention-3).
        softmax_scale, causal, window_size, softcap: as flash_attn_func, with the diagonal at the end
            of each sequence's valid keys.
        num_splits: split-KV: 0 (default) choose, 1 none, n at most n.
        pack_gqa: None (default) choose, True / False: see the module docstring.
        return_softmax_lse: also return the LSE, (batch, nheads, seqlen_q) float32
            ((nheads, total_q) with cu_seqlens_q).
        learnable_sink: None, or a (nheads,) logit per head in every row's softmax denominator, as in
            flash_attn_func (gpt-oss; FlashAttention-4's argument, not FlashAttention-3's).

    Returns:
        out like q, and softmax_lse when return_softmax_lse.
    """
    is_fp8 = fp8.is_fp8(q, k_cache, v_cache, k, v)  # FP8 (fp8.py): descales per sequence
    for name, value in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if value is not None and not is_fp8:
            raise ValueError(f"flash_attn_hopper: {name} applies to FP8 (float8_e4m3fn) inputs only; pass q and the "
                             "caches in torch.float8_e4m3fn with it, or no descale tensors")
    _refuse_extras(sm_margin=(sm_margin, 0, "The kernels use every SM; pass sm_margin=0."))
    support.check_attention_chunk(attention_chunk)
    packgqa.check_pack_gqa(pack_gqa)
    from .interface import flash_attn_varlen_func  # the varlen path (interface imports this module's siblings)

    if scheduler_metadata is not None and not (isinstance(scheduler_metadata, torch.Tensor)
                                               and scheduler_metadata.dtype == torch.int32):
        raise TypeError("scheduler_metadata must be None or get_scheduler_metadata's int32 tensor")

    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if qv is not None:  # FA3's MLA decode query (qv.py): rows like q's, on the varlen qv kernels
        if not isinstance(qv, torch.Tensor) or qv.dim() != q.dim() or qv.shape[:-1] != q.shape[:-1]:
            raise ValueError("qv must be a tensor shaped like q with v's head dim")
    if page_table is not None:
        # qv (MLA decode): v's cache as wide as the qv kernels take.
        widest = manifest.MAX_HEAD_DIM if qv is None else qv_calls.MAX_HEAD_DIM_V
        refusal = paged.cache_refusal(k_cache, v_cache, page_table, q, max_width=widest)
        if refusal is not None:
            raise refusal.exception()
    elif k_cache.dim() != 4 or v_cache.dim() != 4 or v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(f"k_cache and v_cache must be (batch, seqlen_cache, nheads_k, d) and (..., dv), got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    batch_cache, seqlen_cache, heads_k, d = k_cache.shape
    dv = v_cache.shape[-1]  # v's head dim: d, or (FA3's dv != d) its own
    if page_table is not None:  # a sequence's capacity: its row of pages
        batch_cache, seqlen_cache = page_table.shape[0], page_table.shape[1] * k_cache.shape[1]
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)) if page_table is None else ():
        if cache.stride(-1) != 1 or (batch_cache > 1 and cache.stride(0) != seqlen_cache * cache.stride(1)):
            raise ValueError(
                f"{name} must keep each batch entry's rows consecutive (batch stride = seqlen_cache x row stride, "
                "last dimension contiguous), as a (batch, seqlen, nheads, d) allocation does; other layouts "
                "(e.g. heads before seqlen) are not in this version"
            )
    varlen_q = cu_seqlens_q is not None
    if varlen_q:
        if q.dim() != 3 or max_seqlen_q is None:
            raise ValueError("with cu_seqlens_q, q must be (total_q, nheads, d) and max_seqlen_q given")
        batch = cu_seqlens_q.shape[0] - 1
        seqlen_q = max_seqlen_q
    else:
        if q.dim() != 4:
            raise ValueError(f"q must be (batch, seqlen_q, nheads, d), got shape {tuple(q.shape)}")
        batch, seqlen_q = q.shape[:2]
    if cache_batch_idx is None:
        if batch != batch_cache:
            raise ValueError(f"q has {batch} sequences but the cache {batch_cache}: pass cache_batch_idx to pick entries")
        entry = None
    else:
        if not isinstance(cache_batch_idx, torch.Tensor) or cache_batch_idx.dtype != torch.int32 \
                or cache_batch_idx.shape != (batch,) or cache_batch_idx.device != k_cache.device:
            raise ValueError(f"cache_batch_idx must be an int32 tensor of shape ({batch},) on {k_cache.device}")
        entry = cache_batch_idx.clamp(0, batch_cache - 1)  # contents are never read on the host
        if page_table is not None:  # a paged cache's entry is its page-table row (FA3's test: page_table[idx])
            page_table, entry = page_table.index_select(0, entry), None
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                       for t in (q, k_cache, v_cache, k, v)):
        raise RuntimeError("flash_attn_with_kvcache has no backward (as FlashAttention-3): call it under "
                           "torch.no_grad() / torch.inference_mode() or on tensors that do not require grad")
    if (k is None) != (v is None):
        raise ValueError("pass both k and v, or neither")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("pass both rotary_cos and rotary_sin, or neither")
    device = k_cache.device
    # Without appends or left padding the lengths go to the kernels as they are (seqused_k, which
    # they clamp to the cache): a decode step launches nothing but the attention.
    plain = k is None and cache_leftpad is None
    seqlens = _as_lengths(cache_seqlens, batch, seqlen_cache, device, "cache_seqlens", seqlen_cache, clamp=not plain)
    leftpad = None if cache_leftpad is None else \
        _as_lengths(cache_leftpad, batch, 0, device, "cache_leftpad", seqlen_cache)

    if k is not None:
        if cu_seqlens_k_new is None:
            if k.dim() != 4 or k.shape[0] != batch or k.shape[2:] != (heads_k, d) \
                    or v.shape != (*k.shape[:3], dv):
                raise ValueError(f"k and v must be (batch, seqlen_new, nheads_k, d) = ({batch}, seqlen_new, {heads_k}, "
                                 f"{d}) and (..., {dv}), or (total_new, nheads_k, d) with cu_seqlens_k_new")
        else:
            if k.dim() != 3 or k.shape[1:] != (heads_k, d) or v.shape != (*k.shape[:2], dv):
                raise ValueError(f"with cu_seqlens_k_new, k and v must be (total_new, nheads_k, d) = (total_new, "
                                 f"{heads_k}, {d})")
            if not isinstance(cu_seqlens_k_new, torch.Tensor) or cu_seqlens_k_new.dtype != torch.int32 \
                    or cu_seqlens_k_new.shape != (batch + 1,) or cu_seqlens_k_new.device != device:
                raise ValueError(f"cu_seqlens_k_new must be an int32 tensor of shape ({batch + 1},) on {device}")
        if k.dtype != k_cache.dtype or v.dtype != v_cache.dtype:
            raise ValueError("k and v must have the cache's dtype")
        k_rows, new_seq, new_idx, new_first, new_counts = _new_tokens(k, batch, cu_seqlens_k_new)
        v_rows = v.reshape(*k_rows.shape[:2], dv)
    elif cu_seqlens_k_new is not None:
        raise ValueError("cu_seqlens_k_new describes new keys: pass k and v with it")
    if rotary_cos is not None:
        if k is None:
            raise ValueError("rotary_cos / rotary_sin apply to the new keys: pass k and v with them")
        rotary_dim = 2 * rotary_cos.shape[-1]
        if rotary_cos.dim() != 2 or rotary_sin.shape != rotary_cos.shape or rotary_dim > d or rotary_dim % 16:
            raise ValueError(f"rotary_cos / rotary_sin must be (seqlen_ro, rotary_dim / 2) with rotary_dim a multiple "
                             f"of 16 and at most d = {d}; got {tuple(rotary_cos.shape)}")
        rotary_from = _as_lengths(rotary_seqlens, batch, 0, device, "rotary_seqlens", 2**30) \
            if rotary_seqlens is not None else seqlens
        new_pos = rotary_from.long()[new_seq] + new_idx.clamp(min=0)
        k_rows = _rotate(k_rows.unsqueeze(0), rotary_cos, rotary_sin, new_pos.unsqueeze(0), rotary_interleaved)[0]
        local = causal or tuple(window_size) != (-1, -1)
        if varlen_q:
            starts = cu_seqlens_q[:-1].long()
            seq_of_row = torch.searchsorted(cu_seqlens_q[1:].long(), torch.arange(q.shape[0], device=device),
                                            right=True).clamp(max=batch - 1)
            q_pos = rotary_from.long()[seq_of_row] + ((torch.arange(q.shape[0], device=device) - starts[seq_of_row])
                                                  if local else 0)
            q = _rotate(q.unsqueeze(0), rotary_cos, rotary_sin, q_pos.unsqueeze(0), rotary_interleaved)[0]
        else:
            q_pos = rotary_from.long().unsqueeze(1) + (torch.arange(seqlen_q, device=device) if local else 0)
            q = _rotate(q, rotary_cos, rotary_sin, q_pos.expand(batch, seqlen_q), rotary_interleaved)
    if k is not None:
        # FP8 rows move as bytes (torch.where has no float8 kernel).
        as_bytes = (lambda t: t.view(torch.uint8)) if is_fp8 else (lambda t: t)
        _append((as_bytes(k_cache), as_bytes(v_cache)), (as_bytes(k_rows), as_bytes(v_rows)), new_seq, new_idx,
                new_first, seqlens, entry, page_table)
        seqlens = torch.clamp(seqlens + new_counts, max=seqlen_cache)

    # Sequence b's valid keys are seqused_k[b] from cu_k[b]: rows of the cache as one packed tensor,
    # from entry_b * seqlen_cache + leftpad_b, or (paged) positions of its page-table row from
    # leftpad_b. The kernels read seqused_k as the length from that offset, at most max_seqlen_k =
    # seqlen_cache, so an entry (a row of pages) is never read past its end.
    if page_table is not None:
        total_k = seqlen_cache
        rows = offsets.constant("full", batch + 1, 0, device)
    else:
        total_k = batch_cache * seqlen_cache
        rows = offsets.constant("steps", batch + 1, seqlen_cache, device) if entry is None else \
            torch.cat([entry * seqlen_cache, offsets.constant("full", 1, total_k, device)])
    if leftpad is None:
        cu_k, used_k = rows, seqlens
    else:
        cu_k = torch.cat([rows[:-1] + torch.minimum(leftpad, seqlens), rows[-1:]])
        used_k = torch.clamp(seqlens - leftpad, min=0)
    q_rows, cu_q = _query_rows(q, cu_seqlens_q, batch, seqlen_q)
    max_k = seqlen_cache
    if attention_chunk:
        # Each sequence's keys, kept inside its cache entry (the lengths may come unclamped).
        k_len = used_k.clamp(0, seqlen_cache) if leftpad is None else used_k.clamp(min=0).minimum(seqlen_cache - leftpad)
        q_lens = cu_q[1:] - cu_q[:-1]
        cu_q, cu_k, used_k, _ = chunked.segments(cu_q[:-1], q_lens, cu_k[:-1], k_len, attention_chunk, seqlen_q,
                                                 q_rows.shape[0], total_k)
        max_k = min(attention_chunk, seqlen_cache)
        if is_fp8:  # each chunk segment takes its sequence's descales
            q_descale, k_descale, v_descale = (None if t is None else t.repeat_interleave(
                -(-seqlen_q // attention_chunk) + 2, dim=0) for t in (q_descale, k_descale, v_descale))
        if page_table is not None:  # each chunk segment reads its sequence's row of pages
            page_table = page_table.repeat_interleave(-(-seqlen_q // attention_chunk) + 2, dim=0)
    qv_rows = None if qv is None else _query_rows(qv, cu_seqlens_q, batch, seqlen_q)[0]
    if page_table is not None and is_fp8:
        result = fp8.paged(q_rows, k_cache, v_cache, page_table, cu_q, cu_k, seqlen_q, max_k, used_k, q_descale,
                           k_descale, v_descale, softmax_scale, causal, window_size, learnable_sink, return_softmax_lse,
                           softcap=softcap, qv=qv_rows, num_splits=num_splits, pack_gqa=pack_gqa)
        return _caller_layout(result, return_softmax_lse, varlen_q, batch, seqlen_q)
    if page_table is not None and qv is not None:
        result = qv_calls.paged(q_rows, k_cache, v_cache, qv_rows, page_table, cu_q, cu_k, seqlen_q, max_k, used_k,
                                softmax_scale, causal, window_size, softcap, learnable_sink, return_softmax_lse,
                                pack_gqa, num_splits)
        return _caller_layout(result, return_softmax_lse, varlen_q, batch, seqlen_q)
    if page_table is not None:
        result = paged.varlen_paged(q_rows, k_cache, v_cache, page_table, cu_q, cu_k, seqlen_q, max_k, used_k,
                                    softmax_scale, causal, window_size, softcap, num_splits, pack_gqa,
                                    return_softmax_lse, learnable_sink)
        return _caller_layout(result, return_softmax_lse, varlen_q, batch, seqlen_q)
    k_rows = k_cache.view(batch_cache * seqlen_cache, heads_k, d)
    v_rows = v_cache.view(batch_cache * seqlen_cache, heads_k, dv)
    result = flash_attn_varlen_func(  # PackGQA happens there (packgqa.py); FP8 goes to fp8.py
        q_rows, k_rows, v_rows, cu_q, cu_k, seqlen_q, max_k, seqused_k=used_k, qv=qv_rows,
        softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
        num_splits=num_splits, pack_gqa=pack_gqa, return_attn_probs=return_softmax_lse, learnable_sink=learnable_sink,
        **({"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale} if is_fp8 else {}),
    )
    return _caller_layout(result, return_softmax_lse, varlen_q, batch, seqlen_q)


def _query_rows(q, cu_seqlens_q, batch: int, seqlen_q: int):
    """q as the varlen kernels' packed rows and their offsets: (total_q, nheads, d) with cu_seqlens_q
    as given, or (batch, seqlen_q, nheads, d) flattened with constant offsets."""
    if cu_seqlens_q is not None:
        return q, cu_seqlens_q
    return q.reshape(batch * seqlen_q, *q.shape[2:]), offsets.constant("steps", batch + 1, seqlen_q, q.device)


def _caller_layout(result, return_lse: bool, varlen_q: bool, batch: int, seqlen_q: int):
    """The varlen call's out (and LSE) in the caller's layout: (batch, seqlen_q, ...) and (batch,
    nheads, seqlen_q) for a (batch, seqlen_q, ...) q, as they are for a packed one."""
    out, lse = result if return_lse else (result, None)
    if not varlen_q:
        out = out.view(batch, seqlen_q, *out.shape[1:])
        if lse is not None:
            lse = lse.view(lse.shape[0], batch, seqlen_q).transpose(0, 1).contiguous()
    return (out, lse) if return_lse else out


def get_scheduler_metadata(
    batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
    cache_seqlens: torch.Tensor,
    qkv_dtype=torch.bfloat16,
    headdim_v=None,
    cu_seqlens_q=None,
    cu_seqlens_k_new=None,
    cache_leftpad=None,
    page_size=None,
    max_seqlen_k_new=0,
    causal=False,
    window_size=(-1, -1),
    attention_chunk=0,
    has_softcap=False,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
):
    """FlashAttention-3's plan precomputation for flash_attn_with_kvcache (see the module docstring):
    the arguments are checked as that call would check them, and the plan, which depends on shapes
    only, needs no tensor: returns an empty int32 tensor on cache_seqlens' device."""
    _refuse_extras(sm_margin=(sm_margin, 0, "The kernels use every SM; pass sm_margin=0."))
    if page_size is not None and (isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1):
        raise ValueError(f"page_size must be None or an int >= 1, got {page_size!r}")
    support.check_attention_chunk(attention_chunk)
    if cu_seqlens_k_new is not None and not (isinstance(cu_seqlens_k_new, torch.Tensor)
                                             and cu_seqlens_k_new.dtype == torch.int32
                                             and tuple(cu_seqlens_k_new.shape) == (batch_size + 1,)):
        raise ValueError(f"cu_seqlens_k_new must be None or an int32 tensor of shape ({batch_size + 1},)")
    if headdim_v is not None and (isinstance(headdim_v, bool) or not isinstance(headdim_v, int) or headdim_v <= 0):
        raise ValueError(f"headdim_v must be None or a positive int, got {headdim_v!r}")
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32 \
            or tuple(cache_seqlens.shape) != (batch_size,):
        raise ValueError(f"cache_seqlens must be an int32 tensor of shape ({batch_size},)")
    support.check_num_splits(num_splits)
    if num_heads_kv <= 0 or num_heads_q % num_heads_kv:
        raise ValueError(f"num_heads_q ({num_heads_q}) must be a multiple of num_heads_kv ({num_heads_kv})")
    return torch.empty(0, dtype=torch.int32, device=cache_seqlens.device)
