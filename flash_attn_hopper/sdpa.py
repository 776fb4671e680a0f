"""``torch.nn.functional.scaled_dot_product_attention`` on flash_attn_hopper's kernels.

:func:`scaled_dot_product_attention` has torch's signature and torch's
semantics: ``(batch, heads, seqlen, head_dim)`` inputs (handled as transposed
views, never copied), ``is_causal`` aligned to the top-left corner of the
attention matrix, ``scale`` defaulting to ``1/sqrt(E)``, ``enable_gqa``, the
output in the query's dtype.  It runs our kernel when the call is one the
kernel computes exactly and calls torch's own function otherwise (a mask,
dropout, float32, CPU, a head dim without a kernel, inputs that need
gradients in a build without the backward kernels, ...);
:func:`sdpa_fallback_reason` says which, and why.

:class:`patch_sdpa` routes code that calls
``torch.nn.functional.scaled_dot_product_attention`` itself through this
function, as a context manager or as a switch.

The fast path is forward-only (inference) unless the build has the backward
kernels (built by default; ``FLASH_ATTN_HOPPER_DISABLE_BACKWARD=1`` leaves
them out): without them, with grad mode on and an input that requires grad,
torch's own SDPA runs.  With them, the gradients come from the bwd op,
top-left causal included, deterministic when
``torch.use_deterministic_algorithms(True)`` is on.  :data:`BACKWARD_READY` is
the one switch.
"""

from __future__ import annotations

import math

import torch
from torch.overrides import has_torch_function

from . import manifest, ops, support

#: torch's own function, taken at import: fallbacks must not re-enter a patched
#: ``torch.nn.functional.scaled_dot_product_attention``.
TORCH_SDPA = torch.nn.functional.scaled_dot_product_attention

# __torch_function__ implementations that do nothing special (plain tensors, parameters, fake tensors).
_PLAIN_TORCH_FUNCTION = (torch.Tensor.__torch_function__.__func__, torch._C._disabled_torch_function_impl)


def _overrides_torch_function(t: torch.Tensor) -> bool:
    """Whether ``t``'s class intercepts torch functions (DTensor, user subclasses...).

    Outside torch.compile a type check, not ``torch.overrides.has_torch_function``:
    that one is also true whenever a TorchFunctionMode is active, e.g. all
    through torch.export's tracing, where the inputs are plain fake tensors
    that must take the fast path.  Inside dynamo, ``has_torch_function`` is
    answered from the traced tensors' classes, and the type check is not
    traceable on every torch version (2.11 cannot compare the methods).
    """
    if torch.compiler.is_dynamo_compiling():
        return has_torch_function((t,))
    impl = type(t).__torch_function__
    return getattr(impl, "__func__", impl) not in _PLAIN_TORCH_FUNCTION


#: True when the fast path also serves inputs that require grad: the extension defines the bwd op
#: (a build with the backward kernels, the default).  Otherwise torch's SDPA computes those.
BACKWARD_READY: bool = ops.has_bwd_op()


def sdpa_fallback_reason(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
) -> str | None:
    """None when :func:`scaled_dot_product_attention` runs our kernel on these arguments.

    Otherwise a sentence saying why torch's own function computes the call.
    Takes exactly the arguments of ``scaled_dot_product_attention``.
    """
    for t in (query, key, value):
        if not isinstance(t, torch.Tensor):
            return "query, key and value are not all tensors"
    if _overrides_torch_function(query) or _overrides_torch_function(key) or _overrides_torch_function(value):
        return "an input is a tensor subclass with its own __torch_function__ (torch dispatches it)"
    if query.is_nested or key.is_nested or value.is_nested:
        return "nested tensors are not supported"
    if attn_mask is not None:
        return "attn_mask is given; the kernels compute no arbitrary masks (only is_causal)"
    if dropout_p != 0.0:
        return f"dropout_p={dropout_p}; the kernels have no dropout"
    answer = support.check(
        query, key, value, layout="bhsd", causal=bool(is_causal), top_left=True, softmax_scale=scale,
        names=("query", "key", "value"), allow_empty=False,
    )
    if isinstance(answer, support.Refusal):
        return str(answer)
    if answer.heads_q != answer.heads_kv and not enable_gqa:
        return (
            f"query has {answer.heads_q} heads and key {answer.heads_kv} without enable_gqa=True "
            "(torch broadcasts or rejects that)"
        )
    if not BACKWARD_READY and torch.is_grad_enabled() and (
        query.requires_grad or key.requires_grad or value.requires_grad
    ):
        return (
            "an input requires grad and this build of flash_attn_hopper has no backward kernels "
            f"(the fast path is forward-only: use torch.no_grad() or torch.inference_mode(), "
            f"or rebuild without {manifest.ENV_DISABLE_BACKWARD}=1)"
        )
    if torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") != query.dtype:
        return (
            f"autocast casts the inputs to {torch.get_autocast_dtype('cuda')} while they are {query.dtype}"
        )
    return None


