"""Paged KV caches on the GPU: the paged kernels (cp.async gathers through the page table) against
the float32 reference over the same cache gathered contiguous. Random page tables, page sizes
1 / 16 / 64 / 256 (and 3, below every key block), splits 1 / 3 / 0, PackGQA on and off, GQA,
causal / window, several queries per sequence, appends with rotary, both dtypes and every built
head dim; bitwise repeatable with fixed splits; a decode step captured in a CUDA graph and replayed
with new cache_seqlens; malformed page tables clamped (tools/check/sanitize_check.py runs them
under compute-sanitizer)."""
from __future__ import annotations

import math

import pytest
import torch

from flash_attn_hopper import flash_attn_varlen_func, flash_attn_with_kvcache

from helpers.kernels import compiled_config, skip_unless_compiled
from reference import assert_fa_close, attention_ref
from test_kvcache_cpu import rotary_ref

pytestmark = pytest.mark.gpu


def paged_cache(batch, capacity, page_size, hk, d, dtype, g, layout="nhd"):
    """(k_pages, v_pages, table, k_flat, v_flat): random pages (num_pages a few more than needed, in
    random order; `hnd` allocates heads before rows and views it as NHD) and each sequence's keys
    as a contiguous (batch, capacity, hk, d) copy."""
    per_seq = -(-capacity // page_size)
    num_pages = batch * per_seq + 5
    shape = (num_pages, hk, page_size, d) if layout == "hnd" else (num_pages, page_size, hk, d)
    k_pages, v_pages = (torch.randn(*shape, device="cuda", generator=g).to(dtype) for _ in range(2))
    if layout == "hnd":
        k_pages, v_pages = k_pages.transpose(1, 2), v_pages.transpose(1, 2)
    perm = torch.randperm(num_pages, device="cuda", generator=g)[: batch * per_seq]
    table = perm.view(batch, per_seq).to(torch.int32)
    return k_pages, v_pages, table


def gathered(pages, table, length):
    page_size = pages.shape[1]
    pos = torch.arange(length, device=pages.device)
    return pages[table.long()[:, pos // page_size], pos % page_size]


def reference(q, k, v, lens, **kwargs):
    """Per sequence b: q[b] (batch, sq, hq, d) over keys [0, lens[b]) of k / v (batch, cap, hk, d)."""
    outs, lses = [], []
    for b in range(q.shape[0]):
        n = int(lens[b])
        o, l = attention_ref(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], **kwargs)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs), torch.cat(lses)


@pytest.mark.parametrize("page_size", [1, 3, 16, 64, 256])
@pytest.mark.parametrize("splits", [1, 3, 0])
@pytest.mark.parametrize("pack_gqa", [None, False])
@pytest.mark.parametrize("sq, hq, hk, causal, window", [
    (1, 32, 8, True, (-1, -1)),  # decode
    (1, 8, 1, False, (-1, -1)),
    (5, 8, 2, True, (-1, -1)),  # speculative tokens
    (3, 4, 4, False, (40, 0)),  # a window
])
def test_kvcache_against_the_reference(page_size, splits, pack_gqa, sq, hq, hk, causal, window):
    d, dtype = compiled_config("paged")
    g = torch.Generator(device="cuda").manual_seed(page_size * 7 + splits + sq)
    batch, capacity = 4, 1024
    k_pages, v_pages, table = paged_cache(batch, capacity, page_size, hk, d, dtype, g)
    q = torch.randn(batch, sq, hq, d, device="cuda", generator=g).to(dtype)
    seqlens = torch.tensor([1, 300, 777, 1000], dtype=torch.int32, device="cuda")
    out, lse = flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=seqlens, page_table=table, causal=causal,
                                       window_size=window, num_splits=splits, pack_gqa=pack_gqa,
                                       return_softmax_lse=True)
    k, v = gathered(k_pages, table, capacity), gathered(v_pages, table, capacity)
    ref, lse_ref = reference(q, k, v, seqlens.cpu(), causal=causal, window_size=window)
    low, _ = reference(q, k, v, seqlens.cpu(), causal=causal, window_size=window, upcast=False)
    assert_fa_close(out, ref, low, name="out")
    finite = torch.isfinite(lse_ref)
    assert torch.allclose(lse[finite], lse_ref[finite], atol=2e-3)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("rotary, layout", [(None, "nhd"), (True, "nhd"), (False, "hnd")])
