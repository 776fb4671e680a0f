"""Split-KV forward on the GPU (num_splits != 1): the split kernels plus the combine against the
float32 reference by FlashAttention's rule and against the unsplit kernel, on decode shapes and
beyond (one and a few query tokens, long caches, GQA, causal, windows, varlen with seqused), with
poisoned outputs; fixed splits bitwise repeatable; softcap runs unsplit, a sink joins in the
combine; gradients through a split forward."""
from __future__ import annotations

import functools

import pytest
import torch

from flash_attn_hopper import flash_attn_func, flash_attn_varlen_func, ops

from helpers.grads import check_grads
from helpers.inputs import poison_allocations, qkv, varlen_qkv
from helpers.kernels import compiled_config, cuda_kernel_names
from reference import assert_fa_close, attention_ref, attention_ref_varlen

pytestmark = pytest.mark.gpu

CASES = [
    # batch, seqlen_q, seqlen_k, hq, hk, causal, window
    (1, 1, 8192, 32, 8, False, (-1, -1)),  # decode, GQA 4
    (4, 1, 1000, 8, 1, True, (-1, -1)),  # MQA, a partial last block
    (2, 5, 3000, 16, 4, True, (-1, -1)),  # speculative decoding: a few tokens, causal
    (1, 3, 4096, 8, 8, False, (700, 0)),  # a sliding window smaller than the cache
    (3, 130, 2049, 4, 2, True, (-1, -1)),  # two query tiles
]


@pytest.mark.parametrize("splits", [0, 3, 16])
@pytest.mark.parametrize("batch, sq, sk, hq, hk, causal, window", CASES)
def test_against_the_reference_and_the_unsplit_kernel(batch, sq, sk, hq, hk, causal, window, splits):
    d, dtype = compiled_config("fwd")
    q, k, v = qkv(batch, sq, sk, hq, hk, d, dtype=dtype, seed=sq + sk + splits)
    poison_allocations(((batch, sq, hq, d), dtype), ((batch, hq, sq), torch.float32))
    out, lse = flash_attn_func(q, k, v, causal=causal, window_size=window, num_splits=splits, return_attn_probs=True)
    ref, lse_ref = attention_ref(q, k, v, causal=causal, window_size=window)
    low, lse_low = attention_ref(q, k, v, causal=causal, window_size=window, upcast=False)
    assert_fa_close(out, ref, low, name="out")
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite)
    assert_fa_close(lse[finite], lse_ref[finite], lse_low[finite], name="lse", atol=1e-3)
    plain, plain_lse = flash_attn_func(q, k, v, causal=causal, window_size=window, return_attn_probs=True)
    assert (out.float() - plain.float()).abs().max() <= 2 * (plain.float() - ref).abs().max() + 1e-3


def test_splits_run_the_combine_and_are_bitwise_repeatable():
    d, dtype = compiled_config("fwd")
    q, k, v = qkv(2, 1, 16384, 16, 2, d, dtype=dtype, seed=3)
    names = cuda_kernel_names(lambda: flash_attn_func(q, k, v, num_splits=8))
    assert any("combine" in n for n in names), names
    assert not any("combine" in n for n in cuda_kernel_names(lambda: flash_attn_func(q, k, v))), "split without asking"
    first = flash_attn_func(q, k, v, num_splits=8, return_attn_probs=True)
    for _ in range(5):
        again = flash_attn_func(q, k, v, num_splits=8, return_attn_probs=True)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


