"""The paged-KV Python layer on CPU over the emulated paged op (tests/op_emulator.py): a cache
scattered into pages through a random page table gives what the same cache gives contiguous, in
flash_attn_varlen_func and flash_attn_with_kvcache (appends with rotary written to the right pages,
attention_chunk, PackGQA, several queries per sequence); the schema agrees with the binding's;
refusals. The kernels' own numbers are tests/test_paged_gpu.py's."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import flash_attn_hopper
from flash_attn_hopper import paged
from flash_attn_hopper.interface import flash_attn_varlen_func

from op_emulator import emulated_paged_op, emulated_varlen_ops

DTYPE = torch.float16
REPO_ROOT = Path(__file__).resolve().parents[1]


def test_schema_agrees_with_the_binding():
    source = (REPO_ROOT / "csrc" / "flash_api.cpp").read_text()
    start = source.index('m.def("paged_fwd(')
    literal = "".join(re.findall(r'"([^"]*)"', source[start:source.index(");", start)]))
    assert literal == paged.PAGED_FWD_SCHEMA
    schema = torch._C.parse_schema(f"flash_attn_hopper::{paged.PAGED_FWD_SCHEMA}")
    assert tuple(a.name for a in schema.arguments) == paged.PAGED_FWD_SCHEMA_ARGS


def to_pages(cache: torch.Tensor, page_size: int, g: torch.Generator, spare: int = 3):
    """A (batch, seqlen, h, d) cache scattered into (num_pages, page_size, h, d) pages in random order
    (with spare pages of noise), and its page table."""
    batch, seqlen, h, d = cache.shape
    per_seq = -(-seqlen // page_size)
    num_pages = batch * per_seq + spare
    order = torch.randperm(num_pages, generator=g)[: batch * per_seq]
    pages = torch.randn(num_pages, page_size, h, d, generator=g).to(cache.dtype)
    padded = torch.zeros(batch, per_seq * page_size, h, d, dtype=cache.dtype)
    padded[:, :seqlen] = cache
    pages[order] = padded.view(batch * per_seq, page_size, h, d)
    return pages, order.view(batch, per_seq).to(torch.int32)


def through(table: torch.Tensor, cache: torch.Tensor, like: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """cache scattered into pages shaped like `like` through an existing page table (noise elsewhere)."""
    num_pages, page_size, h, d = like.shape
    pages = torch.randn(num_pages, page_size, h, d, generator=g).to(cache.dtype)
    padded = torch.zeros(cache.shape[0], table.shape[1] * page_size, h, d, dtype=cache.dtype)
    padded[:, : cache.shape[1]] = cache
    pages[table.long().flatten()] = padded.view(-1, page_size, h, d)
    return pages


def paged_pair(cache_k: torch.Tensor, cache_v: torch.Tensor, page_size: int, g: torch.Generator):
    """(k_pages, v_pages, table): both caches through one random page table."""
    k_pages, table = to_pages(cache_k, page_size, g)
    like = k_pages if cache_v.shape[-1] == cache_k.shape[-1] else torch.empty(k_pages.shape[:3] + cache_v.shape[-1:])
    return k_pages, through(table, cache_v, like, g), table


def gather(pages: torch.Tensor, table: torch.Tensor, seqlen: int) -> torch.Tensor:
    page_size = pages.shape[1]
    pos = torch.arange(seqlen)
    return pages[table.long()[:, pos // page_size], pos % page_size]


@pytest.mark.parametrize("page_size", [1, 3, 16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hq, hk", [(4, 4), (4, 2)])
def test_varlen_with_a_page_table_matches_the_contiguous_cache(monkeypatch, page_size, causal, hq, hk):
    g = torch.Generator().manual_seed(page_size * 10 + hq + causal)
    batch, seqlen, d = 3, 20, 32
    cache_k, cache_v = (torch.randn(batch, seqlen, hk, d, generator=g).to(DTYPE) for _ in range(2))
    k_pages, v_pages, table = paged_pair(cache_k, cache_v, page_size, g)
    used = torch.tensor([5, 20, 0], dtype=torch.int32)
    cu_q = torch.tensor([0, 1, 5, 7], dtype=torch.int32)
    q = torch.randn(7, hq, d, generator=g).to(DTYPE)
    with emulated_paged_op(monkeypatch) as rec:
        out, lse = flash_attn_varlen_func(q, k_pages, v_pages, cu_q, None, 4, seqlen, seqused_k=used, causal=causal,
                                          page_table=table, return_attn_probs=True)
        cu_k = torch.tensor([0, seqlen, 2 * seqlen, 3 * seqlen], dtype=torch.int32)
        want, want_lse = flash_attn_varlen_func(q, cache_k.reshape(-1, hk, d), cache_v.reshape(-1, hk, d), cu_q, cu_k,
                                                4, seqlen, seqused_k=used, causal=causal, return_attn_probs=True)
    assert len(rec.calls) == 1 and rec.calls[0]["page_table"] is table and rec.calls[0]["k_cache"] is k_pages
    assert torch.equal(rec.calls[0]["cu_seqlens_k"], torch.zeros(batch + 1, dtype=torch.int32))
    torch.testing.assert_close(out, want, atol=2e-3, rtol=0)
    torch.testing.assert_close(lse, want_lse, atol=1e-4, rtol=0)


def test_pack_gqa_at_decode_reads_each_kv_head_once(monkeypatch):
    g = torch.Generator().manual_seed(1)
    cache_k, cache_v = (torch.randn(2, 24, 2, 64, generator=g).to(DTYPE) for _ in range(2))
    pages_k, pages_v, table = paged_pair(cache_k, cache_v, 8, g)
    q = torch.randn(2, 8, 64, generator=g).to(DTYPE)
    cu_q, used = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([24, 9], dtype=torch.int32)
    with emulated_paged_op(monkeypatch) as rec:
        packed = flash_attn_varlen_func(q, pages_k, pages_v, cu_q, None, 1, 24, seqused_k=used, causal=True,
                                        page_table=table)
        plain = flash_attn_varlen_func(q, pages_k, pages_v, cu_q, None, 1, 24, seqused_k=used, causal=True,
                                       page_table=table, pack_gqa=False)
    assert rec.calls[0]["q"].shape == (8, 2, 64) and rec.calls[0]["causal"] is False  # 4 query heads as rows
    assert rec.calls[1]["q"].shape == (2, 8, 64)
    torch.testing.assert_close(packed, plain, atol=2e-3, rtol=0)


@pytest.mark.parametrize("page_size", [1, 5, 16])
@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize("varlen_q", [False, True])
def test_kvcache_with_a_page_table_matches_the_contiguous_cache(monkeypatch, page_size, rotary, varlen_q):
    """Appends (with rotary) land on the right pages, and the attention over the pages is the
    attention over the contiguous cache after the same append."""
    g = torch.Generator().manual_seed(page_size + 7 * rotary + 3 * varlen_q)
    batch, hq, hk, d, snew = 2, 4, 2, 32, 3
    cap = 32 // page_size * page_size  # whole pages: the page table's capacity is the cache's
    cache_k, cache_v = (torch.randn(batch, cap, hk, d, generator=g).to(DTYPE) for _ in range(2))
    k_pages, v_pages, table = paged_pair(cache_k, cache_v, page_size, g)
    k_new, v_new = (torch.randn(batch, snew, hk, d, generator=g).to(DTYPE) for _ in range(2))
    seqlens = torch.tensor([7, cap - 2], dtype=torch.int32)  # the second fills up past the cache
    cos = sin = None
    if rotary:
        angle = torch.rand(64, 8, generator=g) * 6.28
        cos, sin = angle.cos().to(DTYPE), angle.sin().to(DTYPE)
    if varlen_q:
        q = torch.randn(5, hq, d, generator=g).to(DTYPE)
        extra = dict(cu_seqlens_q=torch.tensor([0, 2, 5], dtype=torch.int32), max_seqlen_q=3)
    else:
        q = torch.randn(batch, 2, hq, d, generator=g).to(DTYPE)
        extra = {}
    with emulated_paged_op(monkeypatch):
        got = flash_attn_hopper.flash_attn_with_kvcache(
            q, k_pages, v_pages, k_new, v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
            page_table=table, causal=True, return_softmax_lse=True, **extra)
        want = flash_attn_hopper.flash_attn_with_kvcache(
            q, cache_k, cache_v, k_new, v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens, causal=True,
            return_softmax_lse=True, **extra)
    # The contiguous call appended to cache_k / cache_v; the paged one to its pages, the same rows.
    assert torch.equal(gather(k_pages, table, cap), cache_k) and torch.equal(gather(v_pages, table, cap), cache_v)
    torch.testing.assert_close(got[0], want[0], atol=2e-3, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=1e-4, rtol=0)


@pytest.mark.parametrize("chunk", [4, 16])
def test_attention_chunk_over_pages(monkeypatch, chunk):
    g = torch.Generator().manual_seed(chunk)
    cache_k, cache_v = (torch.randn(2, 40, 2, 32, generator=g).to(DTYPE) for _ in range(2))
    k_pages, v_pages, table = paged_pair(cache_k, cache_v, 4, g)
    q = torch.randn(2, 5, 4, 32, generator=g).to(DTYPE)
    seqlens = torch.tensor([13, 40], dtype=torch.int32)
    with emulated_paged_op(monkeypatch):
        got = flash_attn_hopper.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=seqlens, page_table=table,
                                                        causal=True, attention_chunk=chunk)
        want = flash_attn_hopper.flash_attn_with_kvcache(q, cache_k, cache_v, cache_seqlens=seqlens, causal=True,
                                                         attention_chunk=chunk)
    torch.testing.assert_close(got, want, atol=2e-3, rtol=0)


def test_refusals():
    q = torch.zeros(2, 1, 4, 64, dtype=DTYPE)
    pages = torch.zeros(6, 16, 2, 64, dtype=DTYPE)
    table = torch.zeros(2, 3, dtype=torch.int32)
    kv = flash_attn_hopper.flash_attn_with_kvcache
    with pytest.raises(ValueError, match="page_table must be an int32"):
        kv(q, pages, pages.clone(), page_table=table.long())
    with pytest.raises(ValueError, match="16-byte copies"):
        odd = torch.zeros(6, 16, 2, 68, dtype=DTYPE)[..., :64]  # rows of 136 bytes
        kv(q, odd, odd.clone(), page_table=table)
    with pytest.raises(ValueError, match="q has 2 sequences but the cache 3"):
        kv(q, pages, pages.clone(), page_table=torch.zeros(3, 3, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="no backward"):
        kv(q.clone().requires_grad_(), pages, pages.clone(), page_table=table)
    qv = torch.zeros(2, 4, 64, dtype=DTYPE)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="seqused_k .* is required"):
        flash_attn_varlen_func(qv, pages, pages.clone(), cu, None, 1, 48, page_table=table)
    with pytest.raises(ValueError, match="seqused_q is not taken"):
        flash_attn_varlen_func(qv, pages, pages.clone(), cu, None, 1, 48, seqused_q=cu[1:], page_table=table)
    with pytest.raises(ValueError, match="headdim_v"):  # v's heads differ from k's
        flash_attn_varlen_func(qv, pages, pages[:, :, :1].clone(), cu, None, 1, 48, seqused_k=cu[1:], page_table=table)
    with pytest.raises(ValueError, match="multiples of 8 up to 256"):
        flash_attn_varlen_func(qv, pages, torch.zeros(6, 16, 2, 512, dtype=DTYPE), cu, None, 1, 48, seqused_k=cu[1:],
                               page_table=table)


def test_hnd_caches_are_read_in_place(monkeypatch):
    """A head-major (num_pages, nheads_k, page_size, d) allocation viewed as NHD reaches the op as it is."""
    g = torch.Generator().manual_seed(2)
    hnd = torch.randn(5, 2, 8, 32, generator=g).to(DTYPE)
    pages = hnd.transpose(1, 2)
    table = torch.tensor([[3, 1], [0, 4]], dtype=torch.int32)
    q = torch.randn(2, 1, 2, 32, generator=g).to(DTYPE)
    with emulated_paged_op(monkeypatch) as rec:
        out = flash_attn_hopper.flash_attn_with_kvcache(q, pages, pages, cache_seqlens=torch.tensor(
            [10, 16], dtype=torch.int32), page_table=table)
        want = flash_attn_hopper.flash_attn_with_kvcache(q, gather(pages, table, 16).contiguous(),
                                                         gather(pages, table, 16).contiguous(),
                                                         cache_seqlens=torch.tensor([10, 16], dtype=torch.int32))
    assert rec.calls[0]["k_cache"] is pages
    torch.testing.assert_close(out, want, atol=2e-3, rtol=0)


def test_scheduler_metadata_takes_a_page_size():
    seqlens = torch.tensor([5, 30], dtype=torch.int32)
    assert flash_attn_hopper.get_scheduler_metadata(2, 1, 32, 4, 2, 64, seqlens, page_size=16).numel() == 0
    # FA3's kvcache test passes headdim_v (its dv, which may differ from d) and max_seqlen_k_new.
    md = flash_attn_hopper.get_scheduler_metadata(2, 1, 32, 4, 2, 192, seqlens, headdim_v=128, page_size=16,
                                                  max_seqlen_k_new=1)
    assert md.numel() == 0
    with pytest.raises(ValueError, match="headdim_v"):
        flash_attn_hopper.get_scheduler_metadata(2, 1, 32, 4, 2, 64, seqlens, headdim_v=0)
    with pytest.raises(ValueError, match="page_size"):
        flash_attn_hopper.get_scheduler_metadata(2, 1, 32, 4, 2, 64, seqlens, page_size=0)


def test_the_emulation_refuses_out_of_range_pages(monkeypatch):
    """The strict emulation is what makes the tests above fail on a layer that builds a bad call."""
    q = torch.zeros(1, 2, 32, dtype=DTYPE)
    pages = torch.zeros(2, 4, 2, 32, dtype=DTYPE)
    with emulated_varlen_ops(monkeypatch), pytest.raises(AssertionError):
        from op_emulator import emulate_paged_fwd

        emulate_paged_fwd(q, pages, pages, torch.tensor([[0, 5]], dtype=torch.int32),
                          torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, 0], dtype=torch.int32),
                          torch.tensor([8], dtype=torch.int32), 1, 8, 1.0, False)


def test_torch_varlen_attn_with_a_block_table_runs_our_paged_op(monkeypatch):
    """torch's varlen_attn(block_table=...) reaches aten::_flash_attention_forward, which the registry
    serves with the paged op (forward only; with inputs that require grad it stays torch's)."""
    from test_varlen_integrations_cpu import _varlen_attn, overrides_as_cpu_kernels

    varlen = _varlen_attn()
    if "block_table" not in varlen.varlen_attn.__code__.co_varnames:
        pytest.skip(f"torch {torch.__version__}'s varlen_attn has no block_table")
    g = torch.Generator().manual_seed(8)
    cache_k, cache_v = (torch.randn(2, 32, 2, 64, generator=g).to(DTYPE) for _ in range(2))
    k_pages, v_pages, table = paged_pair(cache_k, cache_v, 16, g)
    q = torch.randn(3, 4, 64, generator=g).to(DTYPE)
    cu_q, used = torch.tensor([0, 1, 3], dtype=torch.int32), torch.tensor([30, 7], dtype=torch.int32)
    with emulated_paged_op(monkeypatch) as rec, torch.no_grad(), \
            overrides_as_cpu_kernels("_flash_attention_forward") as originals:
        out = varlen.varlen_attn(q, k_pages, v_pages, cu_q, None, 2, 32, window_size=(-1, 0), seqused_k=used,
                                 block_table=table, enable_gqa=True)
        want = flash_attn_varlen_func(q, cache_k.reshape(-1, 2, 64), cache_v.reshape(-1, 2, 64), cu_q,
                                      torch.tensor([0, 32, 64], dtype=torch.int32), 2, 32, seqused_k=used,
                                      causal=True)
    assert not originals["_flash_attention_forward"].calls
    assert rec.calls[0]["page_table"] is table and rec.calls[0]["causal"] is True
    torch.testing.assert_close(out, want, atol=2e-3, rtol=0)
    refusal = flash_attn_hopper.torch_registry.flash_attention_forward_refusal
    with emulated_paged_op(monkeypatch):
        args = (q, k_pages, v_pages, cu_q, None, 2, 32, 0.0, True, False)
        assert refusal(*args, seqused_k=used, block_table=table) is None
        assert "require grad" in refusal(q.clone().requires_grad_(), *args[1:], seqused_k=used, block_table=table)
        assert "without cum_seq_q and seqused_k" in refusal(*args, block_table=table)
        assert "rows" in refusal(*args, seqused_k=used, block_table=table[:1])


def test_kvcache_with_a_sink_paged_and_contiguous(monkeypatch):
    g = torch.Generator().manual_seed(12)
    cache_k, cache_v = (torch.randn(2, 32, 2, 32, generator=g).to(DTYPE) for _ in range(2))
    k_pages, v_pages, table = paged_pair(cache_k, cache_v, 8, g)
    q = torch.randn(2, 1, 4, 32, generator=g).to(DTYPE)
    sink = torch.randn(4, generator=g)
    seqlens = torch.tensor([9, 32], dtype=torch.int32)
    with emulated_paged_op(monkeypatch) as rec:
        got = flash_attn_hopper.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=seqlens, page_table=table,
                                                        learnable_sink=sink)
        want = flash_attn_hopper.flash_attn_with_kvcache(q, cache_k, cache_v, cache_seqlens=seqlens,
                                                         learnable_sink=sink)
        plain = flash_attn_hopper.flash_attn_with_kvcache(q, cache_k, cache_v, cache_seqlens=seqlens)
    assert rec.calls[0]["sink"] is not None and rec.calls[0]["q"].shape[1] == 4  # no PackGQA with a sink
    torch.testing.assert_close(got, want, atol=2e-3, rtol=0)
    assert not torch.allclose(got, plain, atol=1e-2)  # the sink took part


