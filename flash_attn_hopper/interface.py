"""FlashAttention-3's Python API on flash_attn_hopper's kernels.

Names, argument order and defaults follow FlashAttention-3's
``hopper/flash_attn_interface.py`` so code written for it runs unchanged where
this version has kernels.  Everything is checked here, before any launch,
with messages that say what was asked, what is supported and how to fix it;
arguments that ask for features without kernels in this version raise instead
of returning a made-up result.

Layout is ``(batch, seqlen, nheads, headdim)``; ``softmax_lse`` is float32
``(batch, nheads, seqlen_q)`` in natural log; ``causal`` is aligned to the
bottom-right corner of the attention matrix.
"""

from __future__ import annotations

import functools
import math

import torch

from . import _build_info, manifest, ops

_SUPPORTED_DTYPES = tuple(getattr(torch, info.torch_name) for info in manifest.DTYPES.values())
_HOPPER = (9, 0)


# --------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------


def _check_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _describe_shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


def _feature_error(feature: str, asked: str, fix: str) -> RuntimeError:
    return RuntimeError(
        f"flash_attn_hopper: {asked} is not available in this version "
        f"(manifest feature '{feature}' has no kernels yet). {fix}"
    )


@functools.lru_cache(maxsize=None)
def _device_capability(index: int) -> tuple[int, int] | None:
    """The device's compute capability; None when it cannot be asked (no CUDA driver).

    Cached per device index: it cannot change within a process, and asking torch costs ~10 us
    of a call's ~50 us host path (measured on the H200 with tools/profile/clock_probe.py --profile).
    """
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(index)


def _normalize_window(window_size, causal: bool, seqlen_q: int, seqlen_k: int) -> tuple[int, int]:
    """FlashAttention's window rules; returns the effective (left, right), -1 = unbounded.

    Query i may see key j when i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right.
    A side wide enough to reach every key is unbounded; causal forces right = 0.
    """
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise ValueError(f"window_size must be a pair of ints (left, right), got {window_size!r}") from None
    if left < -1 or right < -1:
        raise ValueError(f"window_size entries must be >= -1 (-1 = unbounded), got {window_size!r}")
    if left >= seqlen_k - 1:
        left = -1
    if right >= seqlen_q - 1 and not causal:
        right = -1
    if causal:
        right = 0
    return left, right


