"""flash_attn_with_kvcache on CPU over the emulated varlen ops: appending k / v in place (clamped at
the cache's end), rotary embedding of the new keys and of q (interleaved and GPT-NeoX; per position
when causal/local, one position otherwise), cache_seqlens as int or tensor, cache_leftpad, GQA,
causal / window / softcap, varlen q, against a float32 reference written from FlashAttention-3's
docstring; what reaches the op (the cache read in place, num_splits); refusals. The kernels' own
numbers are tests/test_kvcache_gpu.py's."""
from __future__ import annotations

import math

import pytest
import torch

import flash_attn_hopper
from flash_attn_hopper.kvcache import _append, _new_tokens, _rotate

from op_emulator import emulated_varlen_ops
from reference import assert_fa_close, attention_ref, attention_ref_chunked

DTYPE = torch.float16


def rotary_ref(x, cos, sin, positions, interleaved):
    """Rotary embedding the plain way: each pair rotated by its angle, position by position."""
    out = x.clone().float()
    half = cos.shape[1]
    for idx in torch.cartesian_prod(*[torch.arange(n) for n in positions.shape]) if positions.dim() > 1 else \
            [torch.tensor([i]) for i in range(positions.shape[0])]:
        idx = tuple(idx.tolist())
        p = int(positions[idx])
        for i in range(half):
            a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
            xa, xb = x[idx][..., a].float(), x[idx][..., b].float()
            out[idx][..., a] = xa * cos[p, i] - xb * sin[p, i]
            out[idx][..., b] = xa * sin[p, i] + xb * cos[p, i]
    return out.to(x.dtype)


@pytest.mark.parametrize("interleaved", [True, False])
def test_rotary_matches_the_plain_rotation(interleaved):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, 32, generator=g).to(DTYPE)
    angle = torch.rand(10, 8, generator=g) * 2 * math.pi
    cos, sin = angle.cos(), angle.sin()
    pos = torch.tensor([[1, 2, 3], [7, 8, 9]])
    got = _rotate(x, cos, sin, pos, interleaved)
    want = rotary_ref(x, cos, sin, pos, interleaved)
    assert torch.allclose(got.float(), want.float(), atol=2e-3)
    assert torch.equal(got[..., 16:], x[..., 16:])  # past rotary_dim: untouched


def test_append_writes_in_place_and_drops_what_does_not_fit():
    cache = torch.zeros(3, 6, 1, 2)
    new = torch.arange(1, 3 * 4 * 2 + 1, dtype=torch.float32).view(3, 4, 1, 2)
    rows, seq, idx, first, counts = _new_tokens(new, 3, None)
    assert counts.tolist() == [4, 4, 4]
    _append((cache,), (rows,), seq, idx, first, torch.tensor([1, 4, 6], dtype=torch.int32))
    assert torch.equal(cache[0, 1:5], new[0]) and torch.equal(cache[0, 5], torch.zeros(1, 2))
    assert torch.equal(cache[1, 4:6], new[1, :2]) and torch.equal(cache[1, :4], torch.zeros(4, 1, 2))
    assert torch.equal(cache[2], torch.zeros(6, 1, 2))  # a full cache: nothing written


def reference(q, k_cache, v_cache, seqlens, leftpad, **kwargs):
    """Per sequence b: q[b] over cache rows [leftpad_b, seqlens_b) by tests/reference.py."""
    outs, lses = [], []
    for b in range(q.shape[0]):
        lo, hi = int(leftpad[b]), int(seqlens[b])
        o, l = attention_ref(q[b:b + 1], k_cache[b:b + 1, lo:hi], v_cache[b:b + 1, lo:hi], **kwargs)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs), torch.cat(lses)


