"""flash_attn_hopper as an implementation in torch's flash-attention registry.

torch (2.11 and later) keeps a registry of FlashAttention implementations in
``torch.nn.attention``.  Importing flash_attn_hopper registers one named
``"flash_attn_hopper"`` (registering activates nothing); a user opts in with::

    from torch.nn.attention import activate_flash_attention_impl, restore_flash_attention_impl
    activate_flash_attention_impl("flash_attn_hopper")
    ...   # F.scaled_dot_product_attention's FLASH backend now runs our forward kernel
    restore_flash_attention_impl()

Activation overrides aten's CUDA kernels of ``_scaled_dot_product_flash_attention``
(what SDPA's FLASH backend calls), ``_flash_attention_forward`` and, on torch
versions that have it, ``_flash_attention_forward_no_dropout_inplace``.  Each
override runs our kernel when the call is one it computes exactly and
otherwise calls the kernel that was registered before (torch's
FlashAttention-2), taken with ``torch.library.get_kernel`` at activation.

Semantics are the replaced kernels', not SDPA's: ``is_causal`` and the windows
are aligned to the bottom-right corner (FlashAttention's convention; SDPA
itself never sends a causal call with L != S to the FLASH backend), windows
are clamped as FlashAttention-2 clamps them, rows that see no key give
output 0 and log-sum-exp +inf, and outputs have the strides of aten's meta
kernels (``empty_like(query)``), so ``torch.compile`` finds what it traced.

Backward: the backward ops are not overridden, so aten's own
FlashAttention-2 backward kernel differentiates our forward; it needs only
the output and the log-sum-exp, which follow its conventions exactly.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import torch

from . import ops
from .sdpa import flash_refusal

#: The name under which flash_attn_hopper appears in torch's registry.
IMPL_NAME = "flash_attn_hopper"

#: Why registering with torch's registry failed at import (None when it worked).
REGISTRATION_ERROR: str | None = None

# aten ops whose CUDA kernel activation overrides, when this torch has them.
_FORWARD_OPS = (
    "_scaled_dot_product_flash_attention",
    "_flash_attention_forward",
    "_flash_attention_forward_no_dropout_inplace",  # writes into a given `out`; in 2.14, not in 2.11
)


# --------------------------------------------------------------------------
# What FlashAttention-2 computes, in terms of our op
# --------------------------------------------------------------------------


def _fa2_window(left, right, is_causal: bool, seqlen_k: int) -> tuple[int, int]:
    """The (left, right) window aten's FlashAttention-2 applies; -1 = unbounded.

    FlashAttention-2 treats negative sizes and sizes >= seqlen_k as unbounded,
    sets right = 0 for causal, and bounds an unbounded right side at seqlen_k
    when only the left side is given.  That last rule changes the result when
    seqlen_q > seqlen_k + 1, so it is reproduced, not simplified away.
    """
    left = -1 if left is None or left < 0 or left >= seqlen_k else int(left)
    right = -1 if right is None or right < 0 or right >= seqlen_k else int(right)
    if is_causal:
        right = 0
    if left >= 0 and right < 0:
        right = seqlen_k
    return left, right


def _has_blind_rows(right: int, seqlen_q: int, seqlen_k: int) -> bool:
    """Whether a bottom-right window leaves some query row with no key (the first rows).

    Row i sees keys up to i + seqlen_k - seqlen_q + right; row 0 sees none when
    that is negative.  A left bound never empties a row: it reaches key seqlen_k - 1
    at least for the last row and only moves right with i, like the right bound.
    """
    return right >= 0 and seqlen_k - seqlen_q + right < 0


def _run_forward(q, k, v, scale, is_causal, window_left, window_right):
    """Our op on (batch, seqlen, heads, head_dim) inputs with FlashAttention-2's conventions.

    Returns out (contiguous, batch, seqlen_q, heads, head_dim) and lse (batch, heads, seqlen_q).
    """
    seqlen_q, seqlen_k = q.size(1), k.size(1)
    # aten's default, computed as it computes it: 1 / sqrt(head_dim) in double precision.
    softmax_scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else float(scale)
    left, right = _fa2_window(window_left, window_right, is_causal, seqlen_k)
    out, lse = torch.ops.flash_attn_hopper.fwd(q, k, v, softmax_scale, bool(is_causal), left, right, False)
    if _has_blind_rows(right, seqlen_q, seqlen_k):
        # Ours gives -inf (the log of an empty sum), FlashAttention-2 +inf: its backward
        # computes exp(s - lse) and needs +inf to make those rows' probabilities 0.
        lse = lse.masked_fill(lse == float("-inf"), float("inf"))
    return out, lse


def _with_strides_of(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``result`` laid out as ``torch.empty_like(like)`` is (what aten's meta kernels promise).

    No copy when the layouts already agree, e.g. for BHSD inputs that are
    transposed views of (batch, seqlen, heads, head_dim) memory, as most models make them.
    """
    target = torch.empty_like(like)
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
# Refusals: when the replaced kernel runs instead
# --------------------------------------------------------------------------


