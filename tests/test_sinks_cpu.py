"""Learnable sinks (flash_attn_hopper/sinks.py) end to end on CPU: flash_attn_func and
flash_attn_varlen_func with learnable_sink, over emulations of the kernels' ops, against a
float32 reference with the sink as one more softmax column; the sink's own gradient against
autograd of that reference; bad sinks refused."""
from __future__ import annotations

import functools

import pytest
import torch

import flash_attn_hopper

from helpers.grads import EMULATION_REL_NORM, check_grads, grads_of
from helpers.inputs import cpu_inputs, varlen_qkv
from helpers.kernels import needs_extension
from op_emulator import emulated_kernels, emulated_varlen_ops
from reference import assert_fa_close, attention_ref, attention_ref_varlen

pytestmark = needs_extension("the sink ops are registered beside the compiled extension's")

DTYPE = torch.float16


@pytest.fixture
def kernels(monkeypatch):
    with emulated_kernels(monkeypatch) as recorders:  # (fwd, bwd)
        yield recorders


def sink_of(hq, seed=0, dtype=torch.float32):
    return (torch.randn(hq, generator=torch.Generator().manual_seed(seed)) * 2).to(dtype)


def reference_sink_grad(q, k, v, dout, sink, **kwargs):
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    s = sink.detach().float().requires_grad_()
    out, _ = attention_ref(*leaves, sink=s, **kwargs)
    return torch.autograd.grad(out, s, dout.float())[0]


@pytest.mark.parametrize("causal, window, hq, hk", [(False, (-1, -1), 4, 4), (True, (-1, -1), 6, 2),
                                                    (False, (8, 0), 4, 1), (True, (-1, -1), 4, 2)])
def test_forward_and_gradients(kernels, causal, window, hq, hk):
    q, k, v, dout = cpu_inputs(2, 37, 53, hq, hk, 64, 5, DTYPE)
    sink = sink_of(hq, seed=hq)
    out, lse = flash_attn_hopper.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                                 learnable_sink=sink, return_attn_probs=True)
    ref, lse_ref = attention_ref(q, k, v, causal=causal, window_size=window, sink=sink)
    low, lse_low = attention_ref(q, k, v, causal=causal, window_size=window, sink=sink, upcast=False)
    assert_fa_close(out, ref, low, name="out")
    assert_fa_close(lse, lse_ref, lse_low, name="lse", atol=1e-4)
    # q, k, v gradients by FlashAttention's rule; the sink's against autograd of the reference.
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    s = sink.clone().requires_grad_()
    o = flash_attn_hopper.flash_attn_func(*leaves, causal=causal, window_size=window, learnable_sink=s)
    *grads, dsink = torch.autograd.grad(o, [*leaves, s], dout)
    check_grads(grads, q, k, v, dout, max_rel_norm=EMULATION_REL_NORM, causal=causal, window_size=window,
                attention=functools.partial(attention_ref, sink=sink))
    want = reference_sink_grad(q, k, v, dout, sink, causal=causal, window_size=window)
    assert dsink.dtype == sink.dtype and torch.allclose(dsink, want, rtol=2e-2, atol=2e-3), (dsink, want)


def test_rows_that_see_no_key_give_zero_and_the_sink_as_lse(kernels):
    q, k, v, _ = cpu_inputs(1, 20, 5, 2, 2, 64, 1, DTYPE)  # bottom-right causal: 15 rows see nothing
    sink = sink_of(2, seed=3)
    out, lse = flash_attn_hopper.flash_attn_func(q, k, v, causal=True, learnable_sink=sink, return_attn_probs=True)
    assert torch.equal(out[:, :15], torch.zeros_like(out[:, :15]))
    assert torch.allclose(lse[:, :, :15], sink.view(1, 2, 1).expand(1, 2, 15))


def test_a_sink_of_minus_infinity_is_no_sink(kernels):
    q, k, v, _ = cpu_inputs(2, 17, 29, 4, 2, 64, 2, DTYPE)
    sink = torch.full((4,), float("-inf"))
    a = flash_attn_hopper.flash_attn_func(q, k, v, causal=True, learnable_sink=sink)
    b = flash_attn_hopper.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(a, b)


