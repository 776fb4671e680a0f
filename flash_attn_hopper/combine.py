"""``flash_attn_combine``: FlashAttention-3's split-KV combine, on our kernel (the ``fwd_combine`` op).

Each split s of a row holds an output O_s normalised by its own softmax and that softmax's
log-sum-exp l_s. The combined row is

    lse = log(sum_s exp(l_s)),    out = sum_s exp(l_s - lse) * O_s,

with splits whose l_s is -inf (they saw no key) never read, and rows where every split is -inf
giving out 0 and lse -inf. Layouts are FlashAttention-3's: out_partial (num_splits, batch,
seqlen, nheads, headdim) and lse_partial (num_splits, batch, seqlen, nheads), float32.
"""

from __future__ import annotations

import torch

from . import ops

#: csrc/flash_api.cpp's schema of the op.
COMBINE_SCHEMA = (
    "fwd_combine(Tensor out_partial, Tensor lse_partial, ScalarType? out_dtype=None) -> (Tensor out, Tensor softmax_lse)"
)
COMBINE_SCHEMA_ARGS = ("out_partial", "lse_partial", "out_dtype")

_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def has_combine_op() -> bool:
    return ops.extension_loaded() and hasattr(torch.ops.flash_attn_hopper, "fwd_combine")


def _combine_fake(out_partial, lse_partial, out_dtype=None):
    _, batch, seqlen, heads, head_dim = out_partial.shape
    out = out_partial.new_empty((batch, seqlen, heads, head_dim), dtype=out_dtype or torch.float32)
    lse = out_partial.new_empty((batch, heads, seqlen), dtype=torch.float32).transpose(1, 2)
    return out, lse


def _check(out_partial, lse_partial, out, out_dtype) -> None:
    for name, t in (("out_partial", out_partial), ("lse_partial", lse_partial)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise ValueError(f"{name} must be float32 (the split kernels' partial results), got {t.dtype}")
    if out_partial.dim() != 5 or lse_partial.dim() != 4 or lse_partial.shape != out_partial.shape[:4]:
        raise ValueError(
            "out_partial must be (num_splits, batch, seqlen, nheads, headdim) and lse_partial "
            f"(num_splits, batch, seqlen, nheads); got {tuple(out_partial.shape)} and {tuple(lse_partial.shape)}"
        )
    if not 1 <= out_partial.shape[0] <= 256:
        raise ValueError(f"num_splits must be in [1, 256], got {out_partial.shape[0]}")
    if out_dtype is not None and out_dtype not in _OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of float32, float16, bfloat16 or None, got {out_dtype}")
    if out is not None:
        want = (*out_partial.shape[1:],)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
            raise ValueError(f"out must be a tensor of shape {want}")
        if out_dtype is not None and out.dtype != out_dtype:
            raise ValueError(f"out has dtype {out.dtype} but out_dtype is {out_dtype}")
        if out.device != out_partial.device:
            raise ValueError(f"out is on {out.device}, out_partial on {out_partial.device}")
    if not (out_partial.is_cuda and lse_partial.is_cuda) or out_partial.device != lse_partial.device:
        raise ValueError(
            f"out_partial and lse_partial must be CUDA tensors on one device, got {out_partial.device} and "
            f"{lse_partial.device}; flash_attn_hopper runs on NVIDIA Hopper (sm_90) GPUs"
        )


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """Merge per-split partial attention outputs (FlashAttention-3's ``flash_attn_combine``).

    Arguments:
        out_partial: (num_splits, batch, seqlen, nheads, headdim) float32, last dimension
            contiguous (other strides free); num_splits in [1, 256].
        lse_partial: (num_splits, batch, seqlen, nheads) float32, any strides.
        out: optional (batch, seqlen, nheads, headdim) tensor to write the result into.
        out_dtype: float32 (default, or out's dtype), float16 or bfloat16.

    Returns:
        (out, softmax_lse): out (batch, seqlen, nheads, headdim) in out_dtype and softmax_lse
        float32 (batch, seqlen, nheads), a view of (batch, nheads, seqlen) memory.
    """
    if out is not None and out_dtype is None and isinstance(out, torch.Tensor):
        out_dtype = out.dtype
    _check(out_partial, lse_partial, out, out_dtype)
    if not has_combine_op():
        raise RuntimeError(
            ops.LOAD_ERROR
            or "flash_attn_hopper: this build of the extension has no fwd_combine op; rebuild it from this version: "
            + ops.build_hint()
        )
    if out_partial.stride(-1) != 1:
        out_partial = out_partial.contiguous()
    result, lse = torch.ops.flash_attn_hopper.fwd_combine(out_partial, lse_partial, out_dtype)
    if out is None:
        return result, lse
    out.copy_(result)
    return out, lse


if has_combine_op():
    torch.library.register_fake("flash_attn_hopper::fwd_combine", _combine_fake)
