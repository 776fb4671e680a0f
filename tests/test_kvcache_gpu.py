"""flash_attn_with_kvcache on the GPU: the varlen kernels over a cache read in place, after the
in-place append (with rotary), against the float32 reference (tests/test_kvcache_cpu.py's), with
splits 1 / 3 / 0, GQA, causal, leftpad; bitwise repeatable with fixed splits; a decode step captured
in a CUDA graph and replayed with new cache_seqlens."""
from __future__ import annotations

import math

import pytest
import torch

from flash_attn_hopper import flash_attn_with_kvcache

from helpers.kernels import compiled_config, cuda_kernel_names
from reference import assert_fa_close
from test_kvcache_cpu import reference, rotary_ref

pytestmark = pytest.mark.gpu


def _inputs(batch, sq, snew, cache_len, hq, hk, d, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=g).to(dtype)  # noqa: E731
    return (rnd(batch, sq, hq, d), rnd(batch, cache_len, hk, d), rnd(batch, cache_len, hk, d),
            rnd(batch, snew, hk, d) if snew else None, rnd(batch, snew, hk, d) if snew else None)


@pytest.mark.parametrize("pack_gqa", [None, False])
@pytest.mark.parametrize("splits", [1, 3, 0])
@pytest.mark.parametrize("sq, snew, hq, hk, causal, rotary, leftpad", [
    (1, 1, 32, 8, True, True, False),
    (4, 4, 8, 1, True, False, True),
    (1, 0, 16, 2, False, False, False),
    (6, 2, 8, 8, True, True, True),
])
def test_against_the_reference(sq, snew, hq, hk, causal, rotary, leftpad, splits, pack_gqa):
    d, dtype = compiled_config("fwd")
    batch, cache_len = 4, 3000
    q, k_cache, v_cache, k, v = _inputs(batch, sq, snew, cache_len, hq, hk, d, dtype, seed=sq + snew + splits)
    seqlens = torch.tensor([1, 700, 2500, 2990], dtype=torch.int32, device="cuda")
    pad = torch.tensor([0, 100, 2000, 5], dtype=torch.int32, device="cuda") if leftpad else None
    cos = sin = None
    if rotary:
        angle = torch.rand(cache_len + 16, d // 4, device="cuda") * 2 * math.pi
        cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    k_ref, v_ref, q_ref = k_cache.clone(), v_cache.clone(), q
    if k is not None:
        pos = seqlens.long()[:, None] + torch.arange(snew, device="cuda")
        k_rot = rotary_ref(k.cpu(), cos.cpu(), sin.cpu(), pos.cpu(), True).cuda() if rotary else k
        for b in range(batch):
            n = min(snew, cache_len - int(seqlens[b]))
            k_ref[b, int(seqlens[b]):int(seqlens[b]) + n] = k_rot[b, :n]
            v_ref[b, int(seqlens[b]):int(seqlens[b]) + n] = v[b, :n]
        if rotary:
            q_pos = seqlens.long()[:, None] + torch.arange(sq, device="cuda")
            q_ref = rotary_ref(q.cpu(), cos.cpu(), sin.cpu(), q_pos.cpu(), True).cuda()
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin,
                                       cache_seqlens=seqlens, cache_leftpad=pad, causal=causal,
                                       num_splits=splits, pack_gqa=pack_gqa, return_softmax_lse=True)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    ends = torch.clamp(seqlens + snew, max=cache_len)
    lo = pad if pad is not None else torch.zeros_like(seqlens)
    ref, lse_ref = reference(q_ref, k_ref, v_ref, ends.cpu(), lo.cpu(), causal=causal)
    low, _ = reference(q_ref, k_ref, v_ref, ends.cpu(), lo.cpu(), causal=causal, upcast=False)
    assert_fa_close(out, ref, low, name="out")
    finite = torch.isfinite(lse_ref)
    assert torch.allclose(lse[finite], lse_ref[finite], atol=2e-3)