def test_sink_in_the_input_dtype_gets_its_gradient_in_that_dtype(kernels):
    q, k, v, dout = cpu_inputs(1, 9, 9, 2, 2, 64, 4, DTYPE)
    s = sink_of(2, dtype=DTYPE).requires_grad_()
    o = flash_attn_hopper.flash_attn_func(q, k, v, learnable_sink=s)
    (ds,) = torch.autograd.grad(o, s, dout)
    assert ds.dtype == DTYPE and ds.shape == (2,)


@pytest.mark.parametrize("bad, error, fragment", [
    (torch.zeros(3), ValueError, "shape (nheads,) = (4,)"),
    (torch.zeros(4, dtype=torch.float64), ValueError, "float32 or q's dtype"),
    ([0.0] * 4, TypeError, "must be a torch.Tensor"),
    (torch.zeros(4, device="meta"), ValueError, "on meta"),
])
def test_bad_sinks_are_refused(kernels, bad, error, fragment):
    q, k, v, _ = cpu_inputs(1, 8, 8, 4, 2, 64, 0, DTYPE)
    with pytest.raises(error, match=None) as info:
        flash_attn_hopper.flash_attn_func(q, k, v, learnable_sink=bad)
    assert fragment in str(info.value)


def test_varlen_forward_and_gradients(monkeypatch):
    with emulated_varlen_ops(monkeypatch):
        q, k, v, dout, cu_q, cu_k, max_q, max_k = varlen_qkv([5, 0, 17], [9, 3, 1], 4, 2, 64, dtype=DTYPE,
                                                             device="cpu", seed=8, draw_dtype=torch.float32)
        sink = sink_of(4, seed=9)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        s = sink.clone().requires_grad_()
        out, lse = flash_attn_hopper.flash_attn_varlen_func(*leaves, cu_q, cu_k, max_q, max_k, causal=True,
                                                            learnable_sink=s, return_attn_probs=True)
        ref = functools.partial(attention_ref_varlen, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, sink=sink)
        ref_out, ref_lse = ref(q, k, v, causal=True)
        low_out, low_lse = ref(q, k, v, causal=True, upcast=False)
        assert_fa_close(out, ref_out, low_out, name="out")
        assert_fa_close(lse, ref_lse, low_lse, name="lse", atol=1e-4)
        *grads, dsink = torch.autograd.grad(out, [*leaves, s], dout)
        check_grads(grads, q, k, v, dout, max_rel_norm=EMULATION_REL_NORM, causal=True, attention=ref)
        f = [t.detach().float().requires_grad_() for t in (q, k, v)]
        sf = sink.clone().requires_grad_()
        o, _ = attention_ref_varlen(*f, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, sink=sf, causal=True)
        (want,) = torch.autograd.grad(o, sf, dout.float())
        assert torch.allclose(dsink, want, rtol=2e-2, atol=2e-3), (dsink, want)


def test_compile_fullgraph_with_a_sink(kernels):
    q, k, v, dout = cpu_inputs(1, 16, 16, 2, 2, 64, 6, DTYPE)
    sink = sink_of(2)

    def block(q, k, v):
        return flash_attn_hopper.flash_attn_func(q, k, v, causal=True, learnable_sink=sink) * 2

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    out_c, grads_c = grads_of(compiled, q, k, v, dout)
    out_e, grads_e = grads_of(block, q, k, v, dout)
    torch._dynamo.reset()
    assert torch.equal(out_c, out_e) and all(torch.equal(a, b) for a, b in zip(grads_c, grads_e))


def test_the_raw_fwd_op_refuses_a_sink_that_wants_a_gradient(kernels):
    """The fwd ops' own autograd formula has no sink gradient: asking for one through them raises
    instead of leaving the sink's gradient silently empty (flash_attn_func routes sinks through fwd_sink)."""
    q, k, v, _ = cpu_inputs(1, 8, 8, 2, 2, 64, 0, DTYPE)
    sink = torch.zeros(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="no gradient for their sink"):
        torch.ops.flash_attn_hopper.fwd(q.requires_grad_(), k, v, 0.125, False, -1, -1, False, 0.0, sink)
    out, lse = torch.ops.flash_attn_hopper.fwd(q, k, v, 0.125, False, -1, -1, False, 0.0, sink.detach())
    ref, ref_lse = attention_ref(q, k, v, softmax_scale=0.125, sink=sink.detach())
    assert torch.allclose(lse, ref_lse, atol=1e-4)
