"""FA3's ``qv`` on the GPU (the qv kernels: q/k head dim 64, v's 256 / 512) against the float32
reference, by FlashAttention's rule.

The reference is attention over q' = [q, qv] and k' = [k, v] (so q'k'ᵀ = q kᵀ + qv vᵀ) with FA3's
default scale (d + dv) ** -0.5, values v. Every case draws fresh inputs and poisons the memory
the outputs land in; odd sizes, seqlen_q != seqlen_k, decode (one query), MLA's one KV head and
GQA, v head dims that pad inside the kernel (136 -> 256, 328 -> 512), strided qv, varlen with
empty sequences and seqused_k, windows and sinks.
"""

from __future__ import annotations

import pytest
import torch

from flash_attn_hopper import flash_attn_func, flash_attn_varlen_func

from helpers.inputs import poison_allocations
from helpers.kernels import skip_unless_compiled
from reference import assert_fa_close, attention_ref, attention_ref_chunked, attention_ref_varlen

pytestmark = pytest.mark.gpu

LSE_ATOL = 1e-3


def draw(shape, dtype, gen):
    return torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32).to(dtype)


def inputs(batch, seqlen_q, seqlen_k, heads_q, heads_kv, dv, dtype, seed, d=64):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = draw((batch, seqlen_q, heads_q, d), dtype, gen)
    k = draw((batch, seqlen_k, heads_kv, d), dtype, gen)
    v = draw((batch, seqlen_k, heads_kv, dv), dtype, gen)
    qv = draw((batch, seqlen_q, heads_q, dv), dtype, gen)
    return q, k, v, qv


def reference(q, k, v, qv, ref=attention_ref, **kwargs):
    scale = (q.shape[-1] + v.shape[-1]) ** (-0.5)
    q2, k2 = torch.cat([q, qv], dim=-1), torch.cat([k, v], dim=-1)
    out, lse = ref(q2, k2, v, softmax_scale=scale, **kwargs)
    low, _ = ref(q2, k2, v, softmax_scale=scale, upcast=False, **kwargs)
    return out, lse, low


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("dv", [512, 256, 328, 136])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "batch, seqlen_q, seqlen_k, heads_q, heads_kv",
    [(2, 1, 1, 16, 1), (3, 1, 517, 16, 1), (2, 113, 203, 4, 2), (1, 257, 129, 3, 3), (2, 64, 2048, 8, 1)],
)
def test_qv_dense(dtype, dv, causal, batch, seqlen_q, seqlen_k, heads_q, heads_kv):
    skip_unless_compiled(64, dtype)
    seed = hash((dv, causal, batch, seqlen_q, seqlen_k, heads_q)) % (2**31)
    q, k, v, qv = inputs(batch, seqlen_q, seqlen_k, heads_q, heads_kv, dv, dtype, seed)
    poison_allocations(((batch, seqlen_q, heads_q, dv), dtype), ((batch, heads_q, seqlen_q), torch.float32))
    out, lse = flash_attn_func(q, k, v, causal=causal, qv=qv, return_attn_probs=True)
    ref, ref_lse, low = reference(q, k, v, qv, causal=causal)
    assert out.shape == (batch, seqlen_q, heads_q, dv) and out.dtype == dtype
    assert_fa_close(out, ref, low, name="out")
    finite = ref_lse.isfinite()
    assert torch.equal(lse.isfinite(), finite)
    assert (lse[finite] - ref_lse[finite]).abs().max().item() <= LSE_ATOL


@pytest.mark.parametrize("dv", [512, 256])
def test_qv_window_sink_strides(dv):
    """A sliding window, a learnable sink and qv / q read through strides (slices of wider tensors)."""
    skip_unless_compiled(64, torch.bfloat16)
    dtype = torch.bfloat16
    q, k, v, _ = inputs(2, 150, 300, 8, 2, dv, dtype, seed=dv)
    gen = torch.Generator(device="cuda").manual_seed(7)
    wide = draw((2, 150, 8, dv + 72), dtype, gen)
    qv = wide[..., 8 : 8 + dv]  # row stride dv + 72, offset 16 bytes
    assert not qv.is_contiguous()
    sink = torch.randn(8, device="cuda", generator=gen)
    window = (37, 11)
    out, lse = flash_attn_func(q, k, v, qv=qv, window_size=window, learnable_sink=sink, return_attn_probs=True)
    ref, ref_lse, low = reference(q, k, v, qv, window_size=window, sink=sink)
    assert_fa_close(out, ref, low, name="out")
    assert (lse - ref_lse).abs().max().item() <= LSE_ATOL