def test_fixed_splits_are_bitwise_repeatable_and_a_graph_replays_with_new_lengths():
    d, dtype = compiled_config("fwd")
    q, k_cache, v_cache, _, _ = _inputs(8, 1, 0, 8192, 32, 8, d, dtype, seed=1)
    seqlens = torch.full((8,), 4000, dtype=torch.int32, device="cuda")
    first = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, num_splits=4)
    assert all(torch.equal(first, flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, num_splits=4))
               for _ in range(5))
    static = {"seqlens": seqlens.clone()}
    flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=static["seqlens"], num_splits=4)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static["out"] = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=static["seqlens"], num_splits=4)
    for n in (4000, 123, 8192):
        static["seqlens"].fill_(n)
        graph.replay()
        want = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=torch.full_like(seqlens, n), num_splits=4)
        assert torch.equal(static["out"], want), n


def test_lengths_outside_the_cache_are_clamped_and_a_capture_keeps_no_constants():
    # Without appends the lengths reach the kernels unclamped (seqused_k): they clamp them to the cache.
    d, dtype = compiled_config("fwd")
    q, k_cache, v_cache, _, _ = _inputs(3, 1, 0, 1000, 16, 4, d, dtype, seed=7)
    wild = torch.tensor([-5, 400, 5000], dtype=torch.int32, device="cuda")
    tame = torch.tensor([0, 400, 1000], dtype=torch.int32, device="cuda")
    for splits in (1, 0):
        got = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=wild, num_splits=splits)
        assert torch.equal(got, flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=tame, num_splits=splits))
        assert torch.all(got[0] == 0)  # no keys: zeros, as FlashAttention-3
    # A call captured first (its offsets made inside the capture), then eager calls before any replay:
    # the eager ones must not see the capture's tensors, whose contents exist only after a replay.
    q5, k5, v5, _, _ = _inputs(5, 1, 0, 777, 16, 4, d, dtype, seed=8)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        captured = flash_attn_with_kvcache(q5, k5, v5, cache_seqlens=600)
    ref, _ = reference(q5, k5, v5, torch.full((5,), 600), torch.zeros(5, dtype=torch.int32), causal=False)
    low, _ = reference(q5, k5, v5, torch.full((5,), 600), torch.zeros(5, dtype=torch.int32), causal=False,
                       upcast=False)
    assert_fa_close(flash_attn_with_kvcache(q5, k5, v5, cache_seqlens=600), ref, low, name="eager after capture")
    graph.replay()
    assert_fa_close(captured, ref, low, name="replay")


def test_packed_new_tokens_with_cu_seqlens_k_new():
    from test_kvcache_cpu import _append_packed_ref
    d, dtype = compiled_config("fwd")
    g = torch.Generator(device="cuda").manual_seed(5)
    batch, cache_len, hq, hk = 3, 1000, 8, 2
    lens_new = [3, 0, 9]
    cu_new = torch.tensor([0, 3, 3, 12], dtype=torch.int32, device="cuda")
    seqlens = torch.tensor([17, 400, 995], dtype=torch.int32, device="cuda")
    q = torch.randn(batch, 1, hq, d, device="cuda", generator=g).to(dtype)
    k_cache, v_cache = (torch.randn(batch, cache_len, hk, d, device="cuda", generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(12, hk, d, device="cuda", generator=g).to(dtype) for _ in range(2))
    k_ref = _append_packed_ref(k_cache, k, cu_new.tolist(), seqlens.tolist())
    v_ref = _append_packed_ref(v_cache, v, cu_new.tolist(), seqlens.tolist())
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, cu_seqlens_k_new=cu_new,
                                  causal=True)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    ends = torch.clamp(seqlens + torch.tensor(lens_new, dtype=torch.int32, device="cuda"), max=cache_len)
    zeros = torch.zeros(batch, dtype=torch.int32)
    ref, _ = reference(q, k_ref, v_ref, ends.cpu(), zeros, causal=True)
    low, _ = reference(q, k_ref, v_ref, ends.cpu(), zeros, causal=True, upcast=False)
    assert_fa_close(out, ref, low, name="out")


