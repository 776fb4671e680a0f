"""Reference gradients and the closeness assertion of every gradient check.

``reference_grads`` is autograd through a reference attention (tests/reference.py's
``attention_ref`` unless told otherwise): with ``upcast=True`` on float32 copies of the
inputs (the reference), with ``upcast=False`` in the inputs' dtype ("PyTorch's own
low-precision error").  ``assert_grads_close`` holds (dq, dk, dv) to FlashAttention's rule,

    |grad - grad_ref|.max() <= 2 * |grad_pytorch_lowprec - grad_ref|.max() + rounding noise

(tests/reference.py's ``assert_fa_close``), and where asked also to a bound on the relative
error norm.  ``check_grads`` does both steps for the common case.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch

from reference import assert_fa_close, attention_ref, rounding_noise

GRAD_NAMES = ("dq", "dk", "dv")

#: A floor under FlashAttention's atol for gradients. Where a gradient is 0 in exact arithmetic (a
#: query that sees one key: dS = P (dP - D) with D = dP), the float32 reference gets exactly 0, its
#: rounding noise is 0, and the kernel's D, summed from O in another order than dP, leaves ~1e-6.
#: Far below the rounding noise of any gradient that is not 0.
GRAD_ATOL_FLOOR = 1e-4

#: The relative error norm the CPU tests also hold gradients to: their ops are float32
#: emulations (tests/op_emulator.py) rounded once to fp16, about 2e-4 from the reference.
EMULATION_REL_NORM = 2e-3


def reference_grads(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    *,
    upcast: bool = True,
    attention: Callable | None = None,
    **kwargs,
) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv) by autograd through ``attention(q, k, v, upcast=upcast, **kwargs)``.

    ``attention`` defaults to tests/reference.py's ``attention_ref`` ((b, s, h, d) layout,
    bottom-right masks, ``causal`` / ``window_size`` / ``softmax_scale``); pass
    ``reference.sdpa_ref`` for torch SDPA's semantics, or any function of that form (one
    returning a tuple has its first element differentiated).  ``upcast``: float32 leaves
    and dout, else the inputs' dtype.
    """
    attention = attention_ref if attention is None else attention
    leaves = [(t.detach().float() if upcast else t.detach()).requires_grad_() for t in (q, k, v)]
    out = attention(*leaves, upcast=upcast, **kwargs)
    if isinstance(out, tuple):
        out = out[0]
    return torch.autograd.grad(out, leaves, dout.float() if upcast else dout)


def assert_grads_close(
    grads,
    ref,
    lowprec=None,
    *,
    like=None,
    max_rel_norm: float | None = None,
    atol_floor: float = GRAD_ATOL_FLOOR,
    what: str = "",
) -> None:
    """(dq, dk, dv) against the reference gradients ``ref``.

    With ``lowprec`` (PyTorch's gradients in the inputs' dtype): FlashAttention's rule, its
    atol the rounding noise of the gradient's dtype but at least ``atol_floor``.  With
    ``max_rel_norm``: |grad - ref| / |ref| (Frobenius) below it.  At least one of the two.
    Shapes must match ``ref``'s, and with ``like`` (q, k, v) the inputs' shapes and dtypes.
    """
    if lowprec is None and max_rel_norm is None:
        raise ValueError("assert_grads_close needs lowprec (FlashAttention's rule) or max_rel_norm")
    grads, ref = list(grads), list(ref)
    assert len(grads) == len(ref), f"{what}: {len(grads)} gradients, {len(ref)} reference gradients"
    prefix = f"{what} " if what else ""
    for i, (name, got, r) in enumerate(zip(GRAD_NAMES, grads, ref)):
        assert got.shape == r.shape, f"{prefix}{name}: shape {tuple(got.shape)} != {tuple(r.shape)}"
        if like is not None:
            t = like[i]
            assert got.shape == t.shape and got.dtype == t.dtype, f"{prefix}{name}: {tuple(got.shape)} {got.dtype}"
        if lowprec is not None:
            atol = max(rounding_noise(r, got.dtype), atol_floor)
            assert_fa_close(got, r, lowprec[i], name=f"{prefix}{name}", atol=atol)
        if max_rel_norm is not None:
            error = ((got.float() - r.float()).norm() / r.float().norm()).item()
            assert error < max_rel_norm, f"{prefix}{name}: relative error {error:.2e}"


def check_grads(grads, q, k, v, dout, *, max_rel_norm: float | None = None, what: str = "", **kwargs) -> None:
    """``grads`` (dq, dk, dv) of q, k, v against reference_grads(q, k, v, dout, **kwargs) by
    FlashAttention's rule (and ``max_rel_norm`` if given); shapes and dtypes those of q, k, v."""
    ref = reference_grads(q, k, v, dout, **kwargs)
    low = reference_grads(q, k, v, dout, upcast=False, **kwargs)
    assert_grads_close(grads, ref, low, like=(q, k, v), max_rel_norm=max_rel_norm, what=what)


def grads_of(fn, q, k, v, dout):
    """out = fn(q, k, v) on fresh leaves, and its (dq, dk, dv) for dout."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    return out, torch.autograd.grad(out, (q, k, v), dout)


@contextlib.contextmanager
def deterministic_algorithms(on: bool = True):
    """torch.use_deterministic_algorithms(on, warn_only=True) for a block, then the previous setting.
    On, our backward is bitwise reproducible, so two gradients can be compared exactly."""
    previous = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(on, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
