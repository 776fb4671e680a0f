"""The one answer to "can flash_attn_hopper's kernels compute this call?".

Every entry point asks :func:`check` and acts on its answer: the FA3-style
functions (:mod:`flash_attn_hopper.interface`) raise the refusal, the SDPA
drop-in (:mod:`flash_attn_hopper.sdpa`) and the override of torch's
flash-attention registry (:mod:`flash_attn_hopper.torch_registry`) fall back to
torch with it.  The limits come from the manifest (:mod:`flash_attn_hopper.manifest`),
which also feeds ``csrc/generated/manifest.h`` for the C++ checks.

The answer is either a :class:`Problem` (what will run: sizes, head dim,
dtype, mask, GQA ratio and the compiled kernel that serves it) or a
:class:`Refusal` (what is wrong and how to fix it; ``error`` is the exception
type the FA3 API raises for it).

Variable-length calls (packed sequences with ``cu_seqlens``) ask
``support_varlen.check_varlen`` instead, whose answer is a ``VarlenProblem`` or a
:class:`Refusal`.

Entry points translate their own conventions before asking: tensor names
(``q``/``query``), layout (``"bshd"`` or SDPA's ``"bhsd"``), the mask as an
effective window (FlashAttention-3's or FlashAttention-2's clamping rules are
theirs), the default scale (each keeps its own formula).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from . import _build_info, manifest, ops

#: torch dtype -> manifest dtype name ("fp16", "bf16").
DTYPE_NAMES: dict[torch.dtype, str] = {getattr(torch, info.torch_name): name for name, info in manifest.DTYPES.items()}

#: "torch.float16 and torch.bfloat16", for messages.
_SUPPORTED_DTYPES = " and ".join(str(dtype) for dtype in DTYPE_NAMES)

_HOPPER = (9, 0)

#: How each layout names its dimensions, and where (batch, seqlen, heads, head_dim) are.
_LAYOUTS = {
    "bshd": ("(batch, seqlen, nheads, headdim)", (0, 1, 2, 3)),
    "bhsd": ("(batch, nheads, seqlen, headdim)", (0, 2, 1, 3)),
}


@dataclass(frozen=True)
class Problem:
    """An attention call the kernels compute, in the op's terms."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: str  # manifest name: "fp16" / "bf16"
    kernel_head_dim: int  # the manifest head dim whose kernel serves head_dim
    causal: bool
    window: tuple[int, int] | None  # effective (left, right), -1 = unbounded; None: none beyond causal
    top_left: bool  # the diagonal of causal / window from the top-left corner (SDPA) instead of bottom-right
    softmax_scale: float | None  # as given (None: the entry point's default), checked positive and finite

    @property
    def gqa_ratio(self) -> int:
        """Query heads per key/value head (1: plain multi-head attention)."""
        return self.heads_q // self.heads_kv

    def kernel(self, direction: str = "fwd") -> manifest.Instantiation:
        """The compiled instantiation that serves this problem in ``direction``."""
        return manifest.Instantiation(direction, self.kernel_head_dim, self.dtype)


@dataclass(frozen=True)
class Refusal:
    """Why the kernels cannot compute a call, and how to get a call they can."""

    reason: str
    fix: str = ""
    error: type = ValueError  # what flash_attn_func & co. raise for it

    def __str__(self) -> str:
        if not self.fix:
            return self.reason
        return f"{self.reason}{'. ' if self.fix[0].isupper() else '; '}{self.fix}"

    def exception(self) -> Exception:
        return self.error(str(self))


def _shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


def feature_refusal(feature: str, asked: str, fix: str) -> Refusal:
    """A feature of FlashAttention-3's API without kernels in this version (manifest.FEATURES)."""
    return Refusal(
        f"flash_attn_hopper: {asked} is not available in this version "
        f"(manifest feature '{feature}' has no kernels yet)",
        fix,
        RuntimeError,
    )


