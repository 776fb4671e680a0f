"""CPU variable-length batches and their per-sequence float32 reference, for the varlen CPU tests.

``inputs`` draws packed q, k, v (and offsets) on the CPU; ``reference`` binds
``attention_ref_varlen`` to one batch's offsets; ``check_forward`` and
``check_varlen_grads`` hold outputs and gradients to FlashAttention's rule.
"""

from __future__ import annotations

import functools

import pytest
import torch

from helpers.grads import EMULATION_REL_NORM, check_grads
from helpers.inputs import varlen_qkv
from reference import assert_fa_close, attention_ref_varlen

FP16 = torch.float16


def inputs(lens_q, lens_k=None, hq=4, hk=2, d=64, dtype=FP16, seed=0, layout="contiguous"):
    """CPU varlen inputs drawn in float32 and rounded (the emulations compute in float32)."""
    return varlen_qkv(lens_q, lens_k, hq, hk, d, dtype=dtype, device="cpu", seed=seed, layout=layout,
                      draw_dtype=torch.float32)


def reference(cu_q, cu_k, seqused_q=None, seqused_k=None):
    """attention_ref_varlen bound to one batch's offsets, in the form helpers.grads wants."""
    return functools.partial(attention_ref_varlen, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                             seqused_q=seqused_q, seqused_k=seqused_k)


def check_forward(out, lse, q, k, v, cu_q, cu_k, seqused_q=None, seqused_k=None, **kwargs):
    """out and lse against the per-sequence float32 reference by FlashAttention's rule."""
    ref = reference(cu_q, cu_k, seqused_q, seqused_k)
    ref_out, ref_lse = ref(q, k, v, **kwargs)
    low_out, low_lse = ref(q, k, v, upcast=False, **kwargs)
    assert out.shape == q.shape[:2] + (v.size(-1),) and out.dtype == q.dtype
    assert lse.shape == (q.size(1), q.size(0)) and lse.dtype == torch.float32
    assert_fa_close(out, ref_out, low_out, name="out")
    assert_fa_close(lse, ref_lse, low_lse, name="lse", atol=1e-4)


def check_varlen_grads(grads, q, k, v, dout, cu_q, cu_k, seqused_q=None, seqused_k=None, **kwargs):
    check_grads(grads, q, k, v, dout, max_rel_norm=EMULATION_REL_NORM,
                attention=reference(cu_q, cu_k, seqused_q, seqused_k), **kwargs)


def varlen_attn_options(varlen, window, gqa):
    """varlen_attn's keyword arguments for ``window`` and GQA on this torch, or a skip naming what it lacks."""
    import inspect

    parameters = inspect.signature(varlen.varlen_attn).parameters
    if "return_aux" not in parameters or not hasattr(varlen, "AuxRequest"):
        pytest.skip(f"torch {torch.__version__}'s varlen_attn cannot return the log-sum-exp")
    options = {}
    if "window_size" in parameters:
        options["window_size"] = window
    elif window in ((-1, -1), (-1, 0)):
        options["is_causal"] = window == (-1, 0)
    else:
        pytest.skip(f"torch {torch.__version__}'s varlen_attn has no window_size")
    if gqa:
        if "enable_gqa" not in parameters:
            pytest.skip(f"torch {torch.__version__}'s varlen_attn has no enable_gqa")
        options["enable_gqa"] = True
    return options
