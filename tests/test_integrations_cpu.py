"""The Hugging Face transformers integration without transformers and without a GPU.

attention_forward is checked against the AttentionInterface contract with a stand-in
module (num_key_value_groups, is_causal, training): shapes in and out, causal rules,
GQA, masks computed by torch exactly, errors; the fast path runs the float32 emulation
of the op (op_emulator.py).  register() is checked against stand-in transformers modules.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from flash_attn_hopper import sdpa
from flash_attn_hopper.integrations import transformers as fah_transformers

from helpers.inputs import qkv
from op_emulator import emulated_op

BF16 = torch.bfloat16


def stand_in_module(num_key_value_groups=None, is_causal=True, training=False):
    """What transformers' attention layers offer the attention function."""
    module = types.SimpleNamespace(is_causal=is_causal, training=training)
    if num_key_value_groups is not None:
        module.num_key_value_groups = num_key_value_groups
    return module


def states(b=2, hq=8, hk=2, q_len=33, kv_len=33, d=64, seed=0):
    """CPU query, key and value states as transformers hands them over: (batch, heads, seqlen, head_dim)."""
    return qkv(b, q_len, kv_len, hq, hk, d, dtype=BF16, device="cpu", seed=seed, heads_first=True)


def transformers_sdpa(module, q, k, v, mask, scaling=None, dropout=0.0, is_causal=None, dtype=None):
    """transformers' "sdpa" attention, restated: the result attention_forward must give."""
    groups = q.size(1) // k.size(1)
    k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
    if mask is not None and mask.dim() == 4:
        mask = mask[:, :, :, : k.size(-2)]
    if is_causal is None:
        is_causal = q.size(2) > 1 and mask is None and getattr(module, "is_causal", True)
    if dtype is not None:
        q, k, v = (t.to(dtype) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling, is_causal=is_causal
    )
    return out.transpose(1, 2).contiguous()


@pytest.mark.parametrize(
    "case",
    [
        dict(),  # causal prefill, GQA 4, no mask: the common case
        dict(hk=8),  # MHA
        dict(q_len=1, kv_len=40),  # decoding: is_causal becomes False
        dict(q_len=7, kv_len=40, is_causal=False),  # explicit override
        dict(module_causal=False),  # encoder
        dict(scaling=0.2),
        dict(hq=6, hk=1, d=128),  # MQA
    ],
)
def test_no_mask_runs_the_kernel_with_transformers_semantics(monkeypatch, case):
    case = dict(case)
    explicit = {"is_causal": case.pop("is_causal")} if "is_causal" in case else {}
    scaling = case.pop("scaling", None)
    module_causal = case.pop("module_causal", True)
    q, k, v = states(**case)
    module = stand_in_module(q.size(1) // k.size(1), is_causal=module_causal)
    with emulated_op(monkeypatch) as kernel:
        out, weights = fah_transformers.attention_forward(module, q, k, v, None, scaling=scaling, **explicit)
    assert weights is None
    assert len(kernel.calls) == 1, "the kernel did not run"
    b, hq, q_len, d = q.shape
    assert out.shape == (b, q_len, hq, d) and out.dtype == q.dtype and out.is_contiguous()
    ref = transformers_sdpa(module, q, k, v, None, scaling=scaling, dtype=torch.float32, **explicit)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=1e-2)
    # GQA reaches the kernel as it is: K/V not repeated.
    assert kernel.calls[0][1].size(2) == k.size(1)


@pytest.mark.parametrize("mask_kind", ["bool_padding", "float_padding", "longer_than_keys"])
def test_masks_are_computed_by_torch_exactly(monkeypatch, mask_kind):
    q, k, v = states(q_len=33, kv_len=33)
    keep = torch.ones(2, 1, 33, 33, dtype=torch.bool).tril()
    keep[1, :, :, :5] = False  # left padding of the second sequence
    keep[1, :, :5, 0] = True  # padded query rows still see one key (no NaN rows)
    if mask_kind == "bool_padding":
        mask = keep
    elif mask_kind == "float_padding":
        mask = torch.zeros(keep.shape, dtype=BF16).masked_fill(~keep, torch.finfo(BF16).min)
    else:  # a static-cache mask is wider than the keys; transformers slices it
        mask = torch.cat([keep, torch.zeros(2, 1, 33, 7, dtype=torch.bool)], dim=-1)
    module = stand_in_module(4)
    with emulated_op(monkeypatch) as kernel:
        out, _ = fah_transformers.attention_forward(module, q, k, v, mask)
    assert kernel.calls == []
    assert torch.equal(out, transformers_sdpa(module, q, k, v, mask))


