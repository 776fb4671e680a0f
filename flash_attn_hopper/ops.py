"""The dispatcher side of flash_attn_hopper: loading ``_C``, fake kernels, autograd.

``flash_attn_hopper._C`` is the compiled extension.  Importing it runs the
C++ ``TORCH_LIBRARY(flash_attn_hopper, m)`` registration, which defines::

    fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal,
        int window_size_left=-1, int window_size_right=-1, bool top_left=False,
        float softcap=0.0, Tensor? sink=None, int num_splits=1) -> (Tensor out, Tensor softmax_lse)

(:data:`FWD_SCHEMA`) with its CUDA kernel, and, in a build with the backward kernels (the
default), ``bwd`` with the schema :data:`BWD_SCHEMA`.  Builds of this version
also define the variable-length ops ``varlen_fwd`` (:data:`VARLEN_FWD_SCHEMA`)
and, with the backward, ``varlen_bwd`` (:data:`VARLEN_BWD_SCHEMA`); an older
build lacks them and the varlen entry points refuse calls, saying so
(:func:`varlen_fwd_op`).

This module adds what makes the ops good citizens of torch: fake
(shape-only) kernels, so FakeTensorMode, ``torch.compile`` and
``torch.export`` trace them without a GPU and without a graph break, and the
autograd formula of ``fwd``, which calls ``bwd`` with the forward's
arguments and saves only q, k, v, out and softmax_lse (no seqlen² tensor).

``deterministic``: the backward accumulates dQ in a fixed order when asked,
which the forward's schema cannot carry.  So this module defines a second
forward op in Python, ``fwd_deterministic_bwd``, with ``fwd``'s schema and
kernel: the op itself says which backward it wants, which holds through
``torch.compile`` and ``torch.export``.  ``flash_attn_func(deterministic=True)``
calls it.  Either op's backward is also deterministic when
``torch.use_deterministic_algorithms(True)`` is in force at the forward call
(so SDPA users get torch's switch).

The varlen ops get the same treatment (:func:`register_varlen`): fake kernels
(out (total_q, nheads, headdim), lse (nheads, total_q)), the autograd formula of
``varlen_fwd`` calling ``varlen_bwd`` (saving q, k, v, out, lse and the int32
sequence tensors), and ``varlen_fwd_deterministic_bwd``, which
``flash_attn_varlen_func(deterministic=True)`` calls.

When the extension is missing or fails to load, importing this module still
succeeds; :data:`LOAD_ERROR` says why, and the entry points refuse calls with
it and the build command (:func:`flash_attn_hopper.support.check`).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch

from . import manifest, op_autograd

#: The forward op.  softcap: 0 = off; otherwise the scaled scores s become softcap * tanh(s / softcap)
#: before any mask (FlashAttention-3's semantics), in the backward too.  sink: None, or a float32
#: (nheads,) logit per query head that joins every row's softmax denominator and carries no value
#: (the LSE includes it; rows that see no key get LSE = sink).  The op's own autograd formula has
#: no gradient for the sink: flash_attn_hopper/sinks.py's ops carry it.  num_splits: split-KV (the
#: keys of a query tile shared among that many CTAs, their partial results merged by the combine
#: kernel; 1 none, 0 choose, n at most n; the result does not depend on it beyond rounding;
#: calls with softcap run unsplit; a sink joins in the combine).
FWD_SCHEMA = (
    "fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, int window_size_left=-1, "
    "int window_size_right=-1, bool top_left=False, float softcap=0.0, Tensor? sink=None, int num_splits=1) "
    "-> (Tensor out, Tensor softmax_lse)"
)

#: The argument names of :data:`FWD_SCHEMA`.
FWD_SCHEMA_ARGS = (
    "q", "k", "v", "softmax_scale", "causal", "window_size_left", "window_size_right", "top_left", "softcap", "sink",
    "num_splits",
)

#: The backward op the autograd formula calls (defined in csrc/flash_api.cpp when
#: the build has backward kernels).  Shapes: dout and out like q (batch, seqlen_q,
#: nheads, headdim), softmax_lse float32 (batch, nheads, seqlen_q) as fwd returns it;
#: dq like q, dk and dv like k and v (GQA: summed over each group's query heads).
#: Window arguments mean what they mean for fwd.  sink: the forward's (out and softmax_lse hold it);
#: dsink is then its float32 (nheads,) gradient, -sum over rows of exp(sink - lse) * rowsum(dout * out),
#: taken from the kernels' own rowsum; without a sink an empty (0,) tensor.
BWD_SCHEMA = (
    "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, float softmax_scale, "
    "bool causal, int window_size_left=-1, int window_size_right=-1, bool top_left=False, "
    "bool deterministic=False, float softcap=0.0, Tensor? sink=None) "
    "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dsink)"
)

#: The argument names of :data:`BWD_SCHEMA`, checked against the compiled op before each call.
BWD_SCHEMA_ARGS = (
    "dout",
    "q",
    "k",
    "v",
    "out",
    "softmax_lse",
    "softmax_scale",
    "causal",
    "window_size_left",
    "window_size_right",
    "top_left",
    "deterministic",
    "softcap",
    "sink",
)

#: The forward op whose backward is the deterministic one (defined below, in Python).
DETERMINISTIC_FWD_NAME = "fwd_deterministic_bwd"

#: Variable-length forward (csrc/flash_api.cpp, every build of this version).  q (total_q, nheads,
#: headdim), k and v (total_k, nheads_kv, headdim); cu_seqlens_q / cu_seqlens_k int32 (batch + 1,);
#: seqused_q / seqused_k None or int32 (batch,); sequence b is rows [cu_seqlens[b], cu_seqlens[b] + len_b)
#: with len_b = seqused[b] if given else cu_seqlens[b + 1] - cu_seqlens[b]; max_seqlen_q / max_seqlen_k
#: bound every len_b.  Causal and windows per sequence, as fwd's.  Returns out (total_q, nheads, headdim)
#: in q's dtype and softmax_lse float32 (nheads, total_q), FlashAttention's varlen layout.
VARLEN_FWD_SCHEMA = (
    "varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? seqused_q, "
    "Tensor? seqused_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool causal, "
    "int window_size_left=-1, int window_size_right=-1, bool top_left=False, float softcap=0.0, "
    "Tensor? sink=None, int num_splits=1, int pack_gqa=1) -> (Tensor out, Tensor softmax_lse)"
)

#: Variable-length backward (builds with the backward kernels): dq like q, dk and dv like k and v
#: (GQA summed over each group), zero on rows outside every sequence's used part; sink / dsink as bwd's.
VARLEN_BWD_SCHEMA = (
    "varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
    "Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? seqused_q, Tensor? seqused_k, int max_seqlen_q, "
    "int max_seqlen_k, float softmax_scale, bool causal, int window_size_left=-1, int window_size_right=-1, "
    "bool top_left=False, bool deterministic=False, float softcap=0.0, Tensor? sink=None) "
    "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dsink)"
)

#: The argument names of the two varlen schemas, checked against the compiled ops before each call.
VARLEN_FWD_SCHEMA_ARGS = (
    "q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "seqused_q", "seqused_k", "max_seqlen_q", "max_seqlen_k",
    "softmax_scale", "causal", "window_size_left", "window_size_right", "top_left", "softcap", "sink", "num_splits",
    "pack_gqa",
)
VARLEN_BWD_SCHEMA_ARGS = (
    "dout", "q", "k", "v", "out", "softmax_lse", "cu_seqlens_q", "cu_seqlens_k", "seqused_q", "seqused_k",
    "max_seqlen_q", "max_seqlen_k", "softmax_scale", "causal", "window_size_left", "window_size_right",
    "top_left", "deterministic", "softcap", "sink",
)

#: The varlen forward op whose backward is the deterministic one (defined below, in Python).
VARLEN_DETERMINISTIC_FWD_NAME = "varlen_fwd_deterministic_bwd"

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
    # Typically an undefined symbol: a torch older than the stable ABI the binding targets, or a
    # torch for another CUDA major than the extension's.
    from ._version import TORCH_MIN_VERSION

    LOAD_ERROR = (
        f"the CUDA extension flash_attn_hopper._C failed to load ({err}); it needs torch >= {TORCH_MIN_VERSION} "
        f"built for the CUDA major version it was compiled with (this one is torch {torch.__version__}, "
        f"CUDA {torch.version.cuda})"
    )


def extension_loaded() -> bool:
    return _C is not None


def build_hint() -> str:
    return (
        f"Build it from a source checkout on a machine with the CUDA toolkit (nvcc) and torch installed: "
        f"`{manifest.BUILD_COMMAND}`"
    )


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


def bwd_op():
    """``torch.ops.flash_attn_hopper.bwd.default``, checked against :data:`BWD_SCHEMA_ARGS`.

    Raises RuntimeError when this build has no backward op, or when the
    compiled op takes other arguments than this module passes.
    """
    if not has_bwd_op():
        raise RuntimeError(backward_unavailable_message())
    return _checked_op("bwd", BWD_SCHEMA_ARGS)


def _fwd_fake(q, k, v, softmax_scale, causal, *window_and_alignment):
    # The output shapes depend on q alone; the window arguments (window_size_left,
    # window_size_right, top_left) only choose which keys each query sees.
    batch, seqlen_q, nheads_q, _ = q.shape
    out = q.new_empty((batch, seqlen_q, nheads_q, v.shape[-1]))  # v's head dim (dv != d kernels)
    softmax_lse = q.new_empty((batch, nheads_q, seqlen_q), dtype=torch.float32)
    return out, softmax_lse


def _dsink_fake(q, sink):
    return q.new_empty((0,) if sink is None else sink.shape, dtype=torch.float32)


def _bwd_fake(dout, q, k, v, out, softmax_lse, softmax_scale, causal, window_size_left=-1, window_size_right=-1,
              top_left=False, deterministic=False, softcap=0.0, sink=None):
    # Contiguous gradients shaped like their inputs: dq (batch, seqlen_q, nheads_q, headdim),
    # dk and dv (batch, seqlen_k, nheads_kv, headdim), whatever the inputs' strides.
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), _dsink_fake(q, sink)


def register_bwd_fake(lib=None) -> None:
    """Register the bwd op's fake kernel (done at import when the build has the op).

    ``lib``: a ``torch.library.Library`` that owns the registration, for
    tests that define a stand-in op and remove it again.
    """
    torch.library.register_fake("flash_attn_hopper::bwd", _bwd_fake, lib=lib)


def _setup_context(ctx, inputs, output, deterministic: bool) -> None:
    # inputs has every schema argument, defaults filled in (op_autograd.register_autograd).
    q, k, v, softmax_scale, causal, window_size_left, window_size_right, top_left, softcap, sink, _ = inputs
    _no_sink_gradient(sink)
    out, softmax_lse = output
    ctx.save_for_backward(q, k, v, out, softmax_lse)
    ctx.softmax_scale, ctx.softcap = softmax_scale, softcap
    ctx.causal = causal
    ctx.window_size_left, ctx.window_size_right, ctx.top_left = window_size_left, window_size_right, top_left
    # Read at the forward call, as torch's own kernels read it when they run.
    ctx.deterministic = bool(deterministic or torch.are_deterministic_algorithms_enabled())
    ctx.num_inputs = len(inputs)
    # The lse output's gradient is never used (see _fwd_backward): without this, autograd
    # allocates and zero-fills one (batch x heads x seqlen_q float32) before every backward.
    # grad_out arrives as None when nothing downstream used out.
    ctx.set_materialize_grads(False)


def _no_sink_gradient(sink) -> None:
    if sink is not None and sink.requires_grad:
        raise RuntimeError(
            "flash_attn_hopper: the fwd ops give no gradient for their sink argument; call "
            "flash_attn_func(..., learnable_sink=...) (or torch.ops.flash_attn_hopper.fwd_sink), whose "
            "autograd formula carries it"
        )


def _fwd_setup_context(ctx, inputs, output):
    _setup_context(ctx, inputs, output, deterministic=False)


def _fwd_deterministic_setup_context(ctx, inputs, output):
    _setup_context(ctx, inputs, output, deterministic=True)


def _fwd_backward(ctx, grad_out, grad_lse):
    # Like FlashAttention, the gradient flowing into softmax_lse is not
    # propagated: lse is an auxiliary output.
    op = bwd_op()
    q, k, v, out, softmax_lse = ctx.saved_tensors
    if grad_out is None:  # only lse was used downstream: every input gradient is zero
        return (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)) + (None,) * (ctx.num_inputs - 3)
    if grad_out.stride(-1) != 1:  # the kernel reads dout rows with TMA: only the last dim must be contiguous
        grad_out = grad_out.contiguous()
    dq, dk, dv, _ = op(
        grad_out,
        q,
        k,
        v,
        out,
        softmax_lse,
        ctx.softmax_scale,
        ctx.causal,
        ctx.window_size_left,
        ctx.window_size_right,
        ctx.top_left,
        ctx.deterministic,
        ctx.softcap,
    )
    return (dq, dk, dv) + (None,) * (ctx.num_inputs - 3)


def _fwd_deterministic_bwd_impl(q, k, v, softmax_scale, causal, window_size_left=-1, window_size_right=-1,
                                top_left=False, softcap=0.0, sink=None, num_splits=1):
    # fwd's kernel, below autograd: the autograd formula of this op is the one that differs.
    # (Defaults: the dispatcher leaves trailing arguments equal to them out of a Python kernel's call.)
    return torch.ops.flash_attn_hopper.fwd.default(
        q, k, v, softmax_scale, causal, window_size_left, window_size_right, top_left, softcap, sink, num_splits
    )


# --------------------------------------------------------------------------
# Variable-length ops
# --------------------------------------------------------------------------


def op_of_build(name: str, feature: str):
    """torch.ops.flash_attn_hopper.<name>, or a clear error when the build predates the feature's kernels."""
    if not hasattr(torch.ops.flash_attn_hopper, name):
        raise RuntimeError(f"flash_attn_hopper: this build has no {name} op (built before {feature} kernels "
                           f"existed); rebuild with `{manifest.BUILD_COMMAND}`")
    return getattr(torch.ops.flash_attn_hopper, name)