def check_attention_chunk(attention_chunk) -> None:
    """FlashAttention-3's attention_chunk: an int >= 0 (0: no chunking)."""
    if not isinstance(attention_chunk, int) or isinstance(attention_chunk, bool) or attention_chunk < 0:
        raise ValueError(f"attention_chunk must be a non-negative int, got {attention_chunk!r}")


def check_num_splits(num_splits) -> None:
    """FlashAttention-3's num_splits: an int >= 0 (1 no split, 0 choose, n at most n)."""
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (1: no split, 0: choose), got {num_splits!r}")


def softcap_refusal(softcap, softmax_scale: float | None, head_dim: int) -> Refusal | None:
    """None when ``softcap`` is one the kernels take: 0 (off) or a positive finite number with
    softmax_scale / softcap a finite float32 (FlashAttention-3 treats a negative softcap as off;
    here it is an error rather than a silent no-op)."""
    if isinstance(softcap, (bool, torch.Tensor)) or not isinstance(softcap, (int, float)):
        return Refusal(f"softcap must be a Python float, got {type(softcap).__name__}", error=TypeError)
    if softcap == 0:
        return None
    scale = head_dim ** (-0.5) if softmax_scale is None else softmax_scale
    if not (math.isfinite(softcap) and softcap > 0) or not math.isfinite(scale / softcap) or scale / softcap > 3.4e38:
        return Refusal(
            f"softcap={softcap} is not usable: it must be 0 (off) or a positive finite number "
            "(scores become softcap * tanh(softmax_scale * q.k / softcap))"
        )
    if not manifest.FEATURES["softcap"]:
        return feature_refusal("softcap", f"softcap={softcap}", "Pass softcap=0.0.")
    if not _build_info.compiled_feature("softcap"):
        return Refusal(
            f"flash_attn_hopper: softcap={softcap} needs the softcap kernels, which this build left out "
            f"({manifest.ENV_DISABLE_SOFTCAP}=1)",
            f"rebuild without {manifest.ENV_DISABLE_SOFTCAP}: {manifest.BUILD_COMMAND}",
            RuntimeError,
        )
    return None


def fa3_window(window_size, causal: bool, seqlen_q: int, seqlen_k: int) -> tuple[int, int]:
    """FlashAttention-3's window rules; returns the effective (left, right), -1 = unbounded.

    Query i may see key j when i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right.
    A side wide enough to reach every key is unbounded; causal forces right = 0.
    Raises ValueError for a malformed ``window_size``.
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


def fa2_window(left, right, is_causal: bool, seqlen_k: int) -> tuple[int, int]:
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


def scale_refusal(softmax_scale, name: str = "softmax_scale") -> Refusal | None:
    """Why an explicit scale cannot run (None: it can, or it is None = the default).

    The kernels track each row's maximum of the unscaled scores, so the scale
    must be positive and finite; torch's own kernels take any.
    """
    if softmax_scale is None:
        return None
    why = "the kernels need a positive finite scale: they track each row's maximum of the unscaled scores"
    if not math.isfinite(softmax_scale):
        return Refusal(f"{name}={softmax_scale} is not finite", f"{name} must be finite and positive ({why})")
    if softmax_scale <= 0:
        return Refusal(f"{name}={softmax_scale} is not positive", f"{name} must be positive and finite ({why})")
    return None


@functools.lru_cache(maxsize=None)
def _device_capability(index: int) -> tuple[int, int] | None:
    """The device's compute capability; None when it cannot be asked (no CUDA driver).

    Cached per device index: it cannot change within a process, and asking torch costs ~10 us
    of a call's ~50 us host path (measured on the H200 with cProfile over 2000 calls, 2026-11-30).
    """
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(index)


def device_refusal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, names=("q", "k", "v")) -> Refusal | None:
    """Why the inputs' device cannot run the kernels: one CUDA device, the extension loaded, sm_90."""
    nq, nk, nv = names
    if k.device != q.device or v.device != q.device:
        return Refusal(
            f"{nq}, {nk} and {nv} must be on one device, got {nq} on {q.device}, {nk} on {k.device}, {nv} on {v.device}"
        )
    if q.device.type != "cuda":
        return Refusal(
            f"{nq}, {nk} and {nv} are on {q.device}; flash_attn_hopper runs on NVIDIA Hopper (sm_90) GPUs",
            "move them with .cuda()",
        )
    if not ops.extension_loaded():
        return Refusal(f"flash_attn_hopper is not available: {ops.LOAD_ERROR}", ops.build_hint(), RuntimeError)
    if torch.compiler.is_compiling():
        # Folded to a constant while tracing (torch caches the properties); no host call at run time.
        props = torch.cuda.get_device_properties(q.device) if torch.cuda.is_available() else None
        capability, name = ((props.major, props.minor), props.name) if props is not None else (None, None)
    else:
        index = q.device.index if q.device.index is not None else torch.cuda.current_device()
        capability, name = _device_capability(index), None
        if capability is not None and capability != _HOPPER:
            name = torch.cuda.get_device_name(index)
    if capability is not None and capability != _HOPPER:
        return Refusal(
            f"{q.device} is an sm_{capability[0]}{capability[1]} GPU ({name}); "
            "flash_attn_hopper's kernels are built for sm_90a only (H100, H200, H20, GH200)",
            error=RuntimeError,
        )
    return None


