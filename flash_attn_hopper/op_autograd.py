"""Autograd formulas for our ops, registered as ``torch.library.register_autograd`` registers them,
without its per-call cost.

torch's autograd kernel (torch/_library/autograd.py) puts back the default arguments the
dispatcher dropped before it calls ``setup_context``, through ``torch._library.utils.fill_defaults``,
which reads ``op._schema.arguments`` (a fresh list of every argument) once per argument: 140-270 us
of host time per forward with gradients on the CI machine for these 11- to 18-argument ops
(docs/decisions/073-host-cost-per-call.md). Here the defaults are read once, at registration; the
kernel is otherwise the same: below autograd without gradients, an ``autograd.Function`` with them.
"""

from __future__ import annotations

import torch
from torch import _C


def register_autograd(qualname: str, backward, *, setup_context, lib: torch.library.Library) -> None:
    """Register ``backward`` / ``setup_context`` (torch.library.register_autograd's contract:
    setup_context sees every schema argument, backward returns a gradient per schema argument or
    per argument passed) as ``qualname``'s Autograd kernel in ``lib``."""
    namespace, name = qualname.split("::")
    op = getattr(getattr(torch.ops, namespace), name).default
    arguments = op._schema.arguments
    if any(a.kwarg_only for a in arguments):
        raise ValueError(f"{qualname}: keyword-only arguments are not supported here")
    defaults = tuple(a.default_value for a in arguments)  # None where there is none (never dropped)
    below_autograd = _C._after_autograd_keyset

    def forward(ctx, *args_and_keyset):
        *args, keyset = args_and_keyset
        with _C._AutoDispatchBelowAutograd():
            output = op.redispatch(keyset & below_autograd, *args)
        setup_context(ctx, (*args, *defaults[len(args):]), output)
        ctx.fah_num_passed = len(args)
        return output

    def backward_passed(ctx, *grads):
        grads_in = backward(ctx, *grads)
        if any(g is not None for g in grads_in[ctx.fah_num_passed:]):
            raise RuntimeError(f"the backward formula of {qualname} gave a gradient for an argument not passed")
        return (*grads_in[: ctx.fah_num_passed], None)  # None: the keyset

    function = type(f"AutogradFor_{namespace}_{name}", (torch.autograd.Function,),
                    {"forward": staticmethod(forward), "backward": staticmethod(backward_passed)})

    def autograd_kernel(keyset, *args):
        if _C.is_grad_enabled() and _C._any_requires_grad(*args):
            return function.apply(*args, keyset)
        with _C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & below_autograd, *args)

    lib.impl(name, autograd_kernel, "Autograd", with_keyset=True)