def register_forward_only(lib, fakes: dict, message: str) -> None:
    """Fake kernels ({op name: fake}) of forward-only ops, for torch.compile / export, and an autograd
    formula that raises `message` on the backward (the forward runs on inputs that require grad, as
    FA3's), for the ops this build has."""

    def no_backward(ctx, *grads):
        raise RuntimeError(message)

    for name, fake in fakes.items():
        if hasattr(torch.ops.flash_attn_hopper, name):
            torch.library.register_fake(f"flash_attn_hopper::{name}", fake, lib=lib)
            op_autograd.register_autograd(f"flash_attn_hopper::{name}", no_backward,
                                          setup_context=lambda ctx, inputs, output: None, lib=lib)


def has_varlen_fwd_op() -> bool:
    """Whether ``torch.ops.flash_attn_hopper.varlen_fwd`` exists (builds of this version define it)."""
    return hasattr(torch.ops.flash_attn_hopper, "varlen_fwd")


def has_varlen_bwd_op() -> bool:
    """Whether ``torch.ops.flash_attn_hopper.varlen_bwd`` exists (builds with the backward kernels)."""
    return hasattr(torch.ops.flash_attn_hopper, "varlen_bwd")


def varlen_unavailable_message() -> str:
    return (
        "flash_attn_hopper: this build of the extension has no variable-length op (varlen_fwd); it was built "
        f"from a version without flash_attn_varlen_func kernels. Rebuild it from this version: {build_hint()}"
    )


