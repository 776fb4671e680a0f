"""attention_chunk on the GPU: flash_attn_func over the varlen kernels, against the float32
reference with the chunk mask, forward and backward."""
from __future__ import annotations

import pytest
import torch

from flash_attn_hopper import flash_attn_func, ops

from helpers.grads import check_grads
from helpers.inputs import qkv
from helpers.kernels import compiled_config
from reference import assert_fa_close, attention_ref_chunked

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("sq, sk, chunk, causal", [(1000, 1000, 256, True), (300, 1100, 128, True),
                                                   (777, 777, 100, False), (5, 4096, 1024, True)])
def test_chunked(sq, sk, chunk, causal):
    d, dtype = compiled_config("bwd" if ops.has_varlen_bwd_op() else "fwd")
    q, k, v = qkv(2, sq, sk, 8, 2, d, dtype=dtype, seed=sq + chunk)
    out, lse = flash_attn_func(q, k, v, causal=causal, attention_chunk=chunk, return_attn_probs=True)
    ref, lse_ref = attention_ref_chunked(q, k, v, chunk=chunk, causal=causal)
    low, _ = attention_ref_chunked(q, k, v, chunk=chunk, causal=causal, upcast=False)
    assert_fa_close(out, ref, low, name="out")
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse - lse_ref)[finite].abs().max().item() < 1e-3
    if not ops.has_varlen_bwd_op():
        return
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o = flash_attn_func(q, k, v, causal=causal, attention_chunk=chunk)
    dout = torch.randn_like(o)
    check_grads(torch.autograd.grad(o, (q, k, v), dout), q, k, v, dout,
                attention=lambda q, k, v, upcast=True: attention_ref_chunked(q, k, v, chunk=chunk, causal=causal,
                                                                            upcast=upcast))