CASES = [
    # seqlen_q, seqlen_new, causal, window, rotary (dim, interleaved), leftpad, hq, hk
    (1, 1, True, (-1, -1), (32, True), False, 8, 2),  # decode with rotary
    (3, 3, True, (-1, -1), (64, False), True, 4, 4),  # speculative tokens, NeoX rotary, leftpad
    (2, 0, False, (-1, -1), None, False, 6, 1),  # no new keys: attention over the cache as it is
    (4, 4, False, (-1, -1), (16, True), False, 4, 2),  # not causal: q rotated at one position
    (5, 2, True, (6, 0), None, True, 4, 2),  # a window
]


@pytest.mark.parametrize("sq, snew, causal, window, rotary, leftpad, hq, hk", CASES)
def test_against_the_reference(monkeypatch, sq, snew, causal, window, rotary, leftpad, hq, hk):
    g = torch.Generator().manual_seed(sq * 10 + snew)
    batch, cache_len, d = 3, 40, 64
    q = torch.randn(batch, sq, hq, d, generator=g).to(DTYPE)
    k_cache = torch.randn(batch, cache_len, hk, d, generator=g).to(DTYPE)
    v_cache = torch.randn(batch, cache_len, hk, d, generator=g).to(DTYPE)
    k = torch.randn(batch, snew, hk, d, generator=g).to(DTYPE) if snew else None
    v = torch.randn(batch, snew, hk, d, generator=g).to(DTYPE) if snew else None
    seqlens = torch.tensor([10, 25, 38], dtype=torch.int32)
    pad = torch.tensor([0, 7, 3], dtype=torch.int32) if leftpad else None
    cos = sin = None
    if rotary is not None:
        angle = torch.rand(cache_len + 8, rotary[0] // 2, generator=g) * 2 * math.pi
        cos, sin = angle.cos().to(DTYPE), angle.sin().to(DTYPE)
    k_ref_cache, v_ref_cache = k_cache.clone(), v_cache.clone()
    q_ref = q
    if k is not None:
        new_pos = seqlens.long()[:, None] + torch.arange(snew)
        k_rot = rotary_ref(k, cos, sin, new_pos, rotary[1]) if rotary else k
        for b in range(batch):
            n = min(snew, cache_len - int(seqlens[b]))
            k_ref_cache[b, int(seqlens[b]):int(seqlens[b]) + n] = k_rot[b, :n]
            v_ref_cache[b, int(seqlens[b]):int(seqlens[b]) + n] = v[b, :n]
        if rotary:
            local = causal or window != (-1, -1)
            q_pos = seqlens.long()[:, None] + (torch.arange(sq) if local else torch.zeros(sq, dtype=torch.long))
            q_ref = rotary_ref(q, cos, sin, q_pos, rotary[1])
    ends = torch.clamp(seqlens + snew, max=cache_len)
    with emulated_varlen_ops(monkeypatch) as (fwd, _):
        out, lse = flash_attn_hopper.flash_attn_with_kvcache(
            q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens, cache_leftpad=pad,
            causal=causal, window_size=window, rotary_interleaved=rotary[1] if rotary else True,
            return_softmax_lse=True,
        )
    assert torch.equal(k_cache, k_ref_cache) and torch.equal(v_cache, v_ref_cache), "the append differs"
    lo = pad if pad is not None else torch.zeros(batch, dtype=torch.int32)
    ref, lse_ref = reference(q_ref, k_ref_cache, v_ref_cache, ends, lo, causal=causal, window_size=window)
    low, lse_low = reference(q_ref, k_ref_cache, v_ref_cache, ends, lo, causal=causal, window_size=window,
                             upcast=False)
    assert out.shape == q.shape and lse.shape == (batch, hq, sq)
    assert_fa_close(out, ref, low, name="out")
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite)
    assert_fa_close(lse[finite], lse_ref[finite], lse_low[finite], name="lse", atol=1e-4)
    (call,) = fwd.calls
    assert call["k"].data_ptr() == k_cache.data_ptr(), "the cache was copied on its way to the kernel"
    assert call["num_splits"] == 0  # FA3's default for this function: choose