def _check_fwd_args(q, k, v, softmax_scale, causal, window_size, softcap):
    """Validate a forward call; return (softmax_scale, causal, window) for the op.

    ``window`` is None for no window or plain causal, else the effective
    (left, right) of a sliding window, -1 = unbounded.

    Order: structure (types, ranks, dtypes, shapes, strides), then features,
    then what this build compiled, then the device, so each message names the
    first thing to fix.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(
                f"{name} must have 4 dimensions (batch, seqlen, nheads, headdim), got shape {_describe_shape(t)}"
            )
    if q.dtype not in _SUPPORTED_DTYPES:
        raise ValueError(
            f"q has dtype {q.dtype}; flash_attn_hopper supports torch.float16 and torch.bfloat16 "
            f"(convert with q.to(torch.bfloat16))"
        )
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise ValueError(f"{name} has dtype {t.dtype} but q has {q.dtype}; q, k and v must share one dtype")

    batch, seqlen_q, nheads_q, head_dim = q.shape
    if k.shape != v.shape:
        raise ValueError(
            f"k and v must have the same shape (batch, seqlen_k, nheads_kv, headdim), "
            f"got k {_describe_shape(k)} and v {_describe_shape(v)}"
        )
    _, seqlen_k, nheads_kv, head_dim_k = k.shape
    if k.shape[0] != batch:
        raise ValueError(f"batch size mismatch: q has {batch} (shape {_describe_shape(q)}), k and v have {k.shape[0]}")
    if head_dim_k != head_dim:
        raise ValueError(
            f"head dim mismatch: q has {head_dim}, k and v have {head_dim_k}; "
            "flash_attn_hopper needs one head dim for q, k and v"
        )
    if manifest.round_up_headdim(head_dim) is None:
        raise ValueError(
            f"head dim {head_dim} is not supported: it must be a positive multiple of {manifest.HEAD_DIM_MULTIPLE} "
            f"and at most {manifest.MAX_HEAD_DIM} (kernels exist for {list(manifest.HEAD_DIMS)}; "
            "other multiples of 8 run on the next one up); pad the head dim with zeros if needed"
        )
    if nheads_kv == 0:
        raise ValueError(f"k and v must have at least one head, got k shape {_describe_shape(k)}")
    if nheads_q % nheads_kv != 0:
        raise ValueError(
            f"nheads_q ({nheads_q}) must be a multiple of nheads_kv ({nheads_kv}) for grouped-query attention "
            f"(q shape {_describe_shape(q)}, k shape {_describe_shape(k)})"
        )
    problem = manifest.size_limit_problem(batch, nheads_q, seqlen_q, seqlen_k)
    if problem is not None:
        raise ValueError(problem)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise ValueError(
                f"{name}'s last dimension must be contiguous (stride 1), got strides {tuple(t.stride())}; "
                f"other strides may be anything: pass {name}.contiguous() or slice along other dims only"
            )

    if softmax_scale is None:
        softmax_scale = head_dim ** (-0.5)
    else:
        if isinstance(softmax_scale, torch.Tensor) or not isinstance(softmax_scale, (int, float)):
            raise TypeError(f"softmax_scale must be a Python float or None, got {type(softmax_scale).__name__}")
        softmax_scale = float(softmax_scale)
        if not math.isfinite(softmax_scale):
            raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
        if softmax_scale <= 0:
            raise ValueError(
                f"softmax_scale must be positive, got {softmax_scale}: the kernels track each row's "
                "maximum of the unscaled scores"
            )
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")

    left, right = _normalize_window(window_size, causal, seqlen_q, seqlen_k)
    window = None
    if (left, right) == (-1, 0):
        causal = True
    elif (left, right) != (-1, -1):
        window = (left, right)
    if window is not None and not manifest.FEATURES["local_window"]:
        raise _feature_error(
            "local_window",
            f"sliding-window (local) attention with window_size={tuple(window_size)} "
            f"(effective ({left}, {right}) for seqlen_q={seqlen_q}, seqlen_k={seqlen_k})",
            "Supported: window_size=(-1, -1), optionally with causal=True.",
        )
    if softcap != 0.0:
        raise _feature_error("softcap", f"softcap={softcap}", "Supported: softcap=0.0.")

    dtype = manifest.dtype_name(str(q.dtype).removeprefix("torch."))
    compiled = _build_info.COMPILED
    if compiled is not None:
        message = manifest.not_compiled_message("fwd", head_dim, dtype, compiled)
        if message is not None:
            raise RuntimeError(message)

    _check_device(q, k, v)
    return softmax_scale, causal, window


def _check_device(q, k, v) -> None:
    """The inputs' device can run the kernels: one CUDA device, the extension loaded, sm_90."""
    devices = {t.device for t in (q, k, v)}
    if len(devices) != 1:
        raise ValueError(f"q, k and v must be on one device, got q on {q.device}, k on {k.device}, v on {v.device}")
    if q.device.type != "cuda":
        raise ValueError(
            f"q, k and v are on {q.device}; flash_attn_hopper runs on NVIDIA Hopper (sm_90) GPUs: "
            "move them with .cuda()"
        )
    ops.require_extension()
    # The C++ binding checks the device again at launch; skipping the query
    # while tracing keeps torch.compile free of host calls and graph breaks.
    if not torch.compiler.is_compiling():
        index = q.device.index if q.device.index is not None else torch.cuda.current_device()
        capability = _device_capability(index)
        if capability is not None and capability != _HOPPER:
            raise RuntimeError(
                f"{q.device} is an sm_{capability[0]}{capability[1]} GPU ({torch.cuda.get_device_name(index)}); "
                "flash_attn_hopper's kernels are built for sm_90a only (H100, H200, H20, GH200)"
            )


def _check_unsupported_extras(qv, q_descale, k_descale, v_descale, attention_chunk, sm_margin) -> None:
    if qv is not None:
        raise _feature_error("qv", "qv (an extra query projection, as in MLA)", "Pass qv=None.")
    for name, value in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if value is not None:
            raise _feature_error("fp8", f"{name} (FP8 descaling)", "Pass fp16/bf16 inputs and no descale tensors.")
    if attention_chunk != 0:
        raise _feature_error("attention_chunk", f"attention_chunk={attention_chunk}", "Pass attention_chunk=0.")
    if sm_margin != 0:
        raise _feature_error(
            "sm_margin", f"sm_margin={sm_margin}", "The kernels use every SM; pass sm_margin=0."
        )


# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------


