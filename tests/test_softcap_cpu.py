"""softcap (Gemma 2; FlashAttention-3's semantics) end to end on CPU: flash_attn_func,
flash_attn_varlen_func, learnable sinks and attention_chunk with softcap over emulations of the
kernels' ops, against the float32 reference (scaled scores s -> softcap * tanh(s / softcap)
before the mask), forward and backward; what reaches the ops; bad values refused before any op.
The kernels' own numbers are tests/test_softcap_gpu.py's."""
from __future__ import annotations

import functools
import math

import pytest
import torch

import flash_attn_hopper
from flash_attn_hopper import _build_info, ops, support

import op_emulator
from helpers.grads import EMULATION_REL_NORM, check_grads, grads_of
from helpers.inputs import cpu_inputs, varlen_qkv
from helpers.kernels import needs_extension
from op_emulator import emulated_kernels, emulated_varlen_ops
from reference import assert_fa_close, attention_ref, attention_ref_varlen

DTYPE = torch.float16


@pytest.fixture
def kernels(monkeypatch):
    with emulated_kernels(monkeypatch) as recorders:  # (fwd, bwd)
        yield recorders


def check_forward(out, lse, q, k, v, **kwargs):
    ref, ref_lse = attention_ref(q, k, v, **kwargs)
    low, low_lse = attention_ref(q, k, v, upcast=False, **kwargs)
    assert_fa_close(out, ref, low, name="out")
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert_fa_close(lse[finite], ref_lse[finite], low_lse[finite], name="lse", atol=1e-4)


def test_the_emulated_backward_is_autograd_through_the_emulated_capped_forward():
    """The emulation's softcap derivative (which the tests below lean on) against torch's autograd."""
    q, k, v, dout = cpu_inputs(2, 23, 31, 4, 2, 64, 3, torch.float32)
    q = q * 4  # scores well into tanh's bend
    for softcap, causal in [(5.0, False), (1.5, True), (30.0, True)]:
        args = (0.125, causal, -1, -1, False)
        out, lse = op_emulator.emulate_fwd(q, k, v, *args, softcap=softcap)
        _, ref = grads_of(lambda q, k, v: op_emulator.emulate_fwd(q, k, v, *args, softcap=softcap)[0], q, k, v, dout)
        got = op_emulator.emulate_bwd(dout, q, k, v, out, lse, *args, softcap=softcap)[:3]
        for g, r in zip(got, ref):
            assert torch.allclose(g, r, rtol=1e-4, atol=1e-5), (softcap, causal, (g - r).abs().max())


CASES = [
    # sq, sk, hq, hk, causal, window, softcap
    (37, 53, 4, 4, False, (-1, -1), 5.0),
    (37, 53, 6, 2, True, (-1, -1), 2.0),  # GQA, bottom-right causal
    (53, 37, 4, 1, True, (-1, -1), 30.0),  # rows that see no key; MQA; Gemma 2's value
    (64, 64, 4, 2, False, (8, 0), 1.0),  # a sliding window
    (1, 40, 4, 2, True, (-1, -1), 3.0),  # decoding-shaped
]


@pytest.mark.parametrize("sq, sk, hq, hk, causal, window, softcap", CASES)
@needs_extension("the ops' autograd formulas are registered with the compiled extension only")
def test_flash_attn_func_with_softcap(kernels, sq, sk, hq, hk, causal, window, softcap):
    fwd, bwd = kernels
    q, k, v, dout = cpu_inputs(2, sq, sk, hq, hk, 64, sq + sk, DTYPE)
    q = q * 3  # softcap has something to cap
    out, lse = flash_attn_hopper.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                                 return_attn_probs=True)
    check_forward(out, lse, q, k, v, causal=causal, window_size=window, softcap=softcap)
    _, grads = grads_of(lambda q, k, v: flash_attn_hopper.flash_attn_func(
        q, k, v, causal=causal, window_size=window, softcap=softcap), q, k, v, dout)
    check_grads(grads, q, k, v, dout, max_rel_norm=EMULATION_REL_NORM, causal=causal, window_size=window,
                softcap=softcap)
    assert fwd.softcaps == [softcap, softcap] and [c["softcap"] for c in bwd.calls] == [softcap]


@needs_extension("the ops' autograd formulas are registered with the compiled extension only")
def test_softcap_changes_the_result_and_zero_means_off(kernels):
    fwd, _ = kernels
    q, k, v, _ = cpu_inputs(1, 16, 16, 2, 2, 64, 1, DTYPE)
    q = q * 4
    plain = flash_attn_hopper.flash_attn_func(q, k, v)
    assert torch.equal(flash_attn_hopper.flash_attn_func(q, k, v, softcap=0.0), plain)
    capped = flash_attn_hopper.flash_attn_func(q, k, v, softcap=1.0)
    assert (capped.float() - plain.float()).abs().max() > 1e-2
    assert fwd.softcaps == [0.0, 0.0, 1.0]  # 0 is the op's default: left out of the call


@needs_extension("the ops' autograd formulas are registered with the compiled extension only")
def test_softcap_with_a_sink_and_odd_head_dims(kernels):
    q, k, v, dout = cpu_inputs(2, 29, 29, 4, 2, 59, 5, DTYPE)
    q = q * 3
    sink = torch.linspace(-1.0, 2.0, 4)
    out, lse = flash_attn_hopper.flash_attn_func(q, k, v, causal=True, softcap=4.0, learnable_sink=sink,
                                                 return_attn_probs=True)
    check_forward(out, lse, q, k, v, causal=True, softcap=4.0, sink=sink)
    _, grads = grads_of(lambda q, k, v: flash_attn_hopper.flash_attn_func(
        q, k, v, causal=True, softcap=4.0, learnable_sink=sink), q, k, v, dout)
    check_grads(grads, q, k, v, dout, max_rel_norm=EMULATION_REL_NORM, causal=True, softcap=4.0,
                attention=functools.partial(attention_ref, sink=sink))