def test_varlen_q_softcap_and_an_int_cache_seqlens(monkeypatch):
    g = torch.Generator().manual_seed(3)
    batch, cache_len, hq, hk, d = 2, 30, 4, 2, 64
    lens_q = [2, 3]
    cu_q = torch.tensor([0, 2, 5], dtype=torch.int32)
    q = torch.randn(5, hq, d, generator=g).to(DTYPE)
    k_cache = torch.randn(batch, cache_len, hk, d, generator=g).to(DTYPE)
    v_cache = torch.randn(batch, cache_len, hk, d, generator=g).to(DTYPE)
    with emulated_varlen_ops(monkeypatch):
        out = flash_attn_hopper.flash_attn_with_kvcache(q * 3, k_cache, v_cache, cache_seqlens=20, cu_seqlens_q=cu_q,
                                                       max_seqlen_q=3, causal=True, softcap=5.0, num_splits=1)
    for b, (start, n) in enumerate([(0, 2), (2, 3)]):
        ref, _ = attention_ref((q * 3)[start:start + n][None], k_cache[b:b + 1, :20], v_cache[b:b + 1, :20],
                               causal=True, softcap=5.0)
        low, _ = attention_ref((q * 3)[start:start + n][None], k_cache[b:b + 1, :20], v_cache[b:b + 1, :20],
                               causal=True, softcap=5.0, upcast=False)
        assert_fa_close(out[start:start + n][None], ref, low, name=f"out {b}")
    assert lens_q == [2, 3]


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(sm_margin=2), "sm_margin"),
])
def test_arguments_of_later_versions_are_refused_by_name(kwargs, fragment):
    q = torch.zeros(2, 1, 4, 64, dtype=DTYPE)
    cache = torch.zeros(2, 16, 2, 64, dtype=DTYPE)
    with pytest.raises(RuntimeError, match=fragment):
        flash_attn_hopper.flash_attn_with_kvcache(q, cache, cache.clone(), **kwargs)


def test_qv_is_checked():
    q = torch.zeros(2, 1, 4, 64, dtype=DTYPE)
    cache = torch.zeros(2, 16, 2, 64, dtype=DTYPE)
    with pytest.raises(ValueError, match="qv must be a tensor shaped like q"):
        flash_attn_hopper.flash_attn_with_kvcache(q, cache, cache.clone(), qv=torch.zeros(1))
    pages = torch.zeros(4, 16, 2, 64, dtype=DTYPE)
    with pytest.raises(ValueError, match=r"v's head dim in \(64, 512\]"):  # a paged v as wide as q: no qv kernel
        flash_attn_hopper.flash_attn_with_kvcache(q, pages, pages.clone(), qv=torch.zeros(2, 1, 4, 64, dtype=DTYPE),
                                                  page_table=torch.zeros(2, 2, dtype=torch.int32))


def test_bad_layouts_and_gradients_are_refused():
    q = torch.zeros(2, 1, 4, 64, dtype=DTYPE)
    hnd = torch.zeros(2, 2, 16, 64, dtype=DTYPE).transpose(1, 2)  # heads before seqlen in memory
    with pytest.raises(ValueError, match="rows consecutive"):
        flash_attn_hopper.flash_attn_with_kvcache(q, hnd, hnd.clone())
    cache = torch.zeros(2, 16, 2, 64, dtype=DTYPE)
    with pytest.raises(RuntimeError, match="no backward"):
        flash_attn_hopper.flash_attn_with_kvcache(q.clone().requires_grad_(), cache, cache.clone())
    with pytest.raises(ValueError, match="pass both k and v"):
        flash_attn_hopper.flash_attn_with_kvcache(q, cache, cache.clone(), k=torch.zeros(2, 1, 2, 64, dtype=DTYPE))