def flash_attn_func(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
):
    """Exact attention softmax(q kᵀ · softmax_scale) v on Hopper.

    Arguments:
        q: (batch, seqlen_q, nheads, headdim), fp16 or bf16, on an sm_90 GPU.
        k, v: (batch, seqlen_k, nheads_kv, headdim), same dtype; nheads must be
            a multiple of nheads_kv (grouped-query / multi-query attention:
            query head h uses kv head h // (nheads // nheads_kv)).
            Only the last dimension must be contiguous.
        softmax_scale: defaults to 1 / sqrt(headdim).
        causal: mask aligned to the bottom-right corner: query i sees key j
            when j <= i + seqlen_k - seqlen_q.  A query that sees no key
            gets output 0 and lse -inf.
        window_size: (left, right), -1 = unbounded: local attention, aligned
            like causal (query i sees key j when
            i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right).
        softcap, qv, q/k/v_descale, attention_chunk, sm_margin: accepted for
            FlashAttention-3 compatibility; values other than the defaults
            raise RuntimeError (no kernels for them yet).
        num_splits, pack_gqa: performance hints in FlashAttention-3; this
            version chooses its own schedule and ignores them (the result
            does not depend on them).
        deterministic: the backward computes bitwise reproducible gradients
            (dQ accumulated in a fixed order; slower).  Also on whenever
            torch.use_deterministic_algorithms(True) is in force at the
            forward call.  The forward pass is always deterministic.
        return_attn_probs: also return softmax_lse.

    Returns:
        out (batch, seqlen_q, nheads, headdim) in q's dtype, or
        (out, softmax_lse) with softmax_lse float32 (batch, nheads, seqlen_q),
        the natural-log logsumexp of each row of q kᵀ · softmax_scale.
    """
    _check_unsupported_extras(qv, q_descale, k_descale, v_descale, attention_chunk, sm_margin)
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool, got {type(deterministic).__name__}")
    softmax_scale, causal, window = _check_fwd_args(q, k, v, softmax_scale, causal, window_size, softcap)
    # Same kernel either way; the op's autograd formula picks the backward (see ops.py).
    if deterministic:
        fwd = getattr(torch.ops.flash_attn_hopper, ops.DETERMINISTIC_FWD_NAME)
    else:
        fwd = torch.ops.flash_attn_hopper.fwd
    if window is None:
        out, softmax_lse = fwd(q, k, v, softmax_scale, causal)
    else:
        out, softmax_lse = fwd(q, k, v, softmax_scale, causal, window[0], window[1])
    return (out, softmax_lse) if return_attn_probs else out


def flash_attn_qkvpacked_func(
    qkv,
    softmax_scale=None,
    causal=False,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    deterministic=False,
    num_heads_q=None,
    sm_margin=0,
    return_attn_probs=False,
):
    """Attention over a packed tensor, without copying q, k and v out of it.

    qkv is either (batch, seqlen, 3, nheads, headdim), or
    (batch, seqlen, nheads_q + 2 * nheads_kv, headdim) with ``num_heads_q``
    given (grouped-query attention: q heads first, then k, then v).
    Other arguments and the result are those of :func:`flash_attn_func`.
    """
    _check_tensor("qkv", qkv)
    if qkv.dim() == 5:
        if qkv.shape[2] != 3:
            raise ValueError(
                f"qkv of 5 dimensions must be (batch, seqlen, 3, nheads, headdim), got shape {_describe_shape(qkv)}"
            )
        if num_heads_q is not None and num_heads_q != qkv.shape[3]:
            raise ValueError(
                f"num_heads_q={num_heads_q} but qkv of shape {_describe_shape(qkv)} has {qkv.shape[3]} heads "
                "per q/k/v; leave num_heads_q=None for the 5-dimensional layout"
            )
        q, k, v = qkv.unbind(dim=2)
    elif qkv.dim() == 4:
        if num_heads_q is None:
            raise ValueError(
                "qkv of 4 dimensions (batch, seqlen, nheads_q + 2 * nheads_kv, headdim) needs num_heads_q; "
                "or pass the 5-dimensional (batch, seqlen, 3, nheads, headdim) layout"
            )
        total_heads = qkv.shape[2]
        num_heads_kv = (total_heads - num_heads_q) // 2
        if num_heads_q <= 0 or num_heads_kv <= 0 or num_heads_q + 2 * num_heads_kv != total_heads:
            raise ValueError(
                f"qkv has {total_heads} heads, which is not num_heads_q ({num_heads_q}) + 2 * nheads_kv "
                "for a positive nheads_kv"
            )
        q, k, v = qkv.split([num_heads_q, num_heads_kv, num_heads_kv], dim=2)
    else:
        raise ValueError(
            "qkv must be (batch, seqlen, 3, nheads, headdim) or (batch, seqlen, nheads_q + 2 * nheads_kv, headdim), "
            f"got shape {_describe_shape(qkv)}"
        )
    return flash_attn_func(
        q,
        k,
        v,
        softmax_scale=softmax_scale,
        causal=causal,
        q_descale=q_descale,
        k_descale=k_descale,
        v_descale=v_descale,
        window_size=window_size,
        attention_chunk=attention_chunk,
        softcap=softcap,
        deterministic=deterministic,
        sm_margin=sm_margin,
        return_attn_probs=return_attn_probs,
    )


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    seqused_q=None,
    seqused_k=None,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
):
    """Variable-length attention (FlashAttention-3's signature).

    This version has no varlen kernel, so every call raises RuntimeError
    rather than return anything.
    """
    raise _feature_error(
        "varlen",
        "variable-length attention (flash_attn_varlen_func)",
        "Split the packed batch at cu_seqlens and call flash_attn_func on each sequence "
        "as a (1, seqlen, nheads, headdim) tensor.",
    )