def not_compiled_refusal(direction: str, head_dim: int, dtype: str) -> Refusal | None:
    """Why the recorded build has no ``direction`` kernel for ``head_dim`` in ``dtype`` (None: it has,
    or no build was recorded and only the C++ dispatch decides)."""
    compiled = _build_info.COMPILED
    if compiled is None:
        return None
    rounded = manifest.round_up_headdim(head_dim)
    if rounded is not None and manifest.Instantiation(direction, rounded, dtype) in compiled:
        return None
    message = manifest.not_compiled_message(direction, head_dim, dtype, compiled)
    return None if message is None else Refusal(message, error=RuntimeError)



def kernel_refusal(softcap, softmax_scale, q, k, v, head_dim: int, names) -> Refusal | None:
    """The checks every forward call ends with, in order: softcap, the compiled set, the device."""
    for refusal in (
        lambda: softcap_refusal(softcap, softmax_scale, head_dim),
        lambda: not_compiled_refusal("fwd", head_dim, DTYPE_NAMES[q.dtype]),
        lambda: device_refusal(q, k, v, names),
    ):
        answer = refusal()
        if answer is not None:
            return answer
    return None


def _dtypes_refusal(names, q, k, v) -> Refusal | None:
    """q's dtype has kernels, and k and v share it."""
    nq, nk, nv = names
    if q.dtype not in DTYPE_NAMES:
        return Refusal(
            f"{nq} has dtype {q.dtype}; flash_attn_hopper supports {_SUPPORTED_DTYPES}",
            f"convert with {nq}.to(torch.bfloat16)",
        )
    for name, t in ((nk, k), (nv, v)):
        if t.dtype != q.dtype:
            return Refusal(
                f"{name} has dtype {t.dtype} but {nq} has {q.dtype}: {nq}, {nk} and {nv} have different dtypes",
                f"{nq}, {nk} and {nv} must share one dtype",
            )
    return None