@pytest.mark.parametrize("sq, chunk", [(1, 256), (7, 100)])
def test_attention_chunk(sq, chunk):
    from reference import attention_ref_chunked
    d, dtype = compiled_config("fwd")
    batch, cache_len, hq, hk = 3, 1000, 8, 2
    q, k_cache, v_cache, _, _ = _inputs(batch, sq, 0, cache_len, hq, hk, d, dtype, seed=chunk + sq)
    seqlens = torch.tensor([5, 300, 999], dtype=torch.int32, device="cuda")
    for splits in (1, 0):
        out = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, causal=True,
                                      attention_chunk=chunk, num_splits=splits)
        for b in range(batch):
            n = int(seqlens[b])
            ref, _ = attention_ref_chunked(q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n], chunk=chunk, causal=True)
            low, _ = attention_ref_chunked(q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n], chunk=chunk,
                                           causal=True, upcast=False)
            assert_fa_close(out[b:b + 1], ref, low, name=f"out {b} splits {splits}")


@pytest.mark.parametrize("splits", [1, 0])
def test_cache_batch_idx(splits):
    d, dtype = compiled_config("fwd")
    g = torch.Generator(device="cuda").manual_seed(31)
    batch, batch_cache, cache_len, hq, hk = 3, 6, 2000, 8, 2
    q = torch.randn(batch, 1, hq, d, device="cuda", generator=g).to(dtype)
    k_cache, v_cache = (torch.randn(batch_cache, cache_len, hk, d, device="cuda", generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(batch, 1, hk, d, device="cuda", generator=g).to(dtype) for _ in range(2))
    idx = torch.tensor([5, 0, 3], dtype=torch.int32, device="cuda")
    seqlens = torch.tensor([1999, 17, 700], dtype=torch.int32, device="cuda")
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    for b in range(batch):
        k_ref[int(idx[b]), int(seqlens[b])] = k[b, 0]
        v_ref[int(idx[b]), int(seqlens[b])] = v[b, 0]
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, cache_batch_idx=idx,
                                  causal=True, num_splits=splits)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    ends = (seqlens + 1).clamp(max=cache_len).cpu()
    picked_k, picked_v = k_ref[idx.long()], v_ref[idx.long()]
    ref, _ = reference(q, picked_k, picked_v, ends, torch.zeros(batch, dtype=torch.int32), causal=True)
    low, _ = reference(q, picked_k, picked_v, ends, torch.zeros(batch, dtype=torch.int32), causal=True, upcast=False)
    assert_fa_close(out, ref, low, name="out")


@pytest.mark.parametrize("batch", [1, 5])
def test_a_packed_decode_step_runs_the_split_kernel_and_the_combine_only(batch):
    """PackGQA at decode: the op takes the packed rows and the combine writes out and the LSE per
    query head, so no copy kernel unpacks them (at batch 1 the pack of q is a view too)."""
    d, dtype = compiled_config("fwd")
    q, k_cache, v_cache, _, _ = _inputs(batch, 1, 0, 3000, 32, 8, d, dtype, seed=11)
    seqlens = torch.full((batch,), 2900, dtype=torch.int32, device="cuda")
    with torch.no_grad():
        out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, return_softmax_lse=True)
        names = cuda_kernel_names(lambda: flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens))
    ends, lo = seqlens.cpu(), torch.zeros(batch, dtype=torch.int32)
    ref, lse_ref = reference(q, k_cache, v_cache, ends, lo, causal=False)
    low, _ = reference(q, k_cache, v_cache, ends, lo, causal=False, upcast=False)
    assert_fa_close(out, ref, low, name="out")
    assert torch.allclose(lse, lse_ref, atol=2e-3)
    copies = [n for n in names if "flash" not in n]
    assert (copies == []) if batch == 1 else len(copies) == 1, names  # batch > 1: the pack of q

