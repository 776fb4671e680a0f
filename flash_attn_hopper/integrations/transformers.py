"""flash_attn_hopper as an attention implementation of Hugging Face transformers.

One line registers it; models then select it by name::

    import flash_attn_hopper.integrations.transformers as fah_transformers
    fah_transformers.register()                      # returns "flash_attn_hopper"
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="flash_attn_hopper")

(``model.set_attn_implementation("flash_attn_hopper")`` switches a loaded model
on transformers versions that have it.)  transformers is imported only by
:func:`register`; :func:`attention_forward` needs nothing from it.

:func:`attention_forward` follows the ``AttentionInterface`` contract and
computes what transformers' FlashAttention implementations compute (causal
aligned to the bottom-right corner, sliding windows from ``sliding_window``):

* query (batch, heads, q_len, head_dim), key and value (batch, kv_heads,
  kv_len, head_dim); grouped-query attention from the head counts (checked
  against ``module.num_key_value_groups`` when the module has it), K/V never
  repeated on the fast paths;
* a 2-D padding mask (batch, kv_len), 1 = token, 0 = padding (what
  transformers' FlashAttention mask builder gives, registered with
  :func:`register`): the batch is unpadded, computed by
  :func:`flash_attn_hopper.flash_attn_varlen_func` and padded back (padded
  query rows give 0);
* padding-free packed batches: the ``cu_seq_lens_q/k`` and ``max_length_q/k``
  keyword arguments (``DataCollatorWithFlattening``), or, for one row,
  ``position_ids`` that restart: the varlen kernel, one sequence per segment;
* no mask: our kernel (:func:`flash_attn_hopper.scaled_dot_product_attention`
  where causal is the same from either corner, :func:`flash_attn_hopper.flash_attn_func`
  for a bottom-right causal q_len != kv_len or a sliding window);
* a 4-D mask (transformers' SDPA mask builder, or a custom mask): torch's
  SDPA with that mask, exactly as transformers' ``"sdpa"`` runs it;
* returns ``(attn_output (batch, q_len, heads, head_dim), None)``.

The no-mask path serves training too when the build has the backward kernels
(the default): without them, in training (inputs that require grad)
torch's SDPA computes the attention.  The varlen paths have no such fallback
and no dropout: they raise, saying why.
"""

from __future__ import annotations

import torch

from ..interface import flash_attn_func, flash_attn_varlen_func
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


def _window(sliding_window, kv_len: int) -> tuple[int, int]:
    """transformers' FlashAttention window for ``sliding_window``: (w - 1, w - 1), causal cuts the right side."""
    if sliding_window is not None and kv_len > sliding_window:
        return (int(sliding_window) - 1, int(sliding_window) - 1)
    return (-1, -1)


def _host_int(value, name: str) -> int:
    if isinstance(value, torch.Tensor):
        return int(value.item())  # a device sync, as transformers' own FlashAttention path makes
    if value is None:
        raise ValueError(f"flash_attn_hopper attention: {name} is missing")
    return int(value)


def _no_dropout(dropout: float, what: str) -> None:
    if dropout:
        raise ValueError(
            f"flash_attn_hopper attention: {what} need the varlen kernel, which has no dropout "
            f"(dropout={dropout}); set the model's attention_dropout to 0 or use attn_implementation='sdpa'"
        )


def _cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(torch.cumsum(lengths, dim=0, dtype=torch.int32), (1, 0))