def _heads_refusal(names, q, k, head_dim: int, k_head_dim: int, heads_q: int, heads_kv: int) -> Refusal | None:
    """The head-dim and head-count checks the dense and varlen layouts share."""
    nq, nk, nv = names
    if k_head_dim != head_dim:
        return Refusal(
            f"head dim mismatch: {nq} has {head_dim}, {nk} and {nv} have {k_head_dim}",
            f"flash_attn_hopper needs one head dim for {nq}, {nk} and {nv}",
        )
    if manifest.round_up_headdim(head_dim) is None:
        return Refusal(
            f"head dim {head_dim} is not supported: it must be a positive multiple of {manifest.HEAD_DIM_MULTIPLE} "
            f"and at most {manifest.MAX_HEAD_DIM} (kernels exist for {list(manifest.HEAD_DIMS)}; "
            f"other multiples of {manifest.HEAD_DIM_MULTIPLE} run on the next one up)",
            "pad the head dim with zeros",
        )
    if heads_kv == 0:
        return Refusal(f"{nk} and {nv} must have at least one head, got {nk} shape {_shape(k)}")
    if heads_q % heads_kv != 0:
        return Refusal(
            f"nheads_q ({heads_q}) must be a multiple of nheads_kv ({heads_kv}) for grouped-query attention "
            f"({nq} shape {_shape(q)}, {nk} shape {_shape(k)})"
        )
    return None

def _layout_scale_window(names, tensors, softmax_scale, scale_name, window_rules, window_size, causal,
                         seqlen_q, seqlen_k):
    """The checks after the shapes that the dense and varlen layouts share: a contiguous last dim,
    the scale, the window by FA3's or FA2's rules. Returns a Refusal, or (causal, window) with
    window None for none / plain causal, else the effective (left, right)."""
    for name, t in zip(names, tensors):
        if t.stride(-1) != 1:
            return Refusal(
                f"{name}'s last dimension must be contiguous (stride 1), got strides {tuple(t.stride())}",
                f"other strides may be anything: pass {name}.contiguous() or slice along other dims only",
            )
    refusal = scale_refusal(softmax_scale, scale_name)
    if refusal is not None:
        return refusal
    if window_rules == "fa3":
        try:
            left, right = fa3_window(window_size, causal, seqlen_q, seqlen_k)
        except ValueError as err:
            return Refusal(str(err))
        if (left, right) == (-1, 0):
            causal = True
    else:
        left, right = fa2_window(window_size[0], window_size[1], causal, seqlen_k)
    window = None if (left, right) in ((-1, -1), (-1, 0) if causal else (-1, -1)) else (left, right)
    if window is not None and not manifest.FEATURES["local_window"]:
        return feature_refusal(
            "local_window",
            f"sliding-window (local) attention with window_size={tuple(window_size)} "
            f"(effective ({left}, {right}) for seqlen_q={seqlen_q}, seqlen_k={seqlen_k})",
            "Supported: window_size=(-1, -1), optionally with causal=True.",
        )
    return causal, window


def kv_shapes_taken(k: torch.Tensor, v: torch.Tensor, d_dim: int = -1) -> bool:
    """Whether the kernels take k and v as they are: one shape, or shapes that differ only in a
    head dim pair with kernels of its own (manifest.own_value_kernels)."""
    return k.shape == v.shape or (k.shape[:-1] == v.shape[:-1]
                                  and manifest.own_value_kernels(k.size(d_dim), v.size(d_dim)))