@pytest.mark.parametrize("dv", [512, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_qv_softcap(dv, causal):
    """softcap * tanh(scale * (q kᵀ + qv vᵀ) / softcap), as FA3's test runs it (q scaled into the cap's range)."""
    skip_unless_compiled(64, torch.bfloat16)
    q, k, v, qv = inputs(2, 97, 211, 6, 2, dv, torch.bfloat16, seed=dv + 3 * causal)
    q = q * 4
    out, lse = flash_attn_func(q, k, v, qv=qv, causal=causal, softcap=15.0, return_attn_probs=True)
    ref, ref_lse, low = reference(q, k, v, qv, causal=causal, softcap=15.0)
    assert_fa_close(out, ref, low, name="out")
    assert (lse - ref_lse).abs().max().item() <= LSE_ATOL


@pytest.mark.parametrize("dv", [512, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_qv_varlen(dv, causal):
    """Sequences of 0, 1 and odd lengths, one with no keys, and seqused_k."""
    skip_unless_compiled(64, torch.bfloat16)
    dtype = torch.bfloat16
    lens_q, lens_k = [0, 1, 77, 130, 5], [40, 300, 0, 261, 129]
    gen = torch.Generator(device="cuda").manual_seed(dv + causal)
    total_q, total_k = sum(lens_q), sum(lens_k)
    q = draw((total_q, 16, 64), dtype, gen)
    qv = draw((total_q, 16, dv), dtype, gen)
    k = draw((total_k, 1, 64), dtype, gen)
    v = draw((total_k, 1, dv), dtype, gen)
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    used_k = torch.tensor([min(n, 200) for n in lens_k], dtype=torch.int32, device="cuda")
    poison_allocations(((total_q, 16, dv), dtype), ((16, total_q), torch.float32))
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), seqused_k=used_k, qv=qv,
                                      causal=causal, return_attn_probs=True)
    ref, ref_lse, low = reference(q, k, v, qv, ref=attention_ref_varlen, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                  seqused_k=used_k, causal=causal)
    assert_fa_close(out, ref, low, name="out")
    finite = ref_lse.isfinite()
    assert torch.equal(lse.isfinite(), finite)
    assert (lse[finite] - ref_lse[finite]).abs().max().item() <= LSE_ATOL


@pytest.mark.parametrize("chunk", [37, 128])
def test_qv_attention_chunk(chunk):
    """FA3's test combines qv with attention_chunk: the chunk segments run on the varlen qv kernels."""
    skip_unless_compiled(64, torch.bfloat16)
    q, k, v, qv = inputs(2, 90, 300, 6, 1, 512, torch.bfloat16, seed=chunk)
    out = flash_attn_func(q, k, v, qv=qv, causal=True, attention_chunk=chunk)
    scale = (64 + 512) ** (-0.5)
    q2, k2 = torch.cat([q, qv], dim=-1), torch.cat([k, v], dim=-1)
    ref, _ = attention_ref_chunked(q2, k2, v, chunk=chunk, causal=True, softmax_scale=scale)
    low, _ = attention_ref_chunked(q2, k2, v, chunk=chunk, causal=True, softmax_scale=scale, upcast=False)
    assert_fa_close(out, ref, low, name="out")


def test_qv_no_keys_and_grad_refused():
    skip_unless_compiled(64, torch.bfloat16)
    q, k, v, qv = inputs(2, 3, 0, 4, 1, 512, torch.bfloat16, seed=1)
    out, lse = flash_attn_func(q, k, v, qv=qv, return_attn_probs=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()
    q, k, v, qv = inputs(1, 5, 9, 4, 1, 512, torch.bfloat16, seed=2)
    out = flash_attn_func(q.requires_grad_(), k, v, qv=qv)  # the forward runs, as FA3's
    ref, _, low = reference(q.detach(), k, v, qv)
    assert_fa_close(out.detach(), ref, low, name="out")
    with pytest.raises(RuntimeError, match="no backward"):
        out.sum().backward()


@pytest.mark.parametrize("dv", [512, 256])
def test_qv_kvcache_decode(dv):
    """MLA decode over a contiguous cache: one query per sequence, 16 query heads on one KV head
    (PackGQA as rows), the cache filled to cache_seqlens."""
    skip_unless_compiled(64, torch.bfloat16)
    from flash_attn_hopper import flash_attn_with_kvcache

    q, k_cache, v_cache, qv = inputs(4, 1, 700, 16, 1, dv, torch.bfloat16, seed=dv + 11)
    lens = torch.tensor([700, 1, 333, 64], dtype=torch.int32, device="cuda")
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, qv=qv, cache_seqlens=lens, causal=True,
                                       return_softmax_lse=True)
    for b, n in enumerate(lens.tolist()):
        ref, ref_lse, low = reference(q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n], qv[b:b + 1],
                                      causal=True)
        assert_fa_close(out[b:b + 1], ref, low, name=f"out {b}")
        assert (lse[b:b + 1] - ref_lse).abs().max().item() <= LSE_ATOL


@pytest.mark.parametrize("dv", [512, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_qv_split(dv, causal):
    """Split-KV: each split's partial O (every O slice) and LSE merged by the combine; with a sink,
    which joins there; dense and varlen."""
    skip_unless_compiled(64, torch.bfloat16)
    q, k, v, qv = inputs(2, 70, 1500, 8, 1, dv, torch.bfloat16, seed=dv + causal)
    sink = torch.randn(8, device="cuda")
    for splits in (3, 7):
        out, lse = flash_attn_func(q, k, v, qv=qv, causal=causal, num_splits=splits, learnable_sink=sink,
                                   return_attn_probs=True)
        ref, ref_lse, low = reference(q, k, v, qv, causal=causal, sink=sink)
        assert_fa_close(out, ref, low, name=f"out ({splits} splits)")
        assert (lse - ref_lse).abs().max().item() <= LSE_ATOL
    cu_q = torch.tensor([0, 70, 140], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 1500, 3000], dtype=torch.int32, device="cuda")
    packed = flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, 70, 1500,
                                    qv=qv.flatten(0, 1), causal=causal, num_splits=4)
    ref, _, low = reference(q, k, v, qv, causal=causal)
    assert_fa_close(packed.view_as(ref), ref, low, name="out (varlen, 4 splits)")


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("dv", [512, 256])
def test_qv_paged_decode(page_size, dv):
    """vLLM's MLA call: one latent cache (pages, page_size, d + dv) viewed as v = its first dv
    columns and k = the last d (one KV head), pages in a random order, through both entry points;
    causal chunked prefill (4 queries per sequence) and decode, splits chosen."""
    skip_unless_compiled(64, torch.bfloat16)
    from flash_attn_hopper import flash_attn_with_kvcache

    dtype, batch, heads, d = torch.bfloat16, 3, 16, 64
    lens = [300, 1, 129]
    gen = torch.Generator(device="cuda").manual_seed(page_size + dv)
    pages_per_seq = -(-max(lens) // page_size) + 1
    num_pages = batch * pages_per_seq + 3
    latent = draw((num_pages, page_size, 1, dv + d), dtype, gen)
    v_cache, k_cache = latent[..., :dv], latent[..., dv:]
    table = torch.randperm(num_pages, device="cuda", generator=gen)[: batch * pages_per_seq].view(batch, -1)
    table = table.to(torch.int32)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")

    def contiguous(b, n):  # sequence b's first n keys, gathered from its pages
        rows = latent[table[b].long()].flatten(0, 1)[:n]
        return rows[None, :, :, dv:], rows[None, :, :, :dv]

    for seqlen_q in (1, 4):
        q = draw((batch, seqlen_q, heads, d), dtype, gen)
        qv = draw((batch, seqlen_q, heads, dv), dtype, gen)
        out = flash_attn_with_kvcache(q, k_cache, v_cache, qv=qv, cache_seqlens=seqlens, page_table=table,
                                      causal=True)
        cu_q = torch.arange(0, (batch + 1) * seqlen_q, seqlen_q, dtype=torch.int32, device="cuda")
        out_v = flash_attn_varlen_func(q.flatten(0, 1), k_cache, v_cache, cu_q, None, seqlen_q, max(lens),
                                       seqused_k=seqlens, page_table=table, qv=qv.flatten(0, 1), causal=True)
        for b, n in enumerate(lens):
            k, v = contiguous(b, n)
            ref, _, low = reference(q[b:b + 1], k, v, qv[b:b + 1], causal=True)
            assert_fa_close(out[b:b + 1], ref, low, name=f"out {b} (kvcache, {seqlen_q} queries)")
            assert_fa_close(out_v.view_as(out)[b:b + 1], ref, low, name=f"out {b} (varlen, {seqlen_q} queries)")