def _padded_varlen(query, key, value, mask, causal, scaling, window, sink=None, softcap=0.0):
    """Unpad by the 2-D padding ``mask`` (batch, kv_len), run the varlen kernel, pad back.

    query (batch, heads, q_len, head_dim) etc.; returns (batch, q_len, heads, head_dim), padded
    query rows 0.  The queries are the last q_len positions of the keys' frame (decoding and
    chunked prefill with a cache), as in transformers' FlashAttention path.
    """
    batch, heads_q, q_len, head_dim = query.shape
    kv_len = key.size(2)
    if mask.dim() != 2 or mask.size(0) != batch:
        raise ValueError(
            f"flash_attn_hopper attention: a 2-D attention mask must be (batch, kv_len) = ({batch}, {kv_len}), "
            f"got shape {tuple(mask.shape)}"
        )
    mask = mask[:, -kv_len:] != 0
    if mask.size(1) < kv_len:  # a static cache longer than what was seen: its tail is unused
        key, value = key[:, :, : mask.size(1)], value[:, :, : mask.size(1)]
        kv_len = mask.size(1)
    if q_len > kv_len:
        raise ValueError(f"flash_attn_hopper attention: q_len {q_len} > kv_len {kv_len} with a padding mask")
    lengths_k = mask.sum(dim=-1, dtype=torch.int32)
    mask_q = mask[:, kv_len - q_len :]
    lengths_q = lengths_k if q_len == kv_len else mask_q.sum(dim=-1, dtype=torch.int32)
    max_k = int(lengths_k.max()) if batch else 0  # one sync for both maxima
    max_q = max_k if q_len == kv_len else (int(lengths_q.max()) if batch else 0)
    # Boolean indexing keeps the (batch, position) order: sequence b's rows are contiguous.
    q = query.transpose(1, 2)[mask_q]
    k = key.transpose(1, 2)[mask]
    v = value.transpose(1, 2)[mask]
    out = flash_attn_varlen_func(
        q, k, v, _cu_seqlens(lengths_q), _cu_seqlens(lengths_k), max_q, max_k,
        softmax_scale=scaling, causal=causal, window_size=window, learnable_sink=sink, softcap=softcap,
    )
    padded = out.new_zeros(batch, q_len, heads_q, out.size(-1))
    padded[mask_q] = out
    return padded


def _packed_varlen(query, key, value, cu_q, cu_k, max_q, max_k, causal, scaling, window, sink=None, softcap=0.0):
    """The rows of query/key/value, flattened to (total, heads, head_dim), as the packed sequences of cu_q/cu_k."""
    batch, heads_q, q_len, head_dim = query.shape
    q = query.transpose(1, 2).reshape(batch * q_len, heads_q, head_dim)
    k = key.transpose(1, 2).reshape(-1, key.size(1), key.size(3))
    v = value.transpose(1, 2).reshape(-1, value.size(1), value.size(3))
    cu_q, cu_k = (t if t.dtype == torch.int32 else t.to(torch.int32) for t in (cu_q, cu_k))
    out = flash_attn_varlen_func(
        q, k, v, cu_q.contiguous(), cu_k.contiguous(), max_q, max_k,
        softmax_scale=scaling, causal=causal, window_size=window, learnable_sink=sink, softcap=softcap,
    )
    return out.view(batch, q_len, heads_q, out.size(-1))


