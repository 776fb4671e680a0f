"""flash_attn_hopper as an implementation in torch's flash-attention registry.

torch (2.11 and later) keeps a registry of FlashAttention implementations in
``torch.nn.attention``.  Importing flash_attn_hopper registers one named
``"flash_attn_hopper"`` (registering activates nothing); a user opts in with::

    from torch.nn.attention import activate_flash_attention_impl, restore_flash_attention_impl
    activate_flash_attention_impl("flash_attn_hopper")
    ...   # F.scaled_dot_product_attention's FLASH backend now runs our kernels
    restore_flash_attention_impl()

Activation overrides aten's CUDA kernels of ``_scaled_dot_product_flash_attention``
(what SDPA's FLASH backend calls), ``_flash_attention_forward`` and, on torch
versions that have it, ``_flash_attention_forward_no_dropout_inplace``; in a
build with the backward kernels (the extension defines the bwd op) also those
of the backward ops ``_scaled_dot_product_flash_attention_backward`` (what
autograd calls for SDPA's FLASH backend) and ``_flash_attention_backward``.
Each override runs our kernel when the call is one it computes exactly and
otherwise calls the kernel that was registered before (torch's
FlashAttention-2), taken with ``torch.library.get_kernel`` at activation.

Semantics are the replaced kernels', not SDPA's: ``is_causal`` and the windows
are aligned to the bottom-right corner (FlashAttention's convention; SDPA
itself never sends a causal call with L != S to the FLASH backend), windows
are clamped as FlashAttention-2 clamps them, ``scale`` defaults to
1/sqrt(head dim of the op's query), rows that see no key give output 0 and
log-sum-exp +inf, and outputs and gradients have the strides of aten's meta
kernels (``empty_like(query)``, ``empty_like(key)``...), so ``torch.compile``
finds what it traced.

Variable-length calls (``cum_seq_q`` / ``cum_seq_k``, optionally ``seqused_k``:
what ``torch.nn.attention.varlen.varlen_attn`` sends) run the varlen ops
(``varlen_fwd`` / ``varlen_bwd``) with FlashAttention-2's varlen conventions:
q, k, v (total, heads, head_dim), log-sum-exp (heads, total_q) with +inf for rows
that see no key, windows clamped against ``max_k``; ``block_table`` (paged KV) reaches our paged
kernels (forward only: with inputs that require grad it goes to torch), ALiBi and dropout still
go to torch's kernels; ``num_splits`` reaches our split-KV kernels.

Backward: the backward overrides take exactly what the forward ops return
(output and log-sum-exp in FlashAttention-2's conventions), whichever
kernel computed them, and apply the same masks as the forward overrides.
Calls they refuse (dropout, variable-length batches in a build without the
varlen_bwd op, a head dim or dtype without a backward kernel in this build,
...) go to aten's FlashAttention-2 backward.  In a build without the backward kernels only the forward ops are
overridden, and aten's own backward differentiates our forward; it needs
only the output and the log-sum-exp.  ``Activation.op_names`` lists what an
activation replaced, ``Activation.backward_refusal`` why the backward ops
were left alone (None when they were overridden too).
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass, field

import torch

from . import _build_info, manifest, ops, support
from .registry_refusals import (
    flash_attention_backward_refusal,
    flash_attention_forward_quantized_refusal,
    flash_attention_forward_refusal,
    sdpa_flash_backward_refusal,
    sdpa_flash_quantized_refusal,
    sdpa_flash_refusal,
)

#: DEBUG records say, per call of an overridden aten op, whether our kernels ran or why it fell back.
_log = logging.getLogger(__name__)

#: The name under which flash_attn_hopper appears in torch's registry.
IMPL_NAME = "flash_attn_hopper"

#: Why registering with torch's registry failed at import (None when it worked).
REGISTRATION_ERROR: str | None = None

# aten ops whose CUDA kernel activation overrides, when this torch has them.
_FORWARD_OPS = (
    "_scaled_dot_product_flash_attention",
    "_flash_attention_forward",
    "_flash_attention_forward_no_dropout_inplace",  # writes into a given `out`; in 2.14, not in 2.11
    "_scaled_dot_product_flash_attention.quantized",  # FP8 with descales (fp8.py)
    "_flash_attention_forward.quantized",
)


def has_aten_op(name: str) -> bool:
    """Whether this torch has ``aten::name`` ("op" or "op.overload")."""
    op, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, op, None)
    return packet is not None and (not overload or overload in packet.overloads())

# aten ops whose CUDA kernel activation also overrides when this build has the backward kernels.
_BACKWARD_OPS = (
    "_scaled_dot_product_flash_attention_backward",  # autograd's formula for SDPA's FLASH backend
    "_flash_attention_backward",  # ... for _flash_attention_forward, and what the one above calls in aten
)


# --------------------------------------------------------------------------
# What FlashAttention-2 computes, in terms of our op
# --------------------------------------------------------------------------


def _has_blind_rows(right: int, seqlen_q: int, seqlen_k: int) -> bool:
    """Whether a bottom-right window leaves some query row with no key (the first rows).

    Row i sees keys up to i + seqlen_k - seqlen_q + right; row 0 sees none when
    that is negative.  A left bound never empties a row: it reaches key seqlen_k - 1
    at least for the last row and only moves right with i, like the right bound.
    """
    return right >= 0 and seqlen_k - seqlen_q + right < 0


def _softmax_scale(q: torch.Tensor, scale) -> float:
    """aten's scale, computed as it computes it: the given one, else 1 / sqrt(head_dim) in double precision.

    ``q`` is the op's own query: when SDPA pads an odd head dim it passes the
    scale of the unpadded one explicitly, forward and backward alike.
    """
    return 1.0 / math.sqrt(q.size(-1)) if scale is None else float(scale)


def _splits(num_splits) -> dict:
    """The ops' num_splits for aten's (None: the ops' default, no split; registry_refusals refuses a negative one)."""
    return {} if num_splits is None or num_splits == 1 else {"num_splits": int(num_splits)}


def _run_forward(q, k, v, scale, is_causal, window_left, window_right, num_splits=None):
    """Our op on (batch, seqlen, heads, head_dim) inputs with FlashAttention-2's conventions.

    Returns out (contiguous, batch, seqlen_q, heads, head_dim) and lse (batch, heads, seqlen_q).
    """
    seqlen_q, seqlen_k = q.size(1), k.size(1)
    softmax_scale = _softmax_scale(q, scale)
    left, right = support.fa2_window(window_left, window_right, is_causal, seqlen_k)
    out, lse = torch.ops.flash_attn_hopper.fwd(q, k, v, softmax_scale, bool(is_causal), left, right, False,
                                               **_splits(num_splits))
    if _has_blind_rows(right, seqlen_q, seqlen_k):
        # Ours gives -inf (the log of an empty sum), FlashAttention-2 +inf: its backward
        # computes exp(s - lse) and needs +inf to make those rows' probabilities 0.
        lse = lse.masked_fill(lse == float("-inf"), float("inf"))
    return out, lse


def _run_varlen_forward(q, k, v, cum_seq_q, cum_seq_k, seqused_k, max_q, max_k, scale, is_causal,
                        window_left, window_right, num_splits=None):
    """varlen_fwd on (total, heads, head_dim) inputs with FlashAttention-2's conventions.

    Returns out (contiguous, total_q, heads, head_dim) and lse (heads, total_q), +inf
    (FlashAttention-2's) where ours is -inf: rows that see no key.  The window is clamped
    against max_k for every sequence, as FlashAttention-2's varlen kernel clamps it.
    """
    softmax_scale = _softmax_scale(q, scale)
    left, right = support.fa2_window(window_left, window_right, is_causal, max_k)
    out, lse = ops.varlen_fwd_op()(
        q, k, v, cum_seq_q, cum_seq_k, None, seqused_k, max_q, max_k, softmax_scale, bool(is_causal), left, right,
        False, **_splits(num_splits),
    )
    # Which rows see no key depends on each sequence's lengths (device data): convert every -inf.
    return out, lse.masked_fill(lse == float("-inf"), float("inf"))


def _kernel_readable(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a contiguous copy of it when the bwd op could not read it in place.

    The kernels read rows with TMA, so the last dimension needs stride 1 (the
    op checks that for dout but not for out).  A broadcast dimension (stride 0
    with size > 1), which autograd hands over as the gradient of e.g.
    ``out.mean(0)``, is materialised too: the op's TMA descriptors are meant
    for real strides.  aten's FlashAttention-2 makes both contiguous always;
    this copies only in those cases.
    """
    if t.stride(-1) == 1 and all(stride != 0 or size == 1 for size, stride in zip(t.shape, t.stride())):
        return t
    return t.contiguous()


def _run_backward(grad_out, q, k, v, out, lse, scale, is_causal, window_left, window_right):
    """The bwd op on (batch, seqlen, heads, head_dim) tensors, with the forward's conventions.

    The same scale and window as :func:`_run_forward`, bottom-right aligned
    (``top_left=False``).  ``lse`` may hold +inf (FlashAttention-2's, and what
    our forward override returns) or -inf (our op's) for rows without keys:
    the op gives those rows zero gradients either way.  Deterministic when
    ``torch.use_deterministic_algorithms(True)`` is in force, also with
    ``warn_only=True`` (where aten's kernel only warns): as ops.py's autograd
    formula decides it.  Returns contiguous dq like q, dk and dv like k and v.
    """
    softmax_scale = _softmax_scale(q, scale)
    left, right = support.fa2_window(window_left, window_right, is_causal, k.size(1))
    return ops.bwd_op()(
        _kernel_readable(grad_out),
        q,
        k,
        v,
        _kernel_readable(out),
        lse,
        softmax_scale,
        bool(is_causal),
        left,
        right,
        False,
        torch.are_deterministic_algorithms_enabled(),
    )[:3]


def _run_varlen_backward(grad_out, q, k, v, out, lse, cum_seq_q, cum_seq_k, max_q, max_k, scale, is_causal,
                         window_left, window_right):
    """varlen_bwd with the conventions of :func:`_run_varlen_forward`; lse may hold +inf or -inf for
    rows that see no key.  Deterministic as :func:`_run_backward` decides it."""
    softmax_scale = _softmax_scale(q, scale)
    left, right = support.fa2_window(window_left, window_right, is_causal, max_k)
    return ops.varlen_bwd_op()(
        _kernel_readable(grad_out), q, k, v, _kernel_readable(out), lse, cum_seq_q, cum_seq_k, None, None,
        max_q, max_k, softmax_scale, bool(is_causal), left, right, False,
        torch.are_deterministic_algorithms_enabled(),
    )[:3]


def _with_strides_of(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``result`` laid out as ``torch.empty_like(like)`` is (what aten's meta kernels promise), in
    result's dtype (FP8 inputs give bf16).

    No copy when the layouts already agree, e.g. for BHSD inputs that are
    transposed views of (batch, seqlen, heads, head_dim) memory, as most models make them.
    """
    target = torch.empty_like(like, dtype=result.dtype)
    if target.stride() == result.stride():
        return result
    target.copy_(result)
    return target


def _aux_outputs(query: torch.Tensor):
    """rng_state, the unused offset and the debug mask, as FlashAttention-2 returns them without dropout."""
    rng_state = torch.zeros((2,), dtype=torch.uint64, device=query.device)
    unused = torch.zeros((), dtype=torch.uint64, device=query.device)
    debug_mask = torch.empty(0, dtype=query.dtype, device=query.device)
    return rng_state, unused, debug_mask


# --------------------------------------------------------------------------
# The overrides
# --------------------------------------------------------------------------


def _sdpa_flash_forward(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    out, lse = _run_forward(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), scale, is_causal, None, None
    )
    rng_state, unused, debug_mask = _aux_outputs(query)
    output = _with_strides_of(out.transpose(1, 2), query)
    return output, lse, None, None, query.size(2), key.size(2), rng_state, unused, debug_mask


def _run_paged_forward(q, k_pages, v_pages, block_table, cum_seq_q, cum_seq_k, seqused_k, max_q, max_k, scale,
                       is_causal, window_left, window_right, num_splits=None):
    """paged_fwd with FlashAttention-2's conventions (as _run_varlen_forward): sequence b's keys are
    seqused_k[b] positions of its block_table row from cum_seq_k[b] (from 0 without cum_seq_k)."""
    from . import paged

    softmax_scale = _softmax_scale(q, scale)
    left, right = support.fa2_window(window_left, window_right, is_causal, max_k)
    if cum_seq_k is None:
        cum_seq_k = paged._zeros(cum_seq_q.numel(), q.device)
    out, lse = paged.paged_fwd_op()(  # the binding bounds max_k by the table's capacity
        q, k_pages, v_pages, block_table, cum_seq_q, cum_seq_k, seqused_k, max_q, max_k,
        softmax_scale, bool(is_causal), left, right, False, **_splits(num_splits),
    )
    return out, lse.masked_fill(lse == float("-inf"), float("inf"))


def _run_any_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, is_causal, scale, window_left,
                     window_right, seqused_k, block_table, num_splits):
    """(out, lse) of an aten flash forward call: paged, variable-length or dense."""
    if block_table is not None:
        return _run_paged_forward(query, key, value, block_table, cum_seq_q, cum_seq_k, seqused_k, max_q, max_k,
                                  scale, is_causal, window_left, window_right, num_splits)
    if cum_seq_q is not None:
        return _run_varlen_forward(query, key, value, cum_seq_q, cum_seq_k, seqused_k, max_q, max_k, scale,
                                   is_causal, window_left, window_right, num_splits)
    return _run_forward(query, key, value, scale, is_causal, window_left, window_right, num_splits)


def _flash_attention_forward(
    query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, *,
    scale=None, window_size_left=None, window_size_right=None, seqused_k=None, block_table=None, num_splits=None,
    **_,
):
    out, lse = _run_any_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, is_causal, scale,
                                window_size_left, window_size_right, seqused_k, block_table, num_splits)
    rng_state, unused, debug_mask = _aux_outputs(query)
    return _with_strides_of(out, query), lse, rng_state, unused, debug_mask


def _flash_attention_forward_inplace(
    out, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, *,
    scale=None, window_size_left=None, window_size_right=None, seqused_k=None, block_table=None, num_splits=None,
    **_,
):
    result, lse = _run_any_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, is_causal, scale,
                                   window_size_left, window_size_right, seqused_k, block_table, num_splits)
    out.copy_(result)
    return lse


def _sdpa_flash_backward(
    grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
    philox_seed, philox_offset, *, scale=None, **_,
):
    # (batch, heads, seqlen, head_dim) in and out: the op sees transposed views, never copies.
    grads = _run_backward(
        *(t.transpose(1, 2) for t in (grad_out, query, key, value, out)), logsumexp, scale, is_causal, None, None
    )
    return tuple(_with_strides_of(g.transpose(1, 2), like) for g, like in zip(grads, (query, key, value)))


def _flash_attention_backward(
    grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
    rng_state, unused, *, scale=None, window_size_left=None, window_size_right=None, **_,
):
    if cum_seq_q is not None:
        grads = _run_varlen_backward(
            grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, scale, is_causal,
            window_size_left, window_size_right,
        )
    else:
        grads = _run_backward(
            grad_out, query, key, value, out, logsumexp, scale, is_causal, window_size_left, window_size_right
        )
    return tuple(_with_strides_of(g, like) for g, like in zip(grads, (query, key, value)))


def _run_fp8_forward(q, k, v, descales, cum_seq_q, cum_seq_k, seqused_k, max_q, max_k, scale, is_causal,
                     window_left, window_right):
    """fwd_fp8 / varlen_fwd_fp8 (fp8.py's checks first) with FlashAttention-2's conventions, as
    _run_forward / _run_varlen_forward: out bf16, lse +inf where ours is -inf."""
    from . import fp8

    names = ("q_descale", "k_descale", "v_descale")
    varlen = cum_seq_q is not None
    fp8.check(q, k, v, dict(zip(names, descales)), varlen=varlen, batch=cum_seq_q.numel() - 1 if varlen else None)
    softmax_scale = _softmax_scale(q, scale)
    seqlen_q, seqlen_k = (max_q, max_k) if varlen else (q.size(1), k.size(1))
    left, right = support.fa2_window(window_left, window_right, is_causal, seqlen_k)
    if varlen:
        out, lse = torch.ops.flash_attn_hopper.varlen_fwd_fp8(q, k, v, cum_seq_q, cum_seq_k, None, seqused_k, max_q,
                                                              max_k, *descales, softmax_scale, bool(is_causal), left,
                                                              right)
    else:
        out, lse = torch.ops.flash_attn_hopper.fwd_fp8(q, k, v, *descales, softmax_scale, bool(is_causal), left, right)
    if varlen or _has_blind_rows(right, seqlen_q, seqlen_k):
        lse = lse.masked_fill(lse == float("-inf"), float("inf"))
    return out, lse


def _sdpa_flash_forward_quantized(query, key, value, q_descale=None, k_descale=None, v_descale=None, dropout_p=0.0,
                                  is_causal=False, return_debug_mask=False, *, scale=None):
    out, lse = _run_fp8_forward(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                (q_descale, k_descale, v_descale), None, None, None, 0, 0, scale, is_causal, None, None)
    rng_state, unused, debug_mask = _aux_outputs(query)
    output = _with_strides_of(out.transpose(1, 2), query)
    return output, lse, None, None, query.size(2), key.size(2), rng_state, unused, debug_mask


def _flash_attention_forward_quantized(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                                       return_debug_mask, q_descale=None, k_descale=None, v_descale=None, *,
                                       scale=None, window_size_left=None, window_size_right=None, seqused_k=None,
                                       **_):
    out, lse = _run_fp8_forward(query, key, value, (q_descale, k_descale, v_descale), cum_seq_q, cum_seq_k,
                                seqused_k, max_q, max_k, scale, is_causal, window_size_left, window_size_right)
    rng_state, unused, debug_mask = _aux_outputs(query)
    return _with_strides_of(out, query), lse, rng_state, unused, debug_mask


def _inplace_refusal(out, *args, **kwargs):
    reason = flash_attention_forward_refusal(*args, **kwargs)
    if reason is None and (out.shape != args[0].shape or out.dtype != args[0].dtype):
        return "out does not have the query's shape and dtype"
    return reason


_OVERRIDES = {
    # aten op: (why it falls back, our implementation)
    "_scaled_dot_product_flash_attention": (sdpa_flash_refusal, _sdpa_flash_forward),
    "_flash_attention_forward": (flash_attention_forward_refusal, _flash_attention_forward),
    "_flash_attention_forward_no_dropout_inplace": (_inplace_refusal, _flash_attention_forward_inplace),
    "_scaled_dot_product_flash_attention_backward": (sdpa_flash_backward_refusal, _sdpa_flash_backward),
    "_flash_attention_backward": (flash_attention_backward_refusal, _flash_attention_backward),
    "_scaled_dot_product_flash_attention.quantized": (sdpa_flash_quantized_refusal, _sdpa_flash_forward_quantized),
    "_flash_attention_forward.quantized": (flash_attention_forward_quantized_refusal,
                                           _flash_attention_forward_quantized),
}


def _override(op_name: str, original):
    """The CUDA kernel for ``aten::op_name``: ours where it applies, else ``original``."""
    refusal, implementation = _OVERRIDES[op_name]

    def kernel(keyset, *args, **kwargs):
        reason = refusal(*args, **kwargs)
        if _log.isEnabledFor(logging.DEBUG):
            shapes = [(tuple(a.shape), a.stride()) for a in args if isinstance(a, torch.Tensor)]
            _log.debug("aten::%s %s: %s", op_name, shapes, "ours" if reason is None else f"torch's kernel ({reason})")
        if reason is not None:
            return original.call_boxed(keyset, *args, **kwargs)
        return implementation(*args, **kwargs)

    kernel.__name__ = f"flash_attn_hopper_{op_name.lstrip('_').replace('.', '_')}"
    return kernel


@dataclass
class Activation:
    """What activation installed; ``remove()`` puts torch's kernels back.

    ``originals`` maps each overridden aten op to the kernel it falls back to;
    ``backward_refusal`` says why the backward ops kept aten's kernels (None
    when they were overridden too).
    """

    library: torch.library.Library | None
    originals: dict = field(default_factory=dict)
    backward_refusal: str | None = None

    @property
    def op_names(self) -> list[str]:
        """The aten ops whose CUDA kernel this activation replaced, sorted."""
        return sorted(self.originals)

    def remove(self) -> None:
        # Library._destroy deregisters at once; dropping the last reference would too, later.
        if self.library is not None and hasattr(self.library, "_destroy"):
            self.library._destroy()
        self.library = None


def activation_refusal() -> str | None:
    """Why activation cannot work in this process; None when it can."""
    if not ops.extension_loaded():
        return f"the CUDA extension is not available ({ops.LOAD_ERROR}). {ops.build_hint()}"
    if not hasattr(torch.library, "get_kernel"):
        return (
            f"this torch ({torch.__version__}) has no torch.library.get_kernel, which the fallback to "
            "torch's own kernels needs (torch >= 2.11 has it)"
        )
    return None


def backward_override_refusal() -> str | None:
    """Why activation leaves aten's backward kernels in place; None when it overrides them too.

    The backward ops are overridden when the extension defines the bwd op with
    the arguments ops.py passes and the recorded build (if any) compiled
    backward kernels.  Otherwise aten's FlashAttention-2 backward
    differentiates our forward, as before this build had a backward.
    """
    if not ops.has_bwd_op():
        return manifest.direction_unavailable_message("bwd")
    if _build_info.backward_compiled() is False:
        return "the extension defines the bwd op, but its build record lists no backward kernels (a broken build)"
    try:
        ops.bwd_op()  # raises when the compiled op's arguments are not the ones ops.py passes
    except RuntimeError as err:
        return str(err)
    return None


def register_fn() -> Activation:
    """Install the overrides; torch's ``activate_flash_attention_impl`` calls this.

    Raises RuntimeError (before touching the dispatcher) when the extension is
    missing or torch lacks what the fallback needs.  The backward ops are
    overridden only when :func:`backward_override_refusal` says None; the
    forward ones regardless.
    """
    reason = activation_refusal()
    if reason is not None:
        raise RuntimeError(f"flash_attn_hopper cannot be activated as a flash-attention implementation: {reason}")
    backward_refusal = backward_override_refusal()
    candidates = _FORWARD_OPS + (_BACKWARD_OPS if backward_refusal is None else ())
    names = [name for name in candidates if has_aten_op(name)]
    # The kernels to fall back to are the ones registered now, before ours replace them.
    originals = {name: torch.library.get_kernel(f"aten::{name}", "CUDA") for name in names}
    library = torch.library.Library("aten", "IMPL", "CUDA")
    with warnings.catch_warnings():
        # Replacing aten's kernels is the point of activation; torch warns about it once.
        warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
        for name in names:
            library.impl(name, _override(name, originals[name]), "CUDA", with_keyset=True)
    return Activation(library, originals, backward_refusal)


def _register_with_torch() -> str | None:
    """Register (never activate) with torch's registry; the reason when that is impossible."""
    try:
        from torch.nn.attention import register_flash_attention_impl
    except ImportError:
        return f"torch {torch.__version__} has no flash-attention registry (torch.nn.attention, torch >= 2.11)"
    try:
        register_flash_attention_impl(IMPL_NAME, register_fn=register_fn)
    except Exception as err:  # import must never fail because of the registry
        return f"registering with torch.nn.attention failed: {type(err).__name__}: {err}"
    return None


REGISTRATION_ERROR = _register_with_torch()
