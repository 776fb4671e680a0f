"""attention_chunk on the GPU: flash_attn_func and flash_attn_varlen_func over the varlen kernels,
against the float32 reference with the chunk mask, forward and backward."""
from __future__ import annotations

import pytest
import torch

from flash_attn_hopper import flash_attn_func, flash_attn_varlen_func, ops

from helpers.grads import check_grads
from helpers.inputs import qkv, varlen_qkv
from helpers.kernels import compiled_config
from reference import assert_fa_close, attention_ref_chunked, attention_ref_chunked_varlen

pytestmark = pytest.mark.gpu


def check_out_and_lse(out, lse, ref, lse_ref, low):
    """out by FlashAttention's rule against the float32 reference (low: the same in the inputs'
    dtype); the LSE infinite exactly where the reference's is, else within 1e-3."""
    assert_fa_close(out, ref, low, name="out")
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse - lse_ref)[finite].abs().max().item() < 1e-3


@pytest.mark.parametrize("sq, sk, chunk, causal", [(1000, 1000, 256, True), (300, 1100, 128, True),
                                                   (777, 777, 100, False), (5, 4096, 1024, True)])
def test_chunked(sq, sk, chunk, causal):
    d, dtype = compiled_config("bwd" if ops.has_varlen_bwd_op() else "fwd")
    q, k, v = qkv(2, sq, sk, 8, 2, d, dtype=dtype, seed=sq + chunk)
    out, lse = flash_attn_func(q, k, v, causal=causal, attention_chunk=chunk, return_attn_probs=True)
    ref, lse_ref = attention_ref_chunked(q, k, v, chunk=chunk, causal=causal)
    low, _ = attention_ref_chunked(q, k, v, chunk=chunk, causal=causal, upcast=False)
    check_out_and_lse(out, lse, ref, lse_ref, low)
    if not ops.has_varlen_bwd_op():
        return
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o = flash_attn_func(q, k, v, causal=causal, attention_chunk=chunk)
    dout = torch.randn_like(o)
    check_grads(torch.autograd.grad(o, (q, k, v), dout), q, k, v, dout,
                attention=lambda q, k, v, upcast=True: attention_ref_chunked(q, k, v, chunk=chunk, causal=causal,
                                                                            upcast=upcast))


@pytest.mark.parametrize("lens_q, lens_k, chunk, causal, used", [
    ([1000, 1, 0, 300, 77], [1000, 700, 9, 1100, 77], 256, True, False),
    ([513, 64, 900], [600, 64, 700], 100, False, False),
    ([700, 260], [1100, 300], 128, True, True),
])
def test_varlen_chunked(lens_q, lens_k, chunk, causal, used):
    d, dtype = compiled_config("bwd" if ops.has_varlen_bwd_op() else "fwd")
    q, k, v, dout, cu_q, cu_k, max_q, max_k = varlen_qkv(lens_q, lens_k, 8, 2, d, dtype=dtype, seed=chunk)
    used_q = torch.tensor([n - 7 if n > 7 else n for n in lens_q], dtype=torch.int32, device="cuda") if used else None
    used_k = torch.tensor([n - 3 if n > 3 else n for n in lens_k], dtype=torch.int32, device="cuda") if used else None

    def ours(q, k, v, lse=False):
        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, seqused_q=used_q, seqused_k=used_k,
                                      causal=causal, attention_chunk=chunk, return_attn_probs=lse)

    def ref(q, k, v, upcast=True):
        return attention_ref_chunked_varlen(q, k, v, cu_q, cu_k, used_q, used_k, upcast=upcast, chunk=chunk,
                                            causal=causal)

    out, lse = ours(q, k, v, lse=True)
    ref_out, ref_lse = ref(q, k, v)
    low, _ = ref(q, k, v, upcast=False)
    check_out_and_lse(out, lse, ref_out, ref_lse, low)
    if not ops.has_varlen_bwd_op():
        return
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    check_grads(torch.autograd.grad(ours(q, k, v), (q, k, v), dout), q, k, v, dout, attention=ref)