def _packed_by_position_ids(position_ids, query, key) -> tuple[torch.Tensor, int] | None:
    """(cu_seqlens, max_seqlen) when one row of ``position_ids`` restarts (several packed
    sequences), else None; transformers' test, a device sync per layer.  Not while torch.compile
    traces (the test would break the graph): compiled packed batches pass ``cu_seq_lens_q/k``."""
    batch, _, q_len, _ = query.shape
    if position_ids is None or batch != 1 or q_len <= 1 or key.size(2) != q_len:
        return None
    if torch.compiler.is_compiling():
        return None
    position_ids = position_ids.reshape(-1)
    if position_ids.numel() != q_len:
        return None
    first = position_ids.min()
    if not bool((torch.arange(q_len, device=position_ids.device) + first != position_ids).any()):
        return None  # one increasing sequence: the dense kernel
    starts = (position_ids == first).nonzero().view(-1).to(torch.int32)
    total = torch.tensor([q_len], dtype=torch.int32, device=starts.device)
    cu = torch.cat([starts, total])
    return cu, int((cu[1:] - cu[:-1]).max())


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
    (transformers passes 0 outside training) where torch computes, refused on
    the varlen paths; ``is_causal=None`` means ``module.is_causal`` (default
    True), and on the no-mask path also q_len > 1.  ``sliding_window``
    (keyword) is applied as transformers' FlashAttention applies it, except with
    a 4-D mask, which already encodes it.  ``cu_seq_lens_q/k`` with
    ``max_length_q/k``, or ``position_ids``, mark packed batches (see the
    module's docstring).  Attention sinks (``s_aux``, gpt-oss) and logit
    softcapping (``softcap``, Gemma 2) run on every path but the 4-D mask one,
    which raises for them.  ``head_mask`` and ``output_attentions=True`` raise:
    no kernel computes them.
    """
    if kwargs.get("head_mask") is not None:
        raise ValueError("flash_attn_hopper attention has no head_mask support; use attn_implementation='eager'")
    if kwargs.get("output_attentions", False):
        raise ValueError(
            "flash_attn_hopper attention does not compute attention weights (output_attentions=True); "
            "use attn_implementation='eager'"
        )
    sink = kwargs.get("s_aux")  # gpt-oss's learnable sinks: flash_attn_hopper/sinks.py
    if sink is not None and attention_mask is not None and attention_mask.dim() == 4:
        raise ValueError(
            "flash_attn_hopper attention computes attention sinks (s_aux) on its own kernels only, not with a "
            "4-D attention mask (torch's SDPA path); pass a 2-D padding mask or none"
        )
    softcap = kwargs.get("softcap") or 0.0  # Gemma 2's attn_logit_softcapping (None when off)
    if softcap and attention_mask is not None and attention_mask.dim() == 4:
        raise ValueError(
            f"flash_attn_hopper attention computes logit softcapping (softcap={softcap}) on its own kernels only, "
            "not with a 4-D attention mask (torch's SDPA path); pass a 2-D padding mask or none"
        )
    groups = _kv_groups(module, query, key)
    module_causal = bool(getattr(module, "is_causal", True))

    if attention_mask is not None and attention_mask.dim() == 4:
        # A 4-D mask (SDPA's mask builder, or a custom one): torch computes it. K/V are repeated as
        # transformers' "sdpa" repeats them with a mask, which keeps torch's fused mask kernels eligible.
        attention_mask = attention_mask[:, :, :, : key.size(-2)]
        out = TORCH_SDPA(
            query,
            _repeat_kv(key, groups),
            _repeat_kv(value, groups),
            attn_mask=attention_mask,
            dropout_p=dropout,
            is_causal=bool(is_causal),
            scale=scaling,
        )
        return out.transpose(1, 2).contiguous(), None

    causal = module_causal if is_causal is None else bool(is_causal)
    window = _window(kwargs.get("sliding_window"), key.size(2))
    if attention_mask is not None:
        _no_dropout(dropout, "padded batches")
        return _padded_varlen(query, key, value, attention_mask, causal, scaling, window, sink, softcap), None

    packed = [kwargs.get(name) for name in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")]
    if all(x is not None for x in packed):
        _no_dropout(dropout, "packed batches")
        cu_q, cu_k, max_q, max_k = packed
        out = _packed_varlen(
            query, key, value, cu_q, cu_k, _host_int(max_q, "max_length_q"), _host_int(max_k, "max_length_k"),
            causal, scaling, window, sink, softcap,
        )
        return out, None
    by_positions = _packed_by_position_ids(kwargs.get("position_ids"), query, key)
    if by_positions is not None:
        _no_dropout(dropout, "packed batches")
        cu, max_len = by_positions
        out = _packed_varlen(query, key, value, cu, cu, max_len, max_len, causal, scaling, window, sink, softcap)
        return out, None

    q_len, kv_len = query.size(2), key.size(2)
    if window != (-1, -1) or (causal and 1 < q_len != kv_len) or sink is not None or softcap:
        # Bottom-right causal, a sliding window, sinks or softcap: what SDPA cannot state.
        if dropout:
            raise ValueError(
                f"flash_attn_hopper attention has no dropout (dropout={dropout}) with a sliding window or "
                "q_len != kv_len; use attn_implementation='sdpa'"
            )
        out = flash_attn_func(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
            softmax_scale=scaling, causal=causal, window_size=window, learnable_sink=sink, softcap=softcap,
        )
        return out.contiguous(), None
    out = scaled_dot_product_attention(
        query, key, value, dropout_p=dropout, is_causal=causal and q_len > 1, scale=scaling, enable_gqa=groups > 1
    )
    return out.transpose(1, 2).contiguous(), None


def register(name: str = DEFAULT_NAME) -> str:
    """Register :func:`attention_forward` with transformers under ``name``; returns ``name``.

    Also registers transformers' FlashAttention mask builder under the same
    name (on versions with ``AttentionMaskInterface``; SDPA's where there is no
    FlashAttention one), so models hand this function what it unpads: no mask
    for unpadded causal batches, the 2-D padding mask otherwise.
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
    builder = ALL_MASK_ATTENTION_FUNCTIONS.get("flash_attention_2") or ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
    AttentionMaskInterface.register(name, builder)
    return name
