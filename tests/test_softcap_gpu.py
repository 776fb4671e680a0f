"""softcap on the GPU: the softcap kernels (forward and backward) against the float32 reference
(scaled scores s -> softcap * tanh(s / softcap) before the mask) by FlashAttention's rule, over
head dims x dtypes x masks x GQA x awkward lengths, with poisoned outputs; varlen, deterministic
mode (bitwise repeatable), strided inputs, and the softcap kernels really running."""
from __future__ import annotations

import functools

import pytest
import torch

from flash_attn_hopper import _build_info, flash_attn_func, flash_attn_varlen_func, ops

from helpers.cases import DTYPE_IDS, DTYPES, HDIMS, NHEADS_KV, STRIDED_LAYOUTS
from helpers.grads import check_grads, deterministic_algorithms
from helpers.inputs import poison_allocations, qkv, varlen_qkv
from helpers.kernels import compiled_config, cuda_kernel_names, is_our_forward_kernel, skip_unless_compiled
from reference import assert_fa_close, attention_ref, attention_ref_varlen

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _build_info.compiled_feature("softcap"),
                       reason="this build left the softcap kernels out (FLASH_ATTN_HOPPER_DISABLE_SOFTCAP=1)"),
]

#: (seqlen_q, seqlen_k): one query, more keys than queries and the reverse (causal rows that see
#: nothing), one past a block, and one long enough for the long-keys tiles.
PAIRS = [(1, 239), (113, 203), (799, 3), (1024, 1024), (257, 4200)]
MASKS = {"none": dict(), "causal": dict(causal=True), "window": dict(window_size=(37, 5))}


def _forward_check(q, k, v, softcap, **kwargs):
    out, lse = flash_attn_func(q, k, v, softcap=softcap, return_attn_probs=True, **kwargs)
    ref, lse_ref = attention_ref(q, k, v, softcap=softcap, **kwargs)
    low, lse_low = attention_ref(q, k, v, softcap=softcap, upcast=False, **kwargs)
    assert_fa_close(out, ref, low, name="out")
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite)
    assert_fa_close(lse[finite], lse_ref[finite], lse_low[finite], name="lse", atol=1e-3)
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("sq, sk", PAIRS)
@pytest.mark.parametrize("gqa", [1, 4])
def test_forward(dtype, d, mask, sq, sk, gqa):
    skip_unless_compiled(d, dtype)
    q, k, v = qkv(2, sq, sk, NHEADS_KV * gqa, NHEADS_KV, d, dtype=dtype, seed=sq + sk + d)
    q = q * 4  # scores well into tanh's bend, so that a kernel without the cap fails
    poison_allocations(((2, sq, NHEADS_KV * gqa, d), dtype), ((2, NHEADS_KV * gqa, sq), torch.float32))
    _forward_check(q, k, v, 5.0, **MASKS[mask])


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("d", HDIMS)
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("sq, sk", PAIRS[:4])
def test_backward(dtype, d, mask, sq, sk):
    skip_unless_compiled(d, dtype, ("fwd", "bwd"))
    q, k, v = qkv(2, sq, sk, 6, NHEADS_KV, d, dtype=dtype, seed=sq * 3 + d)
    q = q * 4
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = flash_attn_func(*leaves, softcap=2.0, **MASKS[mask])
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)
    check_grads(grads, q, k, v, dout, softcap=2.0, **MASKS[mask])


@pytest.mark.parametrize("softcap", [0.5, 30.0])
def test_softcap_values_and_the_kernels_that_run(softcap):
    d, dtype = compiled_config("bwd" if ops.has_bwd_op() else "fwd")
    q, k, v = qkv(2, 300, 300, 4, 2, d, dtype=dtype, seed=11)
    out = _forward_check(q * 3, k, v, softcap, causal=True)
    plain = flash_attn_func(q * 3, k, v, causal=True)
    assert (out.float() - plain.float()).abs().max() > 1e-3, "softcap changed nothing"
    # The softcap kernel is an instantiation of its own (FwdPolicy's kSoftcap), not the plain one.
    capped = [n for n in cuda_kernel_names(lambda: flash_attn_func(q, k, v, causal=True, softcap=softcap))
              if is_our_forward_kernel(n)]
    uncapped = [n for n in cuda_kernel_names(lambda: flash_attn_func(q, k, v, causal=True))
                if is_our_forward_kernel(n)]
    assert len(capped) == len(uncapped) == 1 and capped != uncapped, (capped, uncapped)


@pytest.mark.parametrize("layout", STRIDED_LAYOUTS)
def test_strided_inputs(layout):
    d, dtype = compiled_config("bwd" if ops.has_bwd_op() else "fwd")
    q, k, v = qkv(2, 190, 211, 4, 2, d, dtype=dtype, seed=5, layout=layout)
    _forward_check(q, k, v, 3.0, causal=True)


def test_varlen_forward_and_backward():
    d, dtype = compiled_config("bwd" if ops.has_bwd_op() else "fwd")
    skip_unless_compiled(d, dtype)
    q, k, v, dout, cu_q, cu_k, max_q, max_k = varlen_qkv([130, 0, 1, 77, 300], [200, 5, 64, 0, 300], 4, 2, d,
                                                         dtype=dtype, device="cuda", seed=3)
    q = q * 3
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, lse = flash_attn_varlen_func(*leaves, cu_q, cu_k, max_q, max_k, causal=True, softcap=4.0,
                                      return_attn_probs=True)
    ref = functools.partial(attention_ref_varlen, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    (ro, rl), (lo, ll) = ref(q, k, v, causal=True, softcap=4.0), ref(q, k, v, causal=True, softcap=4.0, upcast=False)
    assert_fa_close(out, ro, lo, name="out")
    assert_fa_close(lse, rl, ll, name="lse", atol=1e-3)
    if not ops.has_varlen_bwd_op():
        return
    grads = torch.autograd.grad(out, leaves, dout)
    check_grads(grads, q, k, v, dout, causal=True, softcap=4.0, attention=ref)


def test_deterministic_backward_is_bitwise_repeatable():
    if not ops.has_bwd_op():
        pytest.skip("this build has no backward")
    d, dtype = compiled_config("bwd")
    q, k, v = qkv(2, 513, 513, 8, 2, d, dtype=dtype, seed=9)
    leaves = [t.detach().requires_grad_() for t in (q * 3, k, v)]
    dout = torch.randn(2, 513, 8, d, device="cuda", dtype=dtype)
    with deterministic_algorithms():
        first = torch.autograd.grad(flash_attn_func(*leaves, causal=True, softcap=3.0), leaves, dout)
        for _ in range(10):
            again = torch.autograd.grad(flash_attn_func(*leaves, causal=True, softcap=3.0), leaves, dout)
            assert all(torch.equal(a, b) for a, b in zip(first, again))
    check_grads(first, *(t.detach() for t in leaves), dout, causal=True, softcap=3.0)
