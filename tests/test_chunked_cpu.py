"""attention_chunk (FA3's chunked local attention) in flash_attn_func and flash_attn_varlen_func, on
CPU over the emulated varlen ops: against a float32 reference with the chunk mask, forward and
backward, with causal, windows, GQA, seqlen_q != seqlen_k (both ways), chunks that do not divide the
keys, and (varlen) sequences of length 0 and 1 and seqused_q / seqused_k."""
from __future__ import annotations

import pytest
import torch

import flash_attn_hopper
from flash_attn_hopper.interface import _chunk_segments

from helpers.grads import EMULATION_REL_NORM, check_grads, grads_of
from helpers.inputs import cpu_inputs, varlen_qkv
from op_emulator import emulated_varlen_ops
from reference import assert_fa_close, attention_ref_chunked as chunked_ref, attention_ref_chunked_varlen

DTYPE = torch.float16


@pytest.mark.parametrize("sq, sk, chunk, causal, window", [
    (40, 40, 16, True, (-1, -1)),
    (40, 40, 16, False, (-1, -1)),
    (12, 50, 16, True, (-1, -1)),   # decode-like: the queries sit in the last chunks
    (50, 30, 8, True, (-1, -1)),    # more queries than keys: the first 20 see nothing
    (33, 33, 7, False, (5, 2)),     # a window inside the chunks
    (64, 64, 64, True, (-1, -1)),   # one chunk: plain causal
])
def test_chunked_against_the_reference(monkeypatch, sq, sk, chunk, causal, window):
    q, k, v, dout = cpu_inputs(2, sq, sk, 4, 2, 64, sq + chunk, DTYPE)
    with emulated_varlen_ops(monkeypatch):
        out, lse = flash_attn_hopper.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                                     attention_chunk=chunk, return_attn_probs=True)
        ref, lse_ref = chunked_ref(q, k, v, chunk=chunk, causal=causal, window_size=window)
        low, lse_low = chunked_ref(q, k, v, chunk=chunk, causal=causal, window_size=window, upcast=False)
        assert out.shape == q.shape and lse.shape == (2, 4, sq)
        assert_fa_close(out, ref, low, name="out")
        finite = torch.isfinite(lse_ref)
        assert torch.equal(torch.isfinite(lse), finite)
        assert_fa_close(lse[finite], lse_ref[finite], lse_low[finite], name="lse", atol=1e-4)
        _, grads = grads_of(lambda q, k, v: flash_attn_hopper.flash_attn_func(
            q, k, v, causal=causal, window_size=window, attention_chunk=chunk), q, k, v, dout)
        check_grads(grads, q, k, v, dout, max_rel_norm=EMULATION_REL_NORM,
                    attention=lambda q, k, v, upcast=True: chunked_ref(q, k, v, chunk=chunk, causal=causal,
                                                                       window_size=window, upcast=upcast))


def test_segments_cover_every_row_once():
    for sq, sk, chunk in [(40, 40, 16), (12, 50, 16), (50, 30, 8), (1, 1000, 128), (7, 0, 4)]:
        cu_q, cu_k, max_q, max_k = _chunk_segments(3, sq, sk, chunk)
        assert cu_q[0] == cu_k[0] == 0 and cu_q[-1] == 3 * sq and cu_k[-1] == 3 * sk
        assert all(a <= b for a, b in zip(cu_q, cu_q[1:])) and all(a <= b for a, b in zip(cu_k, cu_k[1:]))
        assert len(cu_q) == len(cu_k) and max_k <= chunk


@pytest.mark.parametrize("bad", [-4, 2.5, True])
def test_bad_chunks_are_refused(bad):
    q, k, v, _ = cpu_inputs(1, 8, 8, 2, 2, 64, 0, DTYPE)
    with pytest.raises(ValueError, match="attention_chunk must be a non-negative int"):
        flash_attn_hopper.flash_attn_func(q, k, v, attention_chunk=bad)