def test_append_with_rotary_into_pages(page_size, rotary, layout):
    d, dtype = compiled_config("paged")
    g = torch.Generator(device="cuda").manual_seed(page_size + 3)
    batch, capacity, hq, hk, snew = 3, 512, 8, 2, 4
    k_pages, v_pages, table = paged_cache(batch, capacity, page_size, hk, d, dtype, g, layout)
    q = torch.randn(batch, snew, hq, d, device="cuda", generator=g).to(dtype)
    k_new, v_new = (torch.randn(batch, snew, hk, d, device="cuda", generator=g).to(dtype) for _ in range(2))
    seqlens = torch.tensor([0, 200, 510], dtype=torch.int32, device="cuda")  # the last one fills up
    k_ref, v_ref = gathered(k_pages, table, capacity).clone(), gathered(v_pages, table, capacity).clone()
    cos = sin = None
    q_ref = q
    if rotary is not None:
        angle = torch.rand(capacity + 16, d // 4, device="cuda") * 2 * math.pi
        cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
        pos = seqlens.long()[:, None] + torch.arange(snew, device="cuda")
        k_rot = rotary_ref(k_new.cpu(), cos.cpu(), sin.cpu(), pos.cpu(), rotary).cuda()
        q_ref = rotary_ref(q.cpu(), cos.cpu(), sin.cpu(), pos.cpu(), rotary).cuda()
    else:
        k_rot = k_new
    for b in range(batch):
        s = int(seqlens[b])
        n = min(snew, capacity - s)
        k_ref[b, s:s + n], v_ref[b, s:s + n] = k_rot[b, :n], v_new[b, :n]
    out = flash_attn_with_kvcache(q, k_pages, v_pages, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                  cache_seqlens=seqlens, page_table=table, causal=True,
                                  rotary_interleaved=bool(rotary))
    assert torch.equal(gathered(k_pages, table, capacity), k_ref)
    assert torch.equal(gathered(v_pages, table, capacity), v_ref)
    ends = torch.clamp(seqlens + snew, max=capacity).cpu()
    ref, _ = reference(q_ref, k_ref, v_ref, ends, causal=True)
    low, _ = reference(q_ref, k_ref, v_ref, ends, causal=True, upcast=False)
    assert_fa_close(out, ref, low, name="out")


@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256, 80])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_head_dim_and_dtype(head_dim, dtype):
    skip_unless_compiled(head_dim, dtype, ("paged",))
    g = torch.Generator(device="cuda").manual_seed(head_dim)
    k_pages, v_pages, table = paged_cache(3, 700, 16, 2, head_dim, dtype, g)
    q = torch.randn(3, 2, 4, head_dim, device="cuda", generator=g).to(dtype)
    seqlens = torch.tensor([650, 17, 700], dtype=torch.int32, device="cuda")
    for splits in (1, 0):
        out = flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=seqlens, page_table=table, causal=True,
                                      num_splits=splits)
        k, v = gathered(k_pages, table, 700), gathered(v_pages, table, 700)
        ref, _ = reference(q, k, v, seqlens.cpu(), causal=True)
        low, _ = reference(q, k, v, seqlens.cpu(), causal=True, upcast=False)
        assert_fa_close(out, ref, low, name=f"out splits={splits}")