def test_scheduler_metadata_is_checked_and_accepted(monkeypatch):
    """get_scheduler_metadata: the plan follows from shapes alone, so an empty int32 tensor; the call
    with it gives what the call without it gives."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 1, 4, 64, generator=g).to(DTYPE)
    k_cache, v_cache = (torch.randn(2, 32, 2, 64, generator=g).to(DTYPE) for _ in range(2))
    seqlens = torch.tensor([5, 30], dtype=torch.int32)
    md = flash_attn_hopper.get_scheduler_metadata(2, 1, 32, 4, 2, 64, seqlens, causal=True)
    assert md.dtype == torch.int32 and md.numel() == 0 and md.device == seqlens.device
    with emulated_varlen_ops(monkeypatch):
        a = flash_attn_hopper.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, causal=True,
                                                     scheduler_metadata=md)
        b = flash_attn_hopper.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, causal=True)
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="cache_seqlens must be an int32 tensor of shape"):
        flash_attn_hopper.get_scheduler_metadata(2, 1, 32, 4, 2, 64, seqlens.long())
    cu_new = torch.tensor([0, 1, 3], dtype=torch.int32)
    assert flash_attn_hopper.get_scheduler_metadata(2, 1, 32, 4, 2, 64, seqlens, cu_seqlens_k_new=cu_new).numel() == 0
    with pytest.raises(ValueError, match="cu_seqlens_k_new must be None or an int32 tensor of shape"):
        flash_attn_hopper.get_scheduler_metadata(2, 1, 32, 4, 2, 64, seqlens, cu_seqlens_k_new=cu_new[:2])
    with pytest.raises(TypeError, match="scheduler_metadata must be None"):
        flash_attn_hopper.flash_attn_with_kvcache(q, k_cache, v_cache, scheduler_metadata=[1])


@pytest.mark.parametrize("sq, causal, window, packs", [
    (1, True, (-1, -1), True),  # decode: the one query sees every key, causal or not
    (3, False, (-1, -1), True),  # no mask: every row sees every key
    (3, True, (-1, -1), False),  # several queries under a causal mask see different keys
    (1, False, (4, 0), False),  # a window: the packed rows would sit at different positions
])
def test_pack_gqa_runs_the_group_as_rows_of_one_head(monkeypatch, sq, causal, window, packs):
    g = torch.Generator().manual_seed(sq)
    batch, cache_len, hq, hk, d = 3, 24, 8, 2, 64
    q = torch.randn(batch, sq, hq, d, generator=g).to(DTYPE)
    k_cache, v_cache = (torch.randn(batch, cache_len, hk, d, generator=g).to(DTYPE) for _ in range(2))
    seqlens = torch.tensor([0, 9, 24], dtype=torch.int32)
    results = {}
    with emulated_varlen_ops(monkeypatch) as (fwd, _):
        for pack in (None, True, False):
            results[pack] = flash_attn_hopper.flash_attn_with_kvcache(
                q, k_cache, v_cache, cache_seqlens=seqlens, causal=causal, window_size=window, pack_gqa=pack,
                return_softmax_lse=True)
    heads_seen = [call["q"].shape[1] for call in fwd.calls]
    default_packs = packs and sq == 1  # None packs at decode; True wherever exact
    assert heads_seen == [hk if default_packs else hq, hk if packs else hq, hq]
    if packs:
        assert not fwd.calls[1]["causal"] and fwd.calls[1]["q"].shape[0] == batch * sq * (hq // hk)
    zeros = torch.zeros(batch, dtype=torch.int32)
    ref, lse_ref = reference(q, k_cache, v_cache, seqlens, zeros, causal=causal, window_size=window)
    low, _ = reference(q, k_cache, v_cache, seqlens, zeros, causal=causal, window_size=window, upcast=False)
    for pack, (out, lse) in results.items():
        assert out.shape == q.shape and lse.shape == (batch, hq, sq)
        assert_fa_close(out, ref, low, name=f"out (pack_gqa={pack})")
        finite = torch.isfinite(lse_ref)
        assert torch.equal(torch.isfinite(lse), finite)
        assert torch.allclose(lse[finite], lse_ref[finite], atol=1e-3), pack
    with pytest.raises(TypeError, match="pack_gqa must be None, True or False"):
        flash_attn_hopper.flash_attn_with_kvcache(q, k_cache, v_cache, pack_gqa="yes")


def _append_packed_ref(cache, new, cu, starts):
    """The packed new tokens of each sequence written one by one where they fit."""
    cache = cache.clone()
    for b in range(len(cu) - 1):
        for i in range(int(cu[b]), int(cu[b + 1])):
            slot = int(starts[b]) + i - int(cu[b])
            if slot < cache.shape[1]:
                cache[b, slot] = new[i]
    return cache


@pytest.mark.parametrize("cu, total", [
    ([0, 2, 2, 5], 5),  # an empty sequence; the last one runs past the cache's end
    ([1, 3, 3, 4], 6),  # rows 0, 4 and 5 belong to no sequence: never written
    ([2, 2, 2, 2], 3),  # no new token at all
])
def test_packed_new_tokens_are_appended_per_sequence(cu, total):
    cache = torch.arange(3 * 8 * 2, dtype=torch.float32).view(3, 8, 1, 2) * -1
    new = torch.arange(1, total * 2 + 1, dtype=torch.float32).view(total, 1, 2)
    starts = torch.tensor([3, 0, 6], dtype=torch.int32)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    want = _append_packed_ref(cache, new, cu, starts)
    rows, seq, idx, first, counts = _new_tokens(new, 3, cu_t)
    _append((cache,), (rows,), seq, idx, first, starts)
    assert torch.equal(cache, want)
    assert counts.tolist() == [max(b - a, 0) for a, b in zip(cu[:-1], cu[1:])]


def test_cu_seqlens_k_new_against_the_reference(monkeypatch):
    g = torch.Generator().manual_seed(11)
    batch, cache_len, hq, hk, d = 3, 40, 4, 2, 64
    lens_new, seqlens = [2, 0, 5], torch.tensor([10, 25, 37], dtype=torch.int32)
    cu_new = torch.tensor([0, 2, 2, 7], dtype=torch.int32)
    q = torch.randn(batch, 1, hq, d, generator=g).to(DTYPE)
    k_cache = torch.randn(batch, cache_len, hk, d, generator=g).to(DTYPE)
    v_cache = torch.randn(batch, cache_len, hk, d, generator=g).to(DTYPE)
    k, v = (torch.randn(7, hk, d, generator=g).to(DTYPE) for _ in range(2))
    angle = torch.rand(cache_len + 8, 16, generator=g) * 2 * math.pi
    cos, sin = angle.cos().to(DTYPE), angle.sin().to(DTYPE)
    pos = torch.cat([seqlens[b].long() + torch.arange(n) for b, n in enumerate(lens_new)])
    k_rot = rotary_ref(k, cos, sin, pos, True)
    k_ref = _append_packed_ref(k_cache, k_rot, cu_new.tolist(), seqlens)
    v_ref = _append_packed_ref(v_cache, v, cu_new.tolist(), seqlens)
    q_ref = rotary_ref(q, cos, sin, seqlens.long()[:, None], True)
    with emulated_varlen_ops(monkeypatch):
        out = flash_attn_hopper.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin,
                                                       cache_seqlens=seqlens, cu_seqlens_k_new=cu_new, causal=True)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref), "the append differs"
    ends = torch.clamp(seqlens + torch.tensor(lens_new, dtype=torch.int32), max=cache_len)
    zeros = torch.zeros(batch, dtype=torch.int32)
    ref, _ = reference(q_ref, k_ref, v_ref, ends, zeros, causal=True)
    low, _ = reference(q_ref, k_ref, v_ref, ends, zeros, causal=True, upcast=False)
    assert_fa_close(out, ref, low, name="out")


def test_cu_seqlens_k_new_is_checked():
    q = torch.zeros(2, 1, 4, 64, dtype=DTYPE)
    cache = torch.zeros(2, 16, 2, 64, dtype=DTYPE)
    new = torch.zeros(3, 2, 64, dtype=DTYPE)
    with pytest.raises(ValueError, match="cu_seqlens_k_new must be an int32"):
        flash_attn_hopper.flash_attn_with_kvcache(q, cache, cache.clone(), new, new, cu_seqlens_k_new=torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="total_new, nheads_k, d"):
        flash_attn_hopper.flash_attn_with_kvcache(q, cache, cache.clone(), new[None], new[None],
                                                  cu_seqlens_k_new=torch.tensor([0, 1, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="pass k and v with it"):
        flash_attn_hopper.flash_attn_with_kvcache(q, cache, cache.clone(),
                                                  cu_seqlens_k_new=torch.tensor([0, 1, 3], dtype=torch.int32))


@pytest.mark.parametrize("sq, chunk, causal, window, leftpad, varlen_q", [
    (1, 8, True, (-1, -1), False, False),  # decode: the query sees its chunk's keys
    (5, 3, True, (-1, -1), False, False),  # queries straddling chunk boundaries
    (6, 4, True, (2, 0), True, False),  # a window inside the chunk, left padding
    (4, 16, False, (-1, -1), False, False),  # not causal: the whole chunk
    (5, 3, True, (-1, -1), True, True),  # varlen q
])
def test_attention_chunk_against_the_reference(monkeypatch, sq, chunk, causal, window, leftpad, varlen_q):
    g = torch.Generator().manual_seed(sq * 7 + chunk)
    batch, cache_len, hq, hk, d = 4, 40, 4, 2, 64
    q = torch.randn(batch, sq, hq, d, generator=g).to(DTYPE)
    k_cache, v_cache = (torch.randn(batch, cache_len, hk, d, generator=g).to(DTYPE) for _ in range(2))
    seqlens = torch.tensor([3, 17, 40, 9], dtype=torch.int32)  # sequence 0 has fewer keys than queries
    pad = torch.tensor([0, 5, 11, 2], dtype=torch.int32) if leftpad else torch.zeros(batch, dtype=torch.int32)
    q_lens = [sq, sq - 1, 1, sq] if varlen_q else [sq] * batch
    kwargs = dict(cache_seqlens=seqlens, cache_leftpad=pad if leftpad else None, causal=causal, window_size=window,
                  attention_chunk=chunk, return_softmax_lse=True)
    with emulated_varlen_ops(monkeypatch):
        if varlen_q:
            cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
            rows = torch.cat([q[b, :n] for b, n in enumerate(q_lens)])
            out, lse = flash_attn_hopper.flash_attn_with_kvcache(rows, k_cache, v_cache, cu_seqlens_q=cu,
                                                               max_seqlen_q=sq, **kwargs)
        else:
            out, lse = flash_attn_hopper.flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs)
    start = 0
    for b, n in enumerate(q_lens):
        lo, hi = int(pad[b]), int(seqlens[b])
        ref, lse_ref = attention_ref_chunked(q[b:b + 1, :n], k_cache[b:b + 1, lo:hi], v_cache[b:b + 1, lo:hi],
                                             chunk=chunk, causal=causal, window_size=window)
        low, _ = attention_ref_chunked(q[b:b + 1, :n], k_cache[b:b + 1, lo:hi], v_cache[b:b + 1, lo:hi],
                                       chunk=chunk, causal=causal, window_size=window, upcast=False)
        got = out[start:start + n][None] if varlen_q else out[b:b + 1, :n]
        got_lse = lse[:, start:start + n][None] if varlen_q else lse[b:b + 1, :, :n]
        assert_fa_close(got, ref, low, name=f"out {b}")
        finite = torch.isfinite(lse_ref)
        assert torch.equal(torch.isfinite(got_lse), finite), b
        assert torch.allclose(got_lse[finite], lse_ref[finite], atol=1e-3), b
        start += n


def test_attention_chunk_must_be_a_non_negative_int():
    q, cache = torch.zeros(2, 1, 4, 64, dtype=DTYPE), torch.zeros(2, 16, 2, 64, dtype=DTYPE)
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="attention_chunk must be a non-negative int"):
            flash_attn_hopper.flash_attn_with_kvcache(q, cache, cache.clone(), attention_chunk=bad)


def test_attention_chunk_segments_cover_each_sequence_in_order():
    from flash_attn_hopper.chunked import segments
    # 2 sequences: 5 queries over 7 keys with chunks of 3 (queries at positions 2..6: chunks 0, 1, 2),
    # and 4 queries over 2 keys (2 queries before key 0).
    cu_q, cu_k, used, used_q = segments(torch.tensor([0, 5]), torch.tensor([5, 4]), torch.tensor([0, 100]),
                                        torch.tensor([7, 2]), 3, 5, 9, 200)
    # Per sequence: the queries before key 0, then ceil(5 / 3) + 1 = 3 chunk segments.
    assert cu_q.tolist() == [0, 0, 1, 4, 5, 7, 9, 9, 9]
    assert cu_k.tolist() == [0, 0, 3, 6, 100, 100, 102, 102, 200]
    assert used.tolist() == [0, 3, 3, 1, 0, 2, 0, 0]
    assert used_q.tolist() == [0, 1, 3, 1, 2, 2, 0, 0]


@pytest.mark.parametrize("new_tokens, leftpad", [(0, False), (2, True)])
def test_cache_batch_idx_picks_the_entries(monkeypatch, new_tokens, leftpad):
    g = torch.Generator().manual_seed(21 + new_tokens)
    batch, batch_cache, cache_len, hq, hk, d = 3, 5, 24, 4, 2, 64
    idx = torch.tensor([4, 0, 2] if new_tokens else [4, 4, 1], dtype=torch.int32)  # repeats only without appends
    q = torch.randn(batch, 2, hq, d, generator=g).to(DTYPE)
    k_cache, v_cache = (torch.randn(batch_cache, cache_len, hk, d, generator=g).to(DTYPE) for _ in range(2))
    k, v = ((torch.randn(batch, new_tokens, hk, d, generator=g).to(DTYPE) for _ in range(2)) if new_tokens
            else (None, None))
    seqlens = torch.tensor([7, 20, 13], dtype=torch.int32)
    pad = torch.tensor([2, 0, 5], dtype=torch.int32) if leftpad else None
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    for b in range(batch):
        e, s0 = int(idx[b]), int(seqlens[b])
        if new_tokens:
            k_ref[e, s0:s0 + new_tokens], v_ref[e, s0:s0 + new_tokens] = k[b], v[b]
    with emulated_varlen_ops(monkeypatch):
        out = flash_attn_hopper.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens,
                                                       cache_batch_idx=idx, cache_leftpad=pad, causal=True)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref), "the append missed the picked entries"
    for b in range(batch):
        e, lo, hi = int(idx[b]), int(pad[b]) if leftpad else 0, int(seqlens[b]) + new_tokens
        ref, _ = attention_ref(q[b:b + 1], k_ref[e:e + 1, lo:hi], v_ref[e:e + 1, lo:hi], causal=True)
        low, _ = attention_ref(q[b:b + 1], k_ref[e:e + 1, lo:hi], v_ref[e:e + 1, lo:hi], causal=True, upcast=False)
        assert_fa_close(out[b:b + 1], ref, low, name=f"out {b}")
    with pytest.raises(ValueError, match="cache_batch_idx must be an int32 tensor"):
        flash_attn_hopper.flash_attn_with_kvcache(q, k_cache, v_cache, cache_batch_idx=idx.long())
    with pytest.raises(ValueError, match="pass cache_batch_idx"):
        flash_attn_hopper.flash_attn_with_kvcache(q, k_cache, v_cache)


@pytest.mark.parametrize("seed", range(8))
def test_everything_together_as_fa3s_kvcache_test_combines_it(monkeypatch, seed):
    """varlen q with packed new keys (cu_seqlens_k_new), rotary, cache_batch_idx, leftpad and
    attention_chunk at once, each on or off by the seed, against a per-sequence reference written
    from FA3's docstring: the append into the picked entry, then q (rotated where the new keys are)
    over that entry's keys [leftpad, cache_seqlens + new)."""
    g = torch.Generator().manual_seed(100 + seed)
    use_idx, use_pad, use_chunk = (bool(seed >> i & 1) for i in range(3))
    batch, batch_cache, cache_len, hq, hk, d, sq = 3, 5, 48, 4, 2, 64, 4
    q_lens, new_lens = [4, 1, 3], [2, 0, 3]
    idx = torch.tensor([3, 0, 4], dtype=torch.int32) if use_idx else None
    entries = idx.tolist() if use_idx else list(range(batch))
    caches = batch_cache if use_idx else batch
    k_cache, v_cache = (torch.randn(caches, cache_len, hk, d, generator=g).to(DTYPE) for _ in range(2))
    q_rows = torch.randn(sum(q_lens), hq, d, generator=g).to(DTYPE)
    k_new, v_new = (torch.randn(sum(new_lens), hk, d, generator=g).to(DTYPE) for _ in range(2))
    seqlens = torch.tensor([9, 30, 40], dtype=torch.int32)
    pad = torch.tensor([3, 0, 7], dtype=torch.int32) if use_pad else None
    chunk = 8 if use_chunk else 0
    angle = torch.rand(cache_len + 8, 16, generator=g) * 2 * math.pi
    cos, sin = angle.cos().to(DTYPE), angle.sin().to(DTYPE)
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    cu_new = torch.tensor([0, *torch.tensor(new_lens).cumsum(0).tolist()], dtype=torch.int32)
    # The reference: the append, then each sequence alone.
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    new_pos = torch.cat([seqlens[b].long() + torch.arange(n) for b, n in enumerate(new_lens)])
    k_rot = rotary_ref(k_new, cos, sin, new_pos, True)
    for b, n in enumerate(new_lens):
        e, s0, a = entries[b], int(seqlens[b]), int(cu_new[b])
        k_ref[e, s0:s0 + n], v_ref[e, s0:s0 + n] = k_rot[a:a + n], v_new[a:a + n]
    with emulated_varlen_ops(monkeypatch):
        out = flash_attn_hopper.flash_attn_with_kvcache(
            q_rows, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
            cache_batch_idx=idx, cache_leftpad=pad, cu_seqlens_q=cu_q, cu_seqlens_k_new=cu_new, max_seqlen_q=sq,
            causal=True, attention_chunk=chunk)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref), "the append differs"
    for b, n in enumerate(q_lens):
        e, lo, hi = entries[b], int(pad[b]) if use_pad else 0, int(seqlens[b]) + new_lens[b]
        start = int(cu_q[b])
        q_pos = seqlens[b].long() + torch.arange(n)  # causal: each query at its own position
        qb = rotary_ref(q_rows[start:start + n][None], cos, sin, q_pos[None], True)
        kb, vb = k_ref[e:e + 1, lo:hi], v_ref[e:e + 1, lo:hi]
        if chunk:
            ref, _ = attention_ref_chunked(qb, kb, vb, chunk=chunk, causal=True)
            low, _ = attention_ref_chunked(qb, kb, vb, chunk=chunk, causal=True, upcast=False)
        else:
            ref, _ = attention_ref(qb, kb, vb, causal=True)
            low, _ = attention_ref(qb, kb, vb, causal=True, upcast=False)
        assert_fa_close(out[start:start + n][None], ref, low, name=f"seed {seed} out {b}")