def check(
    q,
    k,
    v,
    *,
    layout: str = "bshd",
    causal: bool = False,
    window_size=(-1, -1),
    window_rules: str = "fa3",
    top_left: bool = False,
    softmax_scale: float | None = None,
    softcap: float = 0.0,
    names: tuple[str, str, str] = ("q", "k", "v"),
    allow_empty: bool = True,
) -> Problem | Refusal:
    """The problem the kernels compute for these arguments, or why they cannot.

    ``layout``: ``"bshd"`` (the op's and FlashAttention's) or ``"bhsd"``
    (torch SDPA's); read in place, never transposed or copied.
    ``window_size`` (left, right), -1 = unbounded, read with ``window_rules``:
    ``"fa3"`` (:func:`fa3_window`: a window that is plain causal becomes
    ``causal``) or ``"fa2"`` (:func:`fa2_window`, aten's FlashAttention-2);
    the problem's ``window`` is what the op gets.  ``softmax_scale``: an
    explicit scale to check, None for the entry point's default.
    ``softcap``: FlashAttention-3's (0 = off; see :func:`softcap_refusal`).
    ``names``: how the caller's API calls q, k and v in messages.
    ``allow_empty``: whether empty inputs are a problem (the op returns zeros
    and -inf; torch's conventions differ, so SDPA and the registry refuse
    them).  Whether gradients can flow is the caller's question: the backward
    kernels are built for exactly the forward's head dims and dtypes
    (:func:`not_compiled_refusal` with ``"bwd"`` asks about one).

    Order: structure (types, ranks, dtypes, shapes, sizes, strides), the
    scale, features, what this build compiled, then the device, so each
    refusal names the first thing to fix.
    """
    nq, nk, nv = names
    dims, (b_dim, s_dim, h_dim, d_dim) = _LAYOUTS[layout]
    for name, t in ((nq, q), (nk, k), (nv, v)):
        if not isinstance(t, torch.Tensor):
            return Refusal(f"{name} must be a torch.Tensor, got {type(t).__name__}", error=TypeError)
    for name, t in ((nq, q), (nk, k), (nv, v)):
        if t.dim() != 4:
            return Refusal(f"{name} must have 4 dimensions {dims}, got shape {_shape(t)}")
    refusal = _dtypes_refusal((nq, nk, nv), q, k, v)
    if refusal is not None:
        return refusal
    batch, seqlen_q, heads_q, head_dim = q.size(b_dim), q.size(s_dim), q.size(h_dim), q.size(d_dim)
    if not kv_shapes_taken(k, v, d_dim):
        kv_dims = dims.replace("seqlen", "seqlen_k").replace("nheads", "nheads_kv")
        prefix = (
            f"{nv}'s head dim ({v.size(d_dim)}) differs from {nq}'s ({head_dim}), and such calls run zero-padded "
            f"only up to head dim {manifest.MAX_HEAD_DIM}: "
            if v.size(d_dim) != head_dim and k.size(d_dim) == head_dim
            else ""
        )
        return Refusal(
            f"{prefix}{nk} and {nv} must have the same shape {kv_dims}, got {nk} {_shape(k)} and {nv} {_shape(v)}"
        )
    seqlen_k, heads_kv = k.size(s_dim), k.size(h_dim)
    if k.size(b_dim) != batch:
        return Refusal(
            f"batch size mismatch: {nq} has {batch} (shape {_shape(q)}), {nk} and {nv} have {k.size(b_dim)}",
            f"{nq}, {nk} and {nv} need equal batch sizes (the kernels do not broadcast them)",
        )
    refusal = _heads_refusal((nq, nk, nv), q, k, head_dim, k.size(d_dim), heads_q, heads_kv)
    if refusal is not None:
        return refusal
    kernel_head_dim = manifest.round_up_headdim(head_dim)
    if not allow_empty and (q.numel() == 0 or k.numel() == 0):
        return Refusal(f"an input is empty ({nq} shape {_shape(q)}, {nk} shape {_shape(k)})")
    problem = manifest.size_limit_problem(batch, heads_q, seqlen_q, seqlen_k)
    if problem is not None:
        return Refusal(problem)
    answer = _layout_scale_window((nq, nk, nv), (q, k, v), softmax_scale, "softmax_scale" if nq == "q" else "scale",
                                  window_rules, window_size, causal, seqlen_q, seqlen_k)
    if isinstance(answer, Refusal):
        return answer
    causal, window = answer
    refusal = kernel_refusal(softcap, softmax_scale, q, k, v, head_dim, names)
    if refusal is not None:
        return refusal
    dtype = DTYPE_NAMES[q.dtype]
    return Problem(
        batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, kernel_head_dim,
        bool(causal), None if window is None else tuple(window), bool(top_left), softmax_scale,
    )

