"""The dispatcher side of flash_attn_hopper: loading ``_C``, fake kernels, autograd.

``flash_attn_hopper._C`` is the compiled extension.  Importing it runs the
C++ ``TORCH_LIBRARY(flash_attn_hopper, m)`` registration, which defines::

    fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal)
        -> (Tensor out, Tensor softmax_lse)

with its CUDA kernel.  This module adds what makes the op a good citizen of
torch: a fake (shape-only) kernel, so FakeTensorMode, ``torch.compile`` and
``torch.export`` trace it without a GPU and without a graph break, and an
autograd formula.  When the extension is missing or fails to load, importing
this module still succeeds; :func:`require_extension` then raises with the
reason and the build command.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch

from . import manifest

#: The backward op's schema this module calls once csrc/ defines it.
BWD_SCHEMA_ARGS = ("dout", "q", "k", "v", "out", "softmax_lse", "softmax_scale", "causal")

_C = None
LOAD_ERROR: str | None = None
try:
    _C = importlib.import_module("flash_attn_hopper._C")
except ModuleNotFoundError as err:
    if err.name != "flash_attn_hopper._C":
        LOAD_ERROR = f"importing flash_attn_hopper._C failed: {err}"
    else:
        LOAD_ERROR = "the CUDA extension flash_attn_hopper._C is not built"
        if (Path(__file__).resolve().parent.parent / "setup.py").is_file():
            # `python -m ...` or `python -c ...` run from a checkout import its source tree
            # rather than the installed package.
            LOAD_ERROR += (
                f" in {Path(__file__).resolve().parent}, a source checkout (run from another directory "
                "to use the installed package, or build in place with `python setup.py build_ext --inplace`)"
            )
except (ImportError, OSError) as err:
    # Typically an undefined symbol: the extension was built against another torch.
    LOAD_ERROR = (
        f"the CUDA extension flash_attn_hopper._C failed to load ({err}); "
        f"it was probably built against another torch (this one is {torch.__version__})"
    )


def extension_loaded() -> bool:
    return _C is not None


def build_hint() -> str:
    return (
        f"Build it from a source checkout on a machine with the CUDA toolkit (nvcc) and torch installed: "
        f"`{manifest.BUILD_COMMAND}`"
    )


def require_extension() -> None:
    """Raise RuntimeError with the reason and the build command when ``_C`` is missing."""
    if _C is None:
        raise RuntimeError(f"flash_attn_hopper is not available: {LOAD_ERROR}. {build_hint()}")


def has_bwd_op() -> bool:
    return _C is not None and hasattr(torch.ops.flash_attn_hopper, "bwd")


def unavailable_reason() -> str | None:
    """None when the kernels can run here; otherwise why not, in one sentence."""
    if _C is None:
        return LOAD_ERROR
    if not torch.cuda.is_available():
        return "no CUDA device is visible to torch (torch.cuda.is_available() is False)"
    found = []
    for index in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(index)
        if (major, minor) == (9, 0):
            return None
        found.append(f"cuda:{index} {torch.cuda.get_device_name(index)} (sm_{major}{minor})")
    return f"no Hopper (sm_90) GPU: found {', '.join(found)}"


def is_available() -> bool:
    """True when the extension is loaded and a Hopper (sm_90) GPU is visible."""
    return unavailable_reason() is None


def backward_unavailable_message() -> str:
    return (
        f"{manifest.direction_unavailable_message('bwd')} The forward pass ran, but gradients through "
        "flash_attn_func cannot be computed: call it under torch.no_grad() / torch.inference_mode() "
        "or on inputs that do not require grad, or use torch.nn.functional.scaled_dot_product_attention "
        "where you need gradients."
    )


if _C is not None:

    @torch.library.register_fake("flash_attn_hopper::fwd")
    def _fwd_fake(q, k, v, softmax_scale, causal, *window_and_alignment):
        # The output shapes depend on q alone; the window arguments (window_size_left,
        # window_size_right, top_left) only choose which keys each query sees.
        batch, seqlen_q, nheads_q, head_dim = q.shape
        out = q.new_empty((batch, seqlen_q, nheads_q, head_dim))
        softmax_lse = q.new_empty((batch, nheads_q, seqlen_q), dtype=torch.float32)
        return out, softmax_lse

    def _fwd_setup_context(ctx, inputs, output):
        # inputs has every schema argument, defaults filled in by torch.
        q, k, v, softmax_scale, causal = inputs[:5]
        out, softmax_lse = output
        ctx.save_for_backward(q, k, v, out, softmax_lse)
        ctx.softmax_scale = softmax_scale
        ctx.causal = causal
        ctx.num_inputs = len(inputs)

    def _fwd_backward(ctx, grad_out, grad_lse):
        # Like FlashAttention, the gradient flowing into softmax_lse is not
        # propagated: lse is an auxiliary output.
        if not has_bwd_op():
            raise RuntimeError(backward_unavailable_message())
        op = torch.ops.flash_attn_hopper.bwd.default
        names = tuple(arg.name for arg in op._schema.arguments)
        if names != BWD_SCHEMA_ARGS:
            raise RuntimeError(
                f"flash_attn_hopper: the compiled bwd op takes {names}, but flash_attn_hopper/ops.py "
                f"calls it with {BWD_SCHEMA_ARGS}; the Python package and the extension are out of step"
            )
        q, k, v, out, softmax_lse = ctx.saved_tensors
        dq, dk, dv = op(grad_out, q, k, v, out, softmax_lse, ctx.softmax_scale, ctx.causal)
        return (dq, dk, dv) + (None,) * (ctx.num_inputs - 3)

    torch.library.register_autograd("flash_attn_hopper::fwd", _fwd_backward, setup_context=_fwd_setup_context)


def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float, causal: bool):
    """The raw op: no argument checks beyond the C++ ones (use flash_attn_func)."""
    require_extension()
    return torch.ops.flash_attn_hopper.fwd(q, k, v, softmax_scale, causal)
