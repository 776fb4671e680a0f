"""The transformers integration on the GPU, with a stand-in attention module: causal
prefill and decoding run our kernel and match transformers' "sdpa" semantics by
FlashAttention's rule; padding masks are computed by torch, bitwise as transformers'
"sdpa" computes them.
"""

from __future__ import annotations

import types

import pytest
import torch

from flash_attn_hopper.integrations import transformers as fah_transformers

from helpers.inputs import sdpa_inputs
from helpers.kernels import compiled_config, cuda_kernel_names, is_our_forward_kernel
from reference import assert_fa_close, sdpa_ref

pytestmark = pytest.mark.gpu


def module(groups, is_causal=True):
    return types.SimpleNamespace(num_key_value_groups=groups, is_causal=is_causal, training=False)


@pytest.mark.parametrize("q_len, kv_len", [(512, 512), (1, 700), (1, 1)])
@pytest.mark.parametrize("groups", [1, 4])
def test_prefill_and_decoding_run_our_kernel(q_len, kv_len, groups):
    e, dtype = compiled_config()
    q, k, v = sdpa_inputs(2, 8, 8 // groups, q_len, kv_len, e, dtype, seed=1)
    layer = module(groups)
    call = lambda: fah_transformers.attention_forward(layer, q, k, v, None, scaling=e**-0.5)  # noqa: E731
    names = cuda_kernel_names(call)
    assert any(map(is_our_forward_kernel, names)), names
    out, weights = call()
    assert weights is None and out.shape == (2, q_len, 8, e) and out.is_contiguous()
    causal = q_len > 1  # transformers' rule for is_causal=None without a mask
    ref = sdpa_ref(q, k, v, causal, e**-0.5).transpose(1, 2)
    low = sdpa_ref(q, k, v, causal, e**-0.5, upcast=False).transpose(1, 2)
    assert_fa_close(out, ref, low)


def test_padding_mask_is_torchs_sdpa_bitwise():
    e, dtype = compiled_config()
    q, k, v = sdpa_inputs(2, 8, 2, 64, 64, e, dtype, seed=4)
    keep = torch.ones(2, 1, 64, 64, dtype=torch.bool, device="cuda").tril()
    keep[1, :, :, :10] = False  # left padding
    keep[1, :, :10, 0] = True
    out, _ = fah_transformers.attention_forward(module(4), q, k, v, keep)
    k4, v4 = (t.repeat_interleave(4, dim=1) for t in (k, v))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k4, v4, attn_mask=keep).transpose(1, 2)
    assert torch.equal(out, expected)