_CHECKED_OPS: dict = {}  # name -> the op object whose schema was checked (a new object is checked again)


def _checked_op(name: str, expected: tuple[str, ...]):
    op = getattr(torch.ops.flash_attn_hopper, name).default
    if torch.compiler.is_compiling() or _CHECKED_OPS.get(name) is op:
        return op  # the schema is C++ state dynamo cannot trace; eager calls check it, traced ones bind by it
    names = tuple(arg.name for arg in op._schema.arguments)
    if names != expected:
        raise RuntimeError(
            f"flash_attn_hopper: the compiled {name} op takes {names}, but flash_attn_hopper/ops.py "
            f"calls it with {expected}; the Python package and the extension are out of step"
        )
    _CHECKED_OPS[name] = op
    return op


def varlen_fwd_op():
    """``torch.ops.flash_attn_hopper.varlen_fwd.default``, checked against :data:`VARLEN_FWD_SCHEMA_ARGS`.

    Raises RuntimeError when the extension has no such op (built before this
    version) or when it takes other arguments than this module passes.
    """
    if not has_varlen_fwd_op():
        raise RuntimeError(varlen_unavailable_message())
    return _checked_op("varlen_fwd", VARLEN_FWD_SCHEMA_ARGS)


def varlen_backward_unavailable_message() -> str:
    return (
        f"{manifest.direction_unavailable_message('bwd')} The forward pass ran, but gradients through "
        "flash_attn_varlen_func cannot be computed (this build has no varlen_bwd op): call it under "
        "torch.no_grad() / torch.inference_mode() or on inputs that do not require grad."
    )