# --------------------------------------------------------------------------
# The drop-in
# --------------------------------------------------------------------------


def _flash_forward(q, k, v, softmax_scale: float, causal: bool):
    """The op in torch SDPA's convention: (batch, seqlen, heads, head_dim) in and out, top-left causal."""
    out, _ = torch.ops.flash_attn_hopper.fwd(q, k, v, softmax_scale, causal, -1, -1, True)
    return out


def scaled_dot_product_attention(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
):
    """``torch.nn.functional.scaled_dot_product_attention`` with flash_attn_hopper's kernel.

    Same arguments, semantics, output shape and dtype as torch's function:
    query (N, Hq, L, E), key (N, H, S, E), value (N, H, S, Ev) -> (N, Hq, L, Ev);
    ``is_causal`` masks with the top-left aligned lower triangle (query i sees
    keys j <= i, also when L != S); ``scale`` defaults to 1/sqrt(E);
    ``enable_gqa`` lets Hq be a multiple of H.

    Our kernel runs for fp16/bf16 CUDA tensors on sm_90 with no ``attn_mask``,
    ``dropout_p == 0``, E == Ev a multiple of 8 up to 256 compiled into this
    build, and no input requiring grad unless the build has the backward
    kernels (:data:`BACKWARD_READY`).  Any other call goes to torch's own function unchanged;
    :func:`sdpa_fallback_reason` tells which path a call takes.  The output of
    the fast path is a (N, Hq, L, E) view of a contiguous (N, L, Hq, E) tensor.
    """
    reason = sdpa_fallback_reason(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if reason is not None:
        return TORCH_SDPA(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )
    softmax_scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else float(scale)
    out = _flash_forward(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), softmax_scale, bool(is_causal)
    )
    return out.transpose(1, 2)


class patch_sdpa:
    """Route ``torch.nn.functional.scaled_dot_product_attention`` through flash_attn_hopper.

    As a context manager::

        with flash_attn_hopper.patch_sdpa():
            model(x)            # F.scaled_dot_product_attention calls inside run our kernel

    or as a switch: ``patch = flash_attn_hopper.patch_sdpa()`` ... ``patch.restore()``.
    On exit (or ``restore()``) the function that was there before comes back.
    Only lookups of ``torch.nn.functional.scaled_dot_product_attention`` at
    call time are affected: a module that did ``from torch.nn.functional
    import scaled_dot_product_attention`` keeps torch's function.
    """

    def __init__(self) -> None:
        self._previous = torch.nn.functional.scaled_dot_product_attention
        torch.nn.functional.scaled_dot_product_attention = scaled_dot_product_attention
        self._active = True

    @property
    def active(self) -> bool:
        return self._active

    def restore(self) -> None:
        """Put back the function that was there before this patch (idempotent).

        When something else has replaced our function since, it is left in
        place: restoring must not undo another library's patch.
        """
        if not self._active:
            return
        if torch.nn.functional.scaled_dot_product_attention is scaled_dot_product_attention:
            torch.nn.functional.scaled_dot_product_attention = self._previous
        self._active = False

    def __enter__(self) -> "patch_sdpa":
        return self

    def __exit__(self, *exc_info) -> None:
        self.restore()