def sdpa_flash_refusal(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    """Why ``aten::_scaled_dot_product_flash_attention`` falls back (None: our kernel runs).

    Arguments are that op's; query (batch, heads, L, E), key and value (batch, heads_kv, S, E).
    """
    if dropout_p != 0.0:
        return f"dropout_p={dropout_p}"
    if return_debug_mask:
        return "return_debug_mask=True"
    if query.dim() != 4:
        return "the query is not 4-dimensional"
    return flash_refusal(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2))


def flash_attention_forward_refusal(
    query,
    key,
    value,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    return_debug_mask,
    *,
    scale=None,
    window_size_left=None,
    window_size_right=None,
    seqused_k=None,
    alibi_slopes=None,
    block_table=None,
    num_splits=None,
    **newer,
):
    """Why ``aten::_flash_attention_forward`` falls back (None: our kernel runs).

    Arguments are that op's (query, key, value in (batch, seqlen, heads, head_dim)).
    ``num_splits`` is a scheduling hint with no effect on the result.
    Keyword arguments of a later torch that this version does not know make it fall back.
    """
    if cum_seq_q is not None or cum_seq_k is not None:
        return "variable-length (cum_seq_q / cum_seq_k) inputs"
    if dropout_p != 0.0:
        return f"dropout_p={dropout_p}"
    if return_debug_mask:
        return "return_debug_mask=True"
    if seqused_k is not None:
        return "seqused_k is given"
    if alibi_slopes is not None:
        return "alibi_slopes is given"
    if block_table is not None:
        return "block_table (paged KV) is given"
    unknown = sorted(name for name, value in newer.items() if value is not None)
    if unknown:
        return f"arguments unknown to this version of flash_attn_hopper: {', '.join(unknown)}"
    return flash_refusal(query, key, value)


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


def _flash_attention_forward(
    query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, *,
    scale=None, window_size_left=None, window_size_right=None, **_,
):
    out, lse = _run_forward(query, key, value, scale, is_causal, window_size_left, window_size_right)
    rng_state, unused, debug_mask = _aux_outputs(query)
    return _with_strides_of(out, query), lse, rng_state, unused, debug_mask


def _flash_attention_forward_inplace(
    out, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, *,
    scale=None, window_size_left=None, window_size_right=None, **_,
):
    result, lse = _run_forward(query, key, value, scale, is_causal, window_size_left, window_size_right)
    out.copy_(result)
    return lse


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
}


def _override(op_name: str, original):
    """The CUDA kernel for ``aten::op_name``: ours where it applies, else ``original``."""
    refusal, implementation = _OVERRIDES[op_name]

    def kernel(keyset, *args, **kwargs):
        if refusal(*args, **kwargs) is not None:
            return original.call_boxed(keyset, *args, **kwargs)
        return implementation(*args, **kwargs)

    kernel.__name__ = f"flash_attn_hopper_{op_name.lstrip('_')}"
    return kernel


@dataclass
class Activation:
    """What activation installed; ``remove()`` puts torch's kernels back."""

    library: torch.library.Library | None
    originals: dict = field(default_factory=dict)

    @property
    def op_names(self) -> list[str]:
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


def register_fn() -> Activation:
    """Install the overrides; torch's ``activate_flash_attention_impl`` calls this.

    Raises RuntimeError (before touching the dispatcher) when the extension is
    missing or torch lacks what the fallback needs.
    """
    reason = activation_refusal()
    if reason is not None:
        raise RuntimeError(f"flash_attn_hopper cannot be activated as a flash-attention implementation: {reason}")
    names = [name for name in _FORWARD_OPS if hasattr(torch.ops.aten, name)]
    # The kernels to fall back to are the ones registered now, before ours replace them.
    originals = {name: torch.library.get_kernel(f"aten::{name}", "CUDA") for name in names}
    library = torch.library.Library("aten", "IMPL", "CUDA")
    with warnings.catch_warnings():
        # Replacing aten's kernels is the point of activation; torch warns about it once.
        warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
        for name in names:
            library.impl(name, _override(name, originals[name]), "CUDA", with_keyset=True)
    return Activation(library, originals)


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