def varlen_bwd_op():
    """``torch.ops.flash_attn_hopper.varlen_bwd.default``, checked against :data:`VARLEN_BWD_SCHEMA_ARGS`."""
    if not has_varlen_bwd_op():
        raise RuntimeError(varlen_backward_unavailable_message())
    return _checked_op("varlen_bwd", VARLEN_BWD_SCHEMA_ARGS)


def optional_args(softcap, num_splits=1, pack_gqa=1) -> dict:
    """The forward ops' softcap, num_splits and pack_gqa arguments, each left out at its default so
    that calls without them stay as they were (all validated before)."""
    kwargs = {"softcap": float(softcap)} if softcap else {}
    if num_splits != 1:
        kwargs["num_splits"] = num_splits
    if pack_gqa != 1:
        kwargs["pack_gqa"] = pack_gqa
    return kwargs


def packed_output_shapes(q, dv: int, pack_gqa: int):
    """out and softmax_lse shapes of a varlen / paged forward: (total_q, nheads, dv) and (nheads,
    total_q), or with pack_gqa = g > 1 (q's rows PackGQA's, t * g + j) per query head:
    (total_q / g, nheads * g, dv) and (nheads * g, total_q / g)."""
    total_q, nheads, _ = q.shape
    rows, heads = total_q // pack_gqa, nheads * pack_gqa
    return (rows, heads, dv), (heads, rows)