def test_softcap_runs_unsplit_and_a_sink_joins_in_the_combine():
    d, dtype = compiled_config("fwd")
    q, k, v = qkv(1, 1, 4096, 8, 2, d, dtype=dtype, seed=4)
    names = cuda_kernel_names(lambda: flash_attn_func(q, k, v, num_splits=8, softcap=20.0))
    assert not any("combine" in n for n in names), names
    assert torch.equal(flash_attn_func(q, k, v, num_splits=8, softcap=20.0), flash_attn_func(q, k, v, softcap=20.0))
    sink = torch.randn(8, device="cuda") + 3  # large enough to matter
    names = cuda_kernel_names(lambda: flash_attn_func(q, k, v, num_splits=8, learnable_sink=sink))
    assert any("combine" in n for n in names), names
    out, lse = flash_attn_func(q, k, v, num_splits=8, learnable_sink=sink, return_attn_probs=True)
    ref, lse_ref = attention_ref(q, k, v, sink=sink)
    low, _ = attention_ref(q, k, v, sink=sink, upcast=False)
    assert_fa_close(out, ref, low, name="out")
    assert torch.allclose(lse, lse_ref, atol=1e-3)
    empty = flash_attn_func(q[:, :0], k, v, num_splits=8, learnable_sink=sink)  # nothing to compute
    assert empty.shape == (1, 0, 8, d)


def test_varlen_with_seqused_and_rows_outside_every_sequence():
    d, dtype = compiled_config("fwd")
    q, k, v, _, cu_q, cu_k, max_q, max_k = varlen_qkv([1, 3, 0, 2], [3000, 5000, 100, 0], 8, 2, d, dtype=dtype,
                                                      device="cuda", seed=5)
    used_k = torch.tensor([2500, 5000, 100, 0], dtype=torch.int32, device="cuda")
    used_q = torch.tensor([1, 2, 0, 2], dtype=torch.int32, device="cuda")
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, seqused_q=used_q, seqused_k=used_k,
                                      causal=True, num_splits=6, return_attn_probs=True)
    ref = functools.partial(attention_ref_varlen, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_q=used_q,
                            seqused_k=used_k)
    (ro, rl), (lo, ll) = ref(q, k, v, causal=True), ref(q, k, v, causal=True, upcast=False)
    assert_fa_close(out, ro, lo, name="out")
    finite = torch.isfinite(rl)
    assert torch.equal(torch.isfinite(lse), finite)
    assert_fa_close(lse[finite], rl[finite], ll[finite], name="lse", atol=1e-3)
    gap = 3  # row 3 (sequence 1's third query) is outside seqused_q: 0 and -inf
    assert torch.equal(out[gap], torch.zeros_like(out[gap])) and torch.isneginf(lse[:, gap]).all()


def test_varlen_rows_past_the_last_sequence_come_out_empty():
    """Rows of q past cu_seqlens_q[-1] belong to no sequence: the combine writes them as 0 and
    -inf (it reads the bound from cu_seqlens_q) and the sequences' rows match the reference."""
    d, dtype = compiled_config("fwd")
    q, k, v, _, cu_q, cu_k, max_q, max_k = varlen_qkv([2, 1, 3], [3000, 700, 4100], 8, 2, d, dtype=dtype,
                                                      device="cuda", seed=6)
    q_long = torch.cat([q, torch.randn(5, *q.shape[1:], device="cuda", dtype=dtype)])
    out, lse = flash_attn_varlen_func(q_long, k, v, cu_q, cu_k, max_q, max_k, num_splits=16,
                                      return_attn_probs=True)
    ref = functools.partial(attention_ref_varlen, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    (ro, _), (lo, _) = ref(q, k, v), ref(q, k, v, upcast=False)
    rows = q.shape[0]
    assert_fa_close(out[:rows], ro, lo, name="out")
    assert torch.equal(out[rows:], torch.zeros_like(out[rows:])) and torch.isneginf(lse[:, rows:]).all()


def test_gradients_through_a_split_forward():
    if not ops.has_bwd_op():
        pytest.skip("this build has no backward")
    d, dtype = compiled_config("bwd")
    q, k, v = qkv(2, 3, 2048, 8, 2, d, dtype=dtype, seed=6)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = flash_attn_func(*leaves, causal=True, num_splits=4)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)
    check_grads(grads, q, k, v, dout, causal=True)
