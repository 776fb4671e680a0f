"""flash_attn_hopper as an attention implementation of Hugging Face transformers.

One line registers it; models then select it by name::

    import flash_attn_hopper.integrations.transformers as fah_transformers
    fah_transformers.register()                      # returns "flash_attn_hopper"
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="flash_attn_hopper")

(``model.set_attn_implementation("flash_attn_hopper")`` switches a loaded model
on transformers versions that have it.)  transformers is imported only by
:func:`register`; :func:`attention_forward` needs nothing from it.

:func:`attention_forward` follows the ``AttentionInterface`` contract and
computes what transformers' own ``"sdpa"`` implementation computes, with its
rules for ``is_causal`` and masks:

* query (batch, heads, q_len, head_dim), key and value (batch, kv_heads,
  kv_len, head_dim); grouped-query attention from the head counts (checked
  against ``module.num_key_value_groups`` when the module has it), K/V never
  repeated on the fast path;
* no mask (what transformers passes for unpadded causal prefill and for
  decoding): :func:`flash_attn_hopper.scaled_dot_product_attention`, i.e. our
  kernel whenever it applies, top-left causal as SDPA defines it;
* a mask (padding, or anything else): torch's SDPA with that mask, exactly
  as transformers' ``"sdpa"`` runs it;
* returns ``(attn_output (batch, q_len, heads, head_dim), None)``.

The fast path serves training too when the build has the backward kernels
(the default): without them, in training (inputs that require grad)
torch's SDPA computes the attention.
"""

from __future__ import annotations

import torch

from ..sdpa import TORCH_SDPA, scaled_dot_product_attention

#: The name :func:`register` uses unless told otherwise.
DEFAULT_NAME = "flash_attn_hopper"


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(batch, kv_heads, seqlen, head_dim) -> (batch, kv_heads * groups, ...), each kv head repeated in place."""
    if groups == 1:
        return x
    batch, heads_kv, seqlen, head_dim = x.shape
    return x[:, :, None].expand(batch, heads_kv, groups, seqlen, head_dim).reshape(
        batch, heads_kv * groups, seqlen, head_dim
    )


def _kv_groups(module, query: torch.Tensor, key: torch.Tensor) -> int:
    heads_q, heads_kv = query.size(1), key.size(1)
    if heads_kv == 0 or heads_q % heads_kv != 0:
        raise ValueError(
            f"flash_attn_hopper attention: query has {heads_q} heads, which is not a multiple of "
            f"key's {heads_kv}; query, key and value must be (batch, heads, seqlen, head_dim)"
        )
    groups = heads_q // heads_kv
    declared = getattr(module, "num_key_value_groups", None)
    # groups == 1 with a declared ratio means the caller repeated K/V already.
    if declared is not None and groups not in (1, declared):
        raise ValueError(
            f"flash_attn_hopper attention: module.num_key_value_groups is {declared}, but query has "
            f"{heads_q} heads and key {heads_kv}"
        )
    return groups


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' ``AttentionInterface`` function for flash_attn_hopper.

    ``scaling`` defaults to 1/sqrt(head_dim); ``dropout`` is applied as given
    (transformers passes 0 outside training); ``is_causal=None`` means causal
    when q_len > 1, there is no mask and ``module.is_causal`` (default True)
    says so.  Other keyword arguments that models pass to every attention
    function (``position_ids``, ``sliding_window``, ...) are ignored exactly as
    transformers' ``"sdpa"`` ignores them: the mask already encodes them.
    ``head_mask`` raises, as does ``output_attentions=True``: no attention
    weights exist to mask or return.
    """
    if kwargs.get("head_mask") is not None:
        raise ValueError("flash_attn_hopper attention has no head_mask support; use attn_implementation='eager'")
    if kwargs.get("output_attentions", False):
        raise ValueError(
            "flash_attn_hopper attention does not compute attention weights (output_attentions=True); "
            "use attn_implementation='eager'"
        )
    groups = _kv_groups(module, query, key)
    if attention_mask is not None and attention_mask.dim() == 4:
        attention_mask = attention_mask[:, :, :, : key.size(-2)]
    if is_causal is None:
        is_causal = query.size(2) > 1 and attention_mask is None and bool(getattr(module, "is_causal", True))

    if attention_mask is None:
        out = scaled_dot_product_attention(
            query, key, value, dropout_p=dropout, is_causal=is_causal, scale=scaling, enable_gqa=groups > 1
        )
    else:
        # Padding and other masks: torch computes them. K/V are repeated as transformers'
        # "sdpa" repeats them with a mask, which keeps torch's fused mask kernels eligible.
        out = TORCH_SDPA(
            query,
            _repeat_kv(key, groups),
            _repeat_kv(value, groups),
            attn_mask=attention_mask,
            dropout_p=dropout,
            is_causal=is_causal,
            scale=scaling,
        )
    return out.transpose(1, 2).contiguous(), None


def register(name: str = DEFAULT_NAME) -> str:
    """Register :func:`attention_forward` with transformers under ``name``; returns ``name``.

    Also registers transformers' SDPA mask builder under the same name (on
    versions with ``AttentionMaskInterface``), so models build the masks this
    function expects: none when causal attention needs none, boolean SDPA
    masks for padding.
    """
    try:
        from transformers import AttentionInterface
    except ImportError as err:
        raise ImportError(
            "flash_attn_hopper.integrations.transformers.register() needs Hugging Face transformers with "
            f"AttentionInterface (transformers >= 4.48): {err}"
        ) from err
    AttentionInterface.register(name, attention_forward)
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    except ImportError:
        return name  # older transformers build masks without a registry
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return name