def test_varlen_with_a_page_table_and_a_sink():
    """vLLM's call: flash_attn_varlen_func with a block table and seqused_k, chunked prefill rows."""
    d, dtype = compiled_config("paged")
    g = torch.Generator(device="cuda").manual_seed(11)
    k_pages, v_pages, table = paged_cache(3, 2048, 16, 4, d, dtype, g)
    lens_q, used = [7, 1, 300], [2000, 5, 300]
    cu_q = torch.tensor([0, 7, 8, 308], dtype=torch.int32, device="cuda")
    q = torch.randn(308, 8, d, device="cuda", generator=g).to(dtype)
    sink = torch.randn(8, device="cuda", generator=g)
    out, lse = flash_attn_varlen_func(q, k_pages, v_pages, cu_q, None, 300, 2048,
                                      seqused_k=torch.tensor(used, dtype=torch.int32, device="cuda"), causal=True,
                                      page_table=table, return_attn_probs=True, learnable_sink=sink)
    k, v = gathered(k_pages, table, 2048), gathered(v_pages, table, 2048)
    start = 0
    for b, (n, m) in enumerate(zip(lens_q, used)):
        qb = q[start:start + n][None]
        ref, lse_ref = attention_ref(qb, k[b:b + 1, :m], v[b:b + 1, :m], causal=True, sink=sink)
        low, _ = attention_ref(qb, k[b:b + 1, :m], v[b:b + 1, :m], causal=True, sink=sink, upcast=False)
        assert_fa_close(out[start:start + n][None], ref, low, name=f"out {b}")
        assert torch.allclose(lse[:, start:start + n], lse_ref[0], atol=2e-3)
        start += n


def test_fixed_splits_are_bitwise_repeatable_and_a_graph_replays_with_new_lengths():
    d, dtype = compiled_config("paged")
    g = torch.Generator(device="cuda").manual_seed(5)
    k_pages, v_pages, table = paged_cache(8, 8192, 16, 8, d, dtype, g)
    q = torch.randn(8, 1, 32, d, device="cuda", generator=g).to(dtype)
    seqlens = torch.full((8,), 4000, dtype=torch.int32, device="cuda")
    run = lambda lens: flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=lens,  # noqa: E731
                                               page_table=table, num_splits=4)
    first = run(seqlens)
    assert all(torch.equal(first, run(seqlens)) for _ in range(5))
    static = seqlens.clone()
    run(static)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(static)
    for lens in ([4000] * 8, [1, 8192, 17, 3000, 4096, 5000, 2, 8000]):
        static.copy_(torch.tensor(lens, dtype=torch.int32))
        graph.replay()
        assert torch.equal(captured, run(static.clone()))


def test_malformed_page_tables_and_lengths_are_clamped():
    """Page numbers outside the cache read a page of the cache (clamped), lengths past the table's
    capacity stop at it: nothing outside the tensors is touched (compute-sanitizer says so in
    tools/check/sanitize_check.py) and the result is the clamped problem's."""
    d, dtype = compiled_config("paged")
    g = torch.Generator(device="cuda").manual_seed(9)
    k_pages, v_pages, table = paged_cache(2, 256, 16, 2, d, dtype, g)
    bad = table.clone()
    bad[0, 3] = -7
    bad[1, 5] = k_pages.shape[0] + 1000
    q = torch.randn(2, 1, 4, d, device="cuda", generator=g).to(dtype)
    lens = torch.tensor([10**6, 200], dtype=torch.int32, device="cuda")
    out = flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=lens, page_table=bad, num_splits=1)
    clamped = bad.clamp(0, k_pages.shape[0] - 1)
    want = flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=torch.tensor([256, 200], dtype=torch.int32,
                                                                                   device="cuda"),
                                   page_table=clamped, num_splits=1)
    torch.testing.assert_close(out, want, atol=0, rtol=0)