@pytest.mark.skipif(not paged.has_paged_op(), reason="needs the compiled extension with the paged_fwd op")
def test_the_compiled_op_has_the_schema_and_a_fake_kernel():
    """The built op's arguments are the ones paged.py passes, and it traces (torch.compile / export)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    assert tuple(a.name for a in torch.ops.flash_attn_hopper.paged_fwd.default._schema.arguments) == \
        paged.PAGED_FWD_SCHEMA_ARGS
    with FakeTensorMode():
        q = torch.empty(7, 8, 128, device="cuda", dtype=torch.bfloat16)
        pages = torch.empty(10, 16, 2, 128, device="cuda", dtype=torch.bfloat16)
        table = torch.empty(2, 5, device="cuda", dtype=torch.int32)
        cu, used = torch.empty(3, device="cuda", dtype=torch.int32), torch.empty(2, device="cuda", dtype=torch.int32)
        out, lse = torch.ops.flash_attn_hopper.paged_fwd(q, pages, pages, table, cu, cu, used, 5, 80, 0.1, True)
    assert out.shape == (7, 8, 128) and out.dtype == torch.bfloat16
    assert lse.shape == (8, 7) and lse.dtype == torch.float32


@pytest.mark.parametrize("d, dv", [(64, 32), (32, 64)])
def test_kvcache_with_a_value_head_dim_of_its_own(monkeypatch, d, dv):
    """FA3's dv != d caches: appends write k (d) and v (dv) to their caches; the attention, paged or
    contiguous, is the reference's with q's scale, out (…, dv)."""
    g = torch.Generator().manual_seed(d + 2 * dv)
    cache_k = torch.randn(2, 32, 2, d, generator=g).to(DTYPE)
    cache_v = torch.randn(2, 32, 2, dv, generator=g).to(DTYPE)
    k_pages, v_pages, table = paged_pair(cache_k, cache_v, 8, g)
    q = torch.randn(2, 2, 4, d, generator=g).to(DTYPE)
    k_new = torch.randn(2, 2, 2, d, generator=g).to(DTYPE)
    v_new = torch.randn(2, 2, 2, dv, generator=g).to(DTYPE)
    seqlens = torch.tensor([9, 20], dtype=torch.int32)
    with emulated_paged_op(monkeypatch):
        got = flash_attn_hopper.flash_attn_with_kvcache(q, k_pages, v_pages, k_new, v_new, cache_seqlens=seqlens,
                                                        page_table=table, causal=True)
        want = flash_attn_hopper.flash_attn_with_kvcache(q, cache_k, cache_v, k_new, v_new, cache_seqlens=seqlens,
                                                         causal=True)
    assert got.shape == want.shape == (2, 2, 4, dv)
    assert torch.equal(gather(k_pages, table, 32), cache_k) and torch.equal(gather(v_pages, table, 32), cache_v)
    torch.testing.assert_close(got, want, atol=2e-3, rtol=0)
    from reference import attention_ref

    for b, n in enumerate((11, 22)):
        ref, _ = attention_ref(q[b:b + 1], cache_k[b:b + 1, :n], cache_v[b:b + 1, :n], causal=True)
        torch.testing.assert_close(want[b:b + 1].float(), ref.float(), atol=2e-2, rtol=0)


@pytest.mark.parametrize("chunk", [0, 6])
def test_batch_idx_and_leftpad_with_a_page_table(monkeypatch, chunk):
    """FA3's test: cache_batch_idx picks page-table rows (page_table[cache_batch_idx]) and
    cache_leftpad moves each sequence's first key, with appends and rotary, as in a contiguous
    cache of the same rows."""
    g = torch.Generator().manual_seed(30 + chunk)
    cache_k, cache_v = (torch.randn(4, 32, 2, 32, generator=g).to(DTYPE) for _ in range(2))
    k_pages, v_pages, table = paged_pair(cache_k, cache_v, 8, g)
    q = torch.randn(2, 3, 4, 32, generator=g).to(DTYPE)
    k_new, v_new = (torch.randn(2, 2, 2, 32, generator=g).to(DTYPE) for _ in range(2))
    angle = torch.rand(48, 8, generator=g) * 6.28
    cos, sin = angle.cos().to(DTYPE), angle.sin().to(DTYPE)
    idx, pad = torch.tensor([2, 0], dtype=torch.int32), torch.tensor([3, 0], dtype=torch.int32)
    seqlens = torch.tensor([10, 25], dtype=torch.int32)
    kwargs = dict(rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens, cache_batch_idx=idx, cache_leftpad=pad,
                  causal=True, attention_chunk=chunk, return_softmax_lse=True)
    with emulated_paged_op(monkeypatch):
        got = flash_attn_hopper.flash_attn_with_kvcache(q, k_pages, v_pages, k_new, v_new, page_table=table, **kwargs)
        want = flash_attn_hopper.flash_attn_with_kvcache(q, cache_k, cache_v, k_new, v_new, **kwargs)
    assert torch.equal(gather(k_pages, table, 32), cache_k) and torch.equal(gather(v_pages, table, 32), cache_v)
    torch.testing.assert_close(got[0], want[0], atol=2e-3, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=1e-4, rtol=0)