def test_varlen_with_softcap(monkeypatch):
    with emulated_varlen_ops(monkeypatch) as (fwd, bwd):
        q, k, v, dout, cu_q, cu_k, max_q, max_k = varlen_qkv([5, 0, 17, 1], [9, 3, 1, 20], 4, 2, 64, dtype=DTYPE,
                                                             device="cpu", seed=4, draw_dtype=torch.float32)
        q = q * 3
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out, lse = flash_attn_hopper.flash_attn_varlen_func(*leaves, cu_q, cu_k, max_q, max_k, causal=True,
                                                            softcap=2.5, return_attn_probs=True)
        ref = functools.partial(attention_ref_varlen, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        ref_out, ref_lse = ref(q, k, v, causal=True, softcap=2.5)
        low_out, low_lse = ref(q, k, v, causal=True, softcap=2.5, upcast=False)
        assert_fa_close(out, ref_out, low_out, name="out")
        assert_fa_close(lse, ref_lse, low_lse, name="lse", atol=1e-4)
        grads = torch.autograd.grad(out, leaves, dout)
        check_grads(grads, q, k, v, dout, max_rel_norm=EMULATION_REL_NORM, causal=True, softcap=2.5, attention=ref)
    assert fwd.calls[0]["softcap"] == 2.5 and bwd.calls[0]["softcap"] == 2.5


def test_chunked_attention_with_softcap(monkeypatch):
    from reference import attention_ref_chunked

    q, k, v, _ = cpu_inputs(2, 40, 40, 4, 2, 64, 2, DTYPE)
    q = q * 3
    with emulated_varlen_ops(monkeypatch) as (fwd, _):
        out = flash_attn_hopper.flash_attn_func(q, k, v, causal=True, attention_chunk=16, softcap=3.0)
    ref, _ = attention_ref_chunked(q, k, v, chunk=16, causal=True, softcap=3.0)
    low, _ = attention_ref_chunked(q, k, v, chunk=16, causal=True, softcap=3.0, upcast=False)
    assert_fa_close(out, ref, low, name="out")
    assert fwd.calls[0]["softcap"] == 3.0


@pytest.mark.parametrize("bad, error, fragment", [
    (-1.0, ValueError, "softcap=-1.0 is not usable"),
    (float("nan"), ValueError, "is not usable"),
    (float("inf"), ValueError, "is not usable"),
    (1e-45, ValueError, "is not usable"),  # softmax_scale / softcap overflows float32
    (True, TypeError, "softcap must be a Python float"),
    (torch.tensor(2.0), TypeError, "softcap must be a Python float"),
])
def test_bad_softcaps_are_refused_before_any_op(bad, error, fragment):
    q, k, v, _ = cpu_inputs(1, 8, 8, 2, 2, 64, 0, DTYPE)
    with pytest.raises(error) as info:
        flash_attn_hopper.flash_attn_func(q, k, v, softcap=bad)
    assert fragment in str(info.value)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(error) as info:
        flash_attn_hopper.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 8, 8, softcap=bad)
    assert fragment in str(info.value)


def test_a_build_without_softcap_kernels_refuses_it_with_the_knob(monkeypatch):
    monkeypatch.setattr(_build_info, "_CONFIG", {"selection": {"softcap": False}})
    q, k, v, _ = cpu_inputs(1, 8, 8, 2, 2, 64, 0, DTYPE)
    with pytest.raises(RuntimeError, match="softcap=2.0 needs the softcap kernels.*rebuild without FLASH_ATTN_HOPPER_DISABLE_SOFTCAP"):
        flash_attn_hopper.flash_attn_func(q, k, v, softcap=2.0)
    assert _build_info.build_info()["features"]["softcap"] is False
    monkeypatch.setattr(_build_info, "_CONFIG", {"selection": {"hdims": [128]}})  # a record from before the knob
    assert _build_info.compiled_feature("softcap") is True


def test_schemas_carry_softcap_with_default_off():
    for schema, names in [(ops.FWD_SCHEMA, ops.FWD_SCHEMA_ARGS), (ops.BWD_SCHEMA, ops.BWD_SCHEMA_ARGS),
                          (ops.VARLEN_FWD_SCHEMA, ops.VARLEN_FWD_SCHEMA_ARGS),
                          (ops.VARLEN_BWD_SCHEMA, ops.VARLEN_BWD_SCHEMA_ARGS)]:
        parsed = torch._C.parse_schema(f"flash_attn_hopper::{schema}")
        assert tuple(a.name for a in parsed.arguments) == names
        (softcap,) = [a for a in parsed.arguments if a.name == "softcap"]
        assert (str(softcap.type), softcap.default_value) == ("float", 0.0)
    if ops.extension_loaded():  # the compiled ops are the contract
        assert str(torch.ops.flash_attn_hopper.fwd.default._schema) == str(
            torch._C.parse_schema(f"flash_attn_hopper::{ops.FWD_SCHEMA}"))


def test_softcap_refusal_helper():
    assert support.softcap_refusal(0.0, None, 64) is None
    assert support.softcap_refusal(0, None, 64) is None
    assert support.softcap_refusal(50.0, 0.1, 64) is None
    assert support.softcap_refusal(math.inf, None, 64) is not None