def test_dropout_is_applied_by_torch(monkeypatch):
    q, k, v = states()
    module = stand_in_module(4, training=True)
    with emulated_op(monkeypatch) as kernel:
        torch.manual_seed(3)
        out, _ = fah_transformers.attention_forward(module, q, k, v, None, dropout=0.25)
    assert kernel.calls == []
    torch.manual_seed(3)
    expected = sdpa.TORCH_SDPA(q, k, v, dropout_p=0.25, is_causal=True, enable_gqa=True).transpose(1, 2)
    assert torch.equal(out, expected)


def test_already_repeated_kv_is_accepted():
    q, k, v = states(hk=8)
    out, _ = fah_transformers.attention_forward(stand_in_module(4), q, k, v, None)
    assert out.shape == (2, 33, 8, 64)


@pytest.mark.parametrize(
    "hq, hk, groups, match",
    [(8, 2, 2, "num_key_value_groups is 2"), (6, 4, None, "not a multiple")],
)
def test_head_count_errors(hq, hk, groups, match):
    q, k, v = states(hq=hq, hk=hk)
    with pytest.raises(ValueError, match=match):
        fah_transformers.attention_forward(stand_in_module(groups), q, k, v, None)


@pytest.mark.parametrize("kwargs", [dict(head_mask=torch.ones(8)), dict(output_attentions=True)])
def test_what_cannot_be_honoured_raises(kwargs):
    q, k, v = states()
    with pytest.raises(ValueError, match="eager"):
        fah_transformers.attention_forward(stand_in_module(4), q, k, v, None, **kwargs)


def test_kwargs_transformers_passes_to_every_attention_function_are_accepted(monkeypatch):
    q, k, v = states()
    with emulated_op(monkeypatch) as kernel:
        out, _ = fah_transformers.attention_forward(
            stand_in_module(4), q, k, v, None, position_ids=torch.arange(33)[None], sliding_window=None,
            output_attentions=False, head_mask=None,
        )
    assert len(kernel.calls) == 1 and out.shape == (2, 33, 8, 64)


# --------------------------------------------------------------------------
# register()
# --------------------------------------------------------------------------


class _Interface:
    def __init__(self):
        self.registered = {}

    def register(self, name, fn):
        self.registered[name] = fn


def _install_transformers(monkeypatch, with_masks=True):
    attention, masks = _Interface(), _Interface()
    package = types.ModuleType("transformers")
    package.AttentionInterface = attention
    monkeypatch.setitem(sys.modules, "transformers", package)
    sdpa_mask, flash_mask = object(), object()
    if with_masks:
        masking_utils = types.ModuleType("transformers.masking_utils")
        masking_utils.AttentionMaskInterface = masks
        masking_utils.ALL_MASK_ATTENTION_FUNCTIONS = {"sdpa": sdpa_mask, "eager": object()}
        if with_masks == "flash":
            masking_utils.ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"] = flash_mask
        monkeypatch.setitem(sys.modules, "transformers.masking_utils", masking_utils)
    else:
        monkeypatch.setitem(sys.modules, "transformers.masking_utils", None)
    return attention, masks, flash_mask if with_masks == "flash" else sdpa_mask


def test_register_adds_the_function_and_the_flash_mask_builder(monkeypatch):
    # The FlashAttention mask builder hands over 2-D padding masks, which attention_forward unpads.
    attention, masks, flash_mask = _install_transformers(monkeypatch, with_masks="flash")
    assert fah_transformers.register() == "flash_attn_hopper"
    assert attention.registered == {"flash_attn_hopper": fah_transformers.attention_forward}
    assert masks.registered == {"flash_attn_hopper": flash_mask}
    assert fah_transformers.register("fah") == "fah" and "fah" in attention.registered


def test_register_falls_back_to_sdpas_mask_builder(monkeypatch):
    # A transformers without the FlashAttention builder: 4-D masks, which torch's SDPA computes.
    attention, masks, sdpa_mask = _install_transformers(monkeypatch)
    fah_transformers.register()
    assert masks.registered == {"flash_attn_hopper": sdpa_mask}


def test_register_without_a_mask_registry(monkeypatch):
    attention, masks, _ = _install_transformers(monkeypatch, with_masks=False)
    fah_transformers.register()
    assert "flash_attn_hopper" in attention.registered and masks.registered == {}


def test_register_without_transformers_says_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match="needs Hugging Face transformers"):
        fah_transformers.register()