@pytest.mark.parametrize("lens_q, lens_k, chunk, causal, window, used", [
    ([40, 1, 0, 23], [40, 30, 5, 60], 16, True, (-1, -1), False),   # a 1-query decode, an empty sequence
    ([12, 50, 7], [50, 30, 7], 8, False, (-1, -1), False),           # more queries than keys in one
    ([33, 20], [33, 41], 7, False, (5, 2), False),                    # a window inside the chunks
    ([30, 25, 9], [40, 25, 20], 8, True, (-1, -1), True),             # seqused_q / seqused_k shorter
    ([30, 9], [39, 20], 8, False, (-1, -1), True),  # 27 used queries at positions 7..33 span all 5 segments
])
def test_varlen_chunked_against_the_reference(monkeypatch, lens_q, lens_k, chunk, causal, window, used):
    q, k, v, dout, cu_q, cu_k, max_q, max_k = varlen_qkv(lens_q, lens_k, 4, 2, 64, dtype=DTYPE, device="cpu",
                                                         seed=len(lens_q), draw_dtype=torch.float32)
    used_q = torch.tensor([max(n - 3, 0) for n in lens_q], dtype=torch.int32) if used else None
    used_k = torch.tensor([max(n - 5, 0) for n in lens_k], dtype=torch.int32) if used else None
    opts = dict(chunk=chunk, causal=causal, window_size=window)

    def ours(q, k, v, lse=False):
        return flash_attn_hopper.flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, max_q, max_k, seqused_q=used_q, seqused_k=used_k, causal=causal,
            window_size=window, attention_chunk=chunk, return_attn_probs=lse)

    def ref(q, k, v, upcast=True):
        return attention_ref_chunked_varlen(q, k, v, cu_q, cu_k, used_q, used_k, upcast=upcast, **opts)

    with emulated_varlen_ops(monkeypatch):
        out, lse = ours(q, k, v, lse=True)
        ref_out, ref_lse = ref(q, k, v)
        low_out, low_lse = ref(q, k, v, upcast=False)
        assert out.shape == q.shape and lse.shape == (4, q.size(0))
        assert_fa_close(out, ref_out, low_out, name="out")
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), finite)
        assert_fa_close(lse[finite], ref_lse[finite], low_lse[finite], name="lse", atol=1e-4)
        _, grads = grads_of(ours, q, k, v, dout)
        check_grads(grads, q, k, v, dout, max_rel_norm=EMULATION_REL_NORM, attention=ref)


def test_varlen_chunked_takes_no_page_table():
    q, k, v, _, cu_q, cu_k, max_q, max_k = varlen_qkv([4], [4], 2, 2, 64, dtype=DTYPE, device="cpu")
    with pytest.raises(ValueError, match="attention_chunk or page_table, not both"):
        flash_attn_hopper.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, attention_chunk=2,
                                                 page_table=torch.zeros(1, 1, dtype=torch.int32))


@pytest.mark.parametrize("bad", [-4, 2.5, True])
def test_bad_varlen_chunks_are_refused(bad):
    q, k, v, _, cu_q, cu_k, max_q, max_k = varlen_qkv([4], [4], 2, 2, 64, dtype=DTYPE, device="cpu")
    with pytest.raises(ValueError, match="attention_chunk must be a non-negative int"):
        flash_attn_hopper.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, attention_chunk=bad)


@pytest.mark.parametrize("change, match", [
    (dict(max_seqlen_q=None), "max_seqlen_q must be a non-negative int"),
    (dict(cu_seqlens_k=torch.tensor([0, 4])), "cu_seqlens_k must be a 1-D int32 tensor"),
    (dict(seqused_k=torch.tensor([4, 4], dtype=torch.int32)), r"seqused_q / seqused_k \(batch,\)"),
])
def test_malformed_varlen_chunk_calls_are_refused(change, match):
    q, k, v, _, cu_q, cu_k, max_q, max_k = varlen_qkv([4], [4], 2, 2, 64, dtype=DTYPE, device="cpu")
    call = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k,
                attention_chunk=2)
    with pytest.raises(ValueError, match=match):
        flash_attn_hopper.flash_attn_varlen_func(**dict(call, **change))


def test_varlen_chunked_compiles_fullgraph_as_eager(monkeypatch):
    # The segments come from tensor ops on cu_seqlens (no host read), so dynamo traces one graph.
    q, k, v, dout, cu_q, cu_k, max_q, max_k = varlen_qkv([9, 1, 14], [9, 6, 20], 4, 2, 64, dtype=DTYPE, device="cpu",
                                                         seed=5, draw_dtype=torch.float32)

    def block(q, k, v):
        return flash_attn_hopper.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True,
                                                        attention_chunk=4) * 2

    with emulated_varlen_ops(monkeypatch):
        torch._dynamo.reset()
        try:
            out_c, grads_c = grads_of(torch.compile(block, fullgraph=True, backend="aot_eager"), q, k, v, dout)
        finally:
            torch._dynamo.reset()
        out_e, grads_e = grads_of(block, q, k, v, dout)
    assert torch.equal(out_c, out_e)
    assert all(torch.equal(a, b) for a, b in zip(grads_c, grads_e))