def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                     softmax_scale, causal, window_size_left=-1, window_size_right=-1, top_left=False, softcap=0.0,
                     sink=None, num_splits=1, pack_gqa=1):
    # The shapes depend on q (and v's head dim, pack_gqa) alone: the sequences only decide which
    # rows see which keys.
    out_shape, lse_shape = packed_output_shapes(q, v.shape[-1], pack_gqa)
    return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32)


def _varlen_bwd_fake(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
                     max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size_left=-1, window_size_right=-1,
                     top_left=False, deterministic=False, softcap=0.0, sink=None):
    # Contiguous gradients shaped like their inputs: dq (total_q, nheads, headdim), dk and dv (total_k, nheads_kv, headdim).
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), _dsink_fake(q, sink)


def _varlen_setup_context(ctx, inputs, output, deterministic: bool) -> None:
    # inputs has every schema argument, defaults filled in (op_autograd.register_autograd).
    (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
     softmax_scale, causal, window_size_left, window_size_right, top_left, softcap, sink, _, pack_gqa) = inputs
    _no_sink_gradient(sink)
    ctx.pack_gqa = pack_gqa
    out, softmax_lse = output
    # Only the inputs, out, lse and the int32 sequence tensors: nothing of size seqlen².
    ctx.save_for_backward(q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k)
    ctx.max_seqlen_q, ctx.max_seqlen_k = max_seqlen_q, max_seqlen_k
    ctx.softmax_scale, ctx.causal, ctx.softcap = softmax_scale, causal, softcap
    ctx.window_size_left, ctx.window_size_right, ctx.top_left = window_size_left, window_size_right, top_left
    ctx.deterministic = bool(deterministic or torch.are_deterministic_algorithms_enabled())
    ctx.num_inputs = len(inputs)
    ctx.set_materialize_grads(False)  # as for fwd: no zero-filled lse gradient


def _varlen_fwd_setup_context(ctx, inputs, output):
    _varlen_setup_context(ctx, inputs, output, deterministic=False)


def _varlen_fwd_deterministic_setup_context(ctx, inputs, output):
    _varlen_setup_context(ctx, inputs, output, deterministic=True)