@pytest.mark.parametrize("d, dv", [(128, 64), (64, 128)])
@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_with_a_value_head_dim_of_its_own(d, dv, paged):
    """FA3's kvcache test has dv != d caches: k (…, d) and v (…, dv), out (…, dv), q's scale."""
    skip_unless_compiled(max(d, dv), torch.bfloat16, ("paged",) if paged else ("fwd",))
    g = torch.Generator(device="cuda").manual_seed(d + dv + paged)
    batch, capacity = 3, 640
    k_pages, _, table = paged_cache(batch, capacity, 16, 2, d, torch.bfloat16, g)
    v_pages = torch.randn(*k_pages.shape[:3], dv, device="cuda", generator=g).to(torch.bfloat16)
    k, v = gathered(k_pages, table, capacity), gathered(v_pages, table, capacity)
    q = torch.randn(batch, 2, 8, d, device="cuda", generator=g).to(torch.bfloat16)
    seqlens = torch.tensor([5, 300, 640], dtype=torch.int32, device="cuda")
    caches = (k_pages, v_pages, dict(page_table=table)) if paged else (k.contiguous(), v.contiguous(), {})
    out = flash_attn_with_kvcache(q, caches[0], caches[1], cache_seqlens=seqlens, causal=True, **caches[2])
    ref, _ = reference(q, k, v, seqlens.cpu(), causal=True)
    low, _ = reference(q, k, v, seqlens.cpu(), causal=True, upcast=False)
    assert out.shape == (batch, 2, 8, dv)
    assert_fa_close(out, ref, low, name="out")


@pytest.mark.parametrize("splits", [1, 0])
def test_batch_idx_and_leftpad_with_a_page_table(splits):
    """FA3's kvcache test with a page table: cache_batch_idx picks page-table rows, cache_leftpad
    moves each sequence's first key; new k / v (rotary) land on the picked rows' pages."""
    d, dtype = compiled_config("paged")
    g = torch.Generator(device="cuda").manual_seed(21 + splits)
    rows, capacity, hq, hk, snew = 6, 384, 8, 2, 2
    k_pages, v_pages, table = paged_cache(rows, capacity, 16, hk, d, dtype, g)
    idx = torch.tensor([4, 0, 3], dtype=torch.int32, device="cuda")
    pad = torch.tensor([7, 0, 100], dtype=torch.int32, device="cuda")
    seqlens = torch.tensor([20, 300, 150], dtype=torch.int32, device="cuda")
    q = torch.randn(3, snew, hq, d, device="cuda", generator=g).to(dtype)
    k_new, v_new = (torch.randn(3, snew, hk, d, device="cuda", generator=g).to(dtype) for _ in range(2))
    angle = torch.rand(capacity + 16, d // 4, device="cuda") * 2 * math.pi
    cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    k_ref = gathered(k_pages, table, capacity)[idx.long()].clone()
    v_ref = gathered(v_pages, table, capacity)[idx.long()].clone()
    pos = seqlens.long()[:, None] + torch.arange(snew, device="cuda")
    k_rot = rotary_ref(k_new.cpu(), cos.cpu(), sin.cpu(), pos.cpu(), True).cuda()
    q_ref = rotary_ref(q.cpu(), cos.cpu(), sin.cpu(), pos.cpu(), True).cuda()
    for b in range(3):
        s = int(seqlens[b])
        k_ref[b, s:s + snew], v_ref[b, s:s + snew] = k_rot[b], v_new[b]
    out = flash_attn_with_kvcache(q, k_pages, v_pages, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                  cache_seqlens=seqlens, cache_batch_idx=idx, cache_leftpad=pad, page_table=table,
                                  causal=True, num_splits=splits)
    assert torch.equal(gathered(k_pages, table, capacity)[idx.long()], k_ref)
    assert torch.equal(gathered(v_pages, table, capacity)[idx.long()], v_ref)
    for b in range(3):
        lo, hi = int(pad[b]), int(seqlens[b]) + snew
        ref, _ = attention_ref(q_ref[b:b + 1], k_ref[b:b + 1, lo:hi], v_ref[b:b + 1, lo:hi], causal=True)
        low, _ = attention_ref(q_ref[b:b + 1], k_ref[b:b + 1, lo:hi], v_ref[b:b + 1, lo:hi], causal=True,
                               upcast=False)
        assert_fa_close(out[b:b + 1], ref, low, name=f"out {b}")
