"""op_autograd.register_autograd: torch.library.register_autograd's contract for a stand-in op
(every schema argument reaches setup_context, defaults filled in; one gradient per argument passed),
without torch's per-call fill_defaults."""

from __future__ import annotations

import pytest
import torch

from flash_attn_hopper import op_autograd

SCHEMA = "scaled(Tensor x, Tensor y, float alpha, int shift=3, bool flag=False, Tensor? extra=None) -> (Tensor, Tensor)"


@pytest.fixture
def stand_in(monkeypatch):
    """A CPU op x * alpha, y * alpha with op_autograd's formula; records each setup_context's inputs."""
    lib = torch.library.Library("fah_op_autograd_test", "FRAGMENT")
    seen = []

    def setup_context(ctx, inputs, output):
        seen.append(inputs)
        ctx.alpha = inputs[2]
        ctx.num_inputs = len(inputs)

    def backward(ctx, grad_a, grad_b):
        return (grad_a * ctx.alpha, None if grad_b is None else grad_b * ctx.alpha) + (None,) * (ctx.num_inputs - 2)

    def fill_defaults(*args, **kwargs):
        raise AssertionError("torch's fill_defaults ran")

    monkeypatch.setattr(torch._library.utils, "fill_defaults", fill_defaults)
    try:
        lib.define(SCHEMA)
        lib.impl("scaled", lambda x, y, alpha, *rest: (x * alpha, y * alpha), "CPU")
        op_autograd.register_autograd("fah_op_autograd_test::scaled", backward, setup_context=setup_context, lib=lib)
        yield torch.ops.fah_op_autograd_test.scaled.default, seen
    finally:
        lib._destroy()


def test_gradients_and_filled_defaults(stand_in):
    op, seen = stand_in
    x = torch.randn(5, requires_grad=True)
    y = torch.randn(5, requires_grad=True)
    a, b = op(x, y, 2.5)
    assert seen == [(x, y, 2.5, 3, False, None)]  # the dispatcher dropped the defaults; they are back
    gx, gy = torch.autograd.grad((a * 3).sum() + b.sum(), (x, y))
    torch.testing.assert_close(gx, torch.full_like(x, 7.5))
    torch.testing.assert_close(gy, torch.full_like(y, 2.5))


def test_arguments_passed_past_a_default(stand_in):
    op, seen = stand_in
    x = torch.randn(3, requires_grad=True)
    extra = torch.zeros(1)
    a, _ = op(x, torch.randn(3), 2.0, 4, True, extra)
    assert seen[-1][3:5] == (4, True) and seen[-1][5] is extra
    (gx,) = torch.autograd.grad(a.sum(), (x,))
    torch.testing.assert_close(gx, torch.full_like(x, 2.0))


def test_no_graph_without_gradients(stand_in):
    op, seen = stand_in
    x = torch.randn(4, requires_grad=True)
    with torch.no_grad():
        a, _ = op(x, torch.randn(4), 2.0)
    assert a.grad_fn is None and seen == []
    a, _ = op(torch.randn(4), torch.randn(4), 2.0)  # no input requires grad
    assert a.grad_fn is None and seen == []
    torch.testing.assert_close(op(x.detach(), x.detach(), 2.0)[0], x.detach() * 2)


def test_refuses_keyword_only_schemas():
    lib = torch.library.Library("fah_op_autograd_test_kw", "FRAGMENT")
    try:
        lib.define("kw(Tensor x, *, float alpha=1.0) -> Tensor")
        with pytest.raises(ValueError, match="keyword-only"):
            op_autograd.register_autograd("fah_op_autograd_test_kw::kw", lambda ctx, g: (g,),
                                          setup_context=lambda ctx, inputs, output: None, lib=lib)
    finally:
        lib._destroy()