def kernel_readable(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a contiguous copy when the kernels could not read it in place: a last dimension
    that is not contiguous, or a broadcast dimension (stride 0, size > 1), which autograd hands
    over as the gradient of e.g. ``out.sum(0)``; the TMA descriptors are meant for real strides."""
    if t.stride(-1) == 1 and all(stride != 0 or size == 1 for size, stride in zip(t.shape, t.stride())):
        return t
    return t.contiguous()


def _varlen_fwd_backward(ctx, grad_out, grad_lse):
    # The gradient flowing into softmax_lse is not propagated, as for fwd.
    q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k = ctx.saved_tensors
    rest = (None,) * (ctx.num_inputs - 3)
    if grad_out is None:
        return (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)) + rest
    if ctx.pack_gqa != 1:
        raise RuntimeError("flash_attn_hopper: varlen_fwd with pack_gqa > 1 (PackGQA inside the op, for decode) "
                           "has no backward; call it with pack_gqa=1 where gradients are needed")
    op = varlen_bwd_op()
    dq, dk, dv, _ = op(
        kernel_readable(grad_out), q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k,
        ctx.max_seqlen_q, ctx.max_seqlen_k, ctx.softmax_scale, ctx.causal, ctx.window_size_left,
        ctx.window_size_right, ctx.top_left, ctx.deterministic, ctx.softcap,
    )
    return (dq, dk, dv) + rest


def _varlen_fwd_deterministic_bwd_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                                       max_seqlen_k, softmax_scale, causal, window_size_left=-1,
                                       window_size_right=-1, top_left=False, softcap=0.0, sink=None,
                                       num_splits=1, pack_gqa=1):
    # varlen_fwd's kernel, below autograd: only the autograd formula differs.
    return torch.ops.flash_attn_hopper.varlen_fwd.default(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
        softmax_scale, causal, window_size_left, window_size_right, top_left, softcap, sink, num_splits, pack_gqa,
    )


def register_varlen_bwd_fake(lib=None) -> None:
    """Register the varlen_bwd op's fake kernel (done at import when the build has the op)."""
    torch.library.register_fake("flash_attn_hopper::varlen_bwd", _varlen_bwd_fake, lib=lib)


def register_varlen(lib) -> None:
    """What makes ``varlen_fwd`` a good citizen: its fake kernel and autograd formula, and the
    Python-defined ``varlen_fwd_deterministic_bwd`` (same schema and kernel, deterministic backward),
    all owned by ``lib`` (a FRAGMENT ``torch.library.Library`` of the flash_attn_hopper namespace).

    Done at import when the extension defines ``varlen_fwd``; the CPU tests call it for a
    stand-in op with :data:`VARLEN_FWD_SCHEMA` (tests/op_emulator.py) and destroy ``lib`` after.
    """
    torch.library.register_fake("flash_attn_hopper::varlen_fwd", _varlen_fwd_fake, lib=lib)
    op_autograd.register_autograd(
        "flash_attn_hopper::varlen_fwd", _varlen_fwd_backward, setup_context=_varlen_fwd_setup_context, lib=lib
    )
    lib.define(VARLEN_FWD_SCHEMA.replace("varlen_fwd(", f"{VARLEN_DETERMINISTIC_FWD_NAME}(", 1))
    lib.impl(VARLEN_DETERMINISTIC_FWD_NAME, _varlen_fwd_deterministic_bwd_impl, "CompositeExplicitAutograd")
    name = f"flash_attn_hopper::{VARLEN_DETERMINISTIC_FWD_NAME}"
    torch.library.register_fake(name, _varlen_fwd_fake, lib=lib)
    op_autograd.register_autograd(
        name, _varlen_fwd_backward, setup_context=_varlen_fwd_deterministic_setup_context, lib=lib
    )


#: Owns the Python-defined op; kept for the life of the process.
_PY_LIBRARY = None

if _C is not None:
    _PY_LIBRARY = torch.library.Library("flash_attn_hopper", "FRAGMENT")
    torch.library.register_fake("flash_attn_hopper::fwd", _fwd_fake)
    op_autograd.register_autograd("flash_attn_hopper::fwd", _fwd_backward, setup_context=_fwd_setup_context,
                                  lib=_PY_LIBRARY)
    if has_bwd_op():
        register_bwd_fake()

    _PY_LIBRARY.define(FWD_SCHEMA.replace("fwd(", f"{DETERMINISTIC_FWD_NAME}(", 1))
    # Every backend: fwd decides which devices have a kernel.
    _PY_LIBRARY.impl(DETERMINISTIC_FWD_NAME, _fwd_deterministic_bwd_impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"flash_attn_hopper::{DETERMINISTIC_FWD_NAME}", _fwd_fake, lib=_PY_LIBRARY)
    op_autograd.register_autograd(
        f"flash_attn_hopper::{DETERMINISTIC_FWD_NAME}",
        _fwd_backward,
        setup_context=_fwd_deterministic_setup_context,
        lib=_PY_LIBRARY,
    )
    if has_varlen_fwd_op():
        register_varlen(_PY_LIBRARY)
    if has_varlen_bwd_op():
        register_varlen_bwd_fake()
