"""support.check's counterpart for variable-length calls (packed sequences with ``cu_seqlens``):
:func:`check_varlen` answers with a :class:`VarlenProblem` or a :class:`support.Refusal`.
Re-exported by :mod:`flash_attn_hopper.support`; the device and compiled-set checks are looked
up there at call time (tests replace them on that module)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import manifest, ops, support
from .support import DTYPE_NAMES, Refusal, _dtypes_refusal, _heads_refusal, _layout_scale_window, _shape, feature_refusal

# --------------------------------------------------------------------------
# Variable-length batches
# --------------------------------------------------------------------------

#: cu_seqlens and seqused are int32: no offset or length beyond this.


@dataclass(frozen=True)
class VarlenProblem:
    """A variable-length attention call the kernels compute, in the varlen op's terms."""

    batch: int
    total_q: int
    total_k: int
    max_seqlen_q: int
    max_seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: str
    kernel_head_dim: int
    causal: bool
    window: tuple[int, int] | None  # effective (left, right) for every sequence, -1 = unbounded
    top_left: bool
    softmax_scale: float | None

    @property
    def gqa_ratio(self) -> int:
        return self.heads_q // self.heads_kv

    def kernel(self, direction: str = "fwd") -> manifest.Instantiation:
        return manifest.Instantiation(direction, self.kernel_head_dim, self.dtype)


def _host_int_refusal(name: str, value) -> Refusal | None:
    """A max_seqlen must be a host integer >= 0 (it sizes the launch grid); SymInts pass while tracing."""
    if isinstance(value, torch.SymInt):
        return None
    if isinstance(value, bool) or isinstance(value, torch.Tensor) or not hasattr(value, "__index__"):
        return Refusal(
            f"{name} must be a Python int (the longest sequence's length, known on the host), "
            f"got {type(value).__name__}",
            f"pass int({name}) computed once, e.g. from the lengths before they went to the GPU",
            TypeError,
        )
    if value.__index__() < 0:
        return Refusal(f"{name}={value.__index__()} is negative", f"{name} must be >= every sequence's length")
    return None


def _seq_tensor_refusal(name: str, t, length: int | None, q: torch.Tensor, what: str) -> Refusal | None:
    """cu_seqlens_* (length None: any >= 1) or seqused_* (length batch): int32, 1-D, contiguous, on q's device."""
    if not isinstance(t, torch.Tensor):
        return Refusal(f"{name} must be a torch.Tensor ({what}), got {type(t).__name__}", error=TypeError)
    if t.dtype != torch.int32:
        return Refusal(f"{name} has dtype {t.dtype}; it must be torch.int32 ({what})", f"pass {name}.to(torch.int32)")
    if t.dim() != 1:
        return Refusal(f"{name} must be 1-dimensional ({what}), got shape {_shape(t)}")
    if length is None and t.numel() < 1:
        return Refusal(f"{name} is empty; it must hold batch + 1 offsets, starting with 0")
    if length is not None and t.numel() != length:
        return Refusal(
            f"{name} has {t.numel()} entries but the batch has {length} sequences "
            f"(cu_seqlens_q has {length + 1} offsets); {name} must be ({length},)"
        )
    if not t.is_contiguous():
        return Refusal(f"{name} must be contiguous, got stride {tuple(t.stride())}", f"pass {name}.contiguous()")
    if t.device != q.device:
        return Refusal(f"{name} is on {t.device} but q is on {q.device}", f"move it with {name}.to(q.device)")
    return None


def check_varlen(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    seqused_q,
    seqused_k,
    max_seqlen_q,
    max_seqlen_k,
    *,
    causal: bool = False,
    window_size=(-1, -1),
    window_rules: str = "fa3",
    softmax_scale: float | None = None,
    softcap: float = 0.0,
    names: tuple[str, str, str] = ("q", "k", "v"),
) -> VarlenProblem | Refusal:
    """The variable-length problem the kernels compute for these arguments, or why they cannot.

    q (total_q, nheads, headdim), k and v (total_k, nheads_kv, headdim), only the last
    dimension contiguous; cu_seqlens_q / cu_seqlens_k int32 (batch + 1,), seqused_q /
    seqused_k None or int32 (batch,), all on q's device; max_seqlen_q / max_seqlen_k host
    ints >= 0.  Only what needs no device sync is checked: the contents of the sequence
    tensors are the kernels' to clamp.  ``window_size`` is read with ``window_rules``
    (``"fa3"`` or ``"fa2"``) against max_seqlen_q / max_seqlen_k, which gives every
    sequence the window the per-sequence rule would (a side reaching max_seqlen reaches
    every sequence's end).  Same order as :func:`check`: structure, scale, features,
    the compiled set, the device, then whether the extension has the varlen op.
    """
    nq, nk, nv = names
    for name, t in ((nq, q), (nk, k), (nv, v)):
        if not isinstance(t, torch.Tensor):
            return Refusal(f"{name} must be a torch.Tensor, got {type(t).__name__}", error=TypeError)
    for name, t, dims in (
        (nq, q, "(total_q, nheads, headdim)"),
        (nk, k, "(total_k, nheads_kv, headdim)"),
        (nv, v, "(total_k, nheads_kv, headdim)"),
    ):
        if t.dim() != 3:
            return Refusal(
                f"{name} must have 3 dimensions {dims} (the sequences packed along the first), got shape {_shape(t)}",
                "for (batch, seqlen, nheads, headdim) inputs use flash_attn_func" if t.dim() == 4 else "",
            )
    refusal = _dtypes_refusal((nq, nk, nv), q, k, v)
    if refusal is not None:
        return refusal
    total_q, heads_q, head_dim = q.shape
    if not support.kv_shapes_taken(k, v):
        return Refusal(
            f"{nk} and {nv} must have the same shape (total_k, nheads_kv, headdim), got {nk} {_shape(k)} and {nv} {_shape(v)}"
        )
    total_k, heads_kv = k.size(0), k.size(1)
    refusal = _heads_refusal((nq, nk, nv), q, k, head_dim, k.size(2), heads_q, heads_kv)
    if refusal is not None:
        return refusal
    kernel_head_dim = manifest.round_up_headdim(head_dim)
    offsets = "batch + 1 int32 offsets of the sequences"
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        refusal = _seq_tensor_refusal(name, t, None, q, offsets)
        if refusal is not None:
            return refusal
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        return Refusal(
            f"batch size mismatch: cu_seqlens_q has {cu_seqlens_q.numel()} offsets ({cu_seqlens_q.numel() - 1} "
            f"sequences), cu_seqlens_k has {cu_seqlens_k.numel()} ({cu_seqlens_k.numel() - 1} sequences)",
            "both must hold batch + 1 offsets",
        )
    batch = cu_seqlens_q.numel() - 1
    for name, t in (("seqused_q", seqused_q), ("seqused_k", seqused_k)):
        if t is not None:
            refusal = _seq_tensor_refusal(name, t, batch, q, "each sequence's used length")
            if refusal is not None:
                return refusal
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        refusal = _host_int_refusal(name, value)
        if refusal is not None:
            return refusal
    # SymInts (tracing) stay symbolic; plain ints are normalised.
    max_q = max_seqlen_q if isinstance(max_seqlen_q, torch.SymInt) else max_seqlen_q.__index__()
    max_k = max_seqlen_k if isinstance(max_seqlen_k, torch.SymInt) else max_seqlen_k.__index__()
    # The kernels' packed tensors: their windows and diagonals are bounded by total_q + total_k.
    if total_q + total_k > manifest.MAX_SEQLEN_SUM:
        return Refusal(
            f"total_q + total_k = {total_q + total_k} is over the kernels' limit of {manifest.MAX_SEQLEN_SUM} "
            "(2**29 - 1)",
            "split the batch into calls with fewer tokens",
        )
    problem = manifest.size_limit_problem(batch, heads_q, max_q, max_k)
    if problem is not None:
        return Refusal(problem.replace("seqlen_q + seqlen_k", "max_seqlen_q + max_seqlen_k"))
    answer = _layout_scale_window((nq, nk, nv), (q, k, v), softmax_scale, "softmax_scale", window_rules, window_size,
                                  causal, max_q, max_k)
    if isinstance(answer, Refusal):
        return answer
    causal, window = answer
    if not manifest.FEATURES["varlen"]:
        return feature_refusal("varlen", "variable-length attention (flash_attn_varlen_func)",
                               "Split the batch at cu_seqlens and call flash_attn_func per sequence.")
    refusal = support.kernel_refusal(softcap, softmax_scale, q, k, v, head_dim, names)
    if refusal is not None:
        return refusal
    dtype = DTYPE_NAMES[q.dtype]
    if not ops.has_varlen_fwd_op():
        return Refusal(ops.varlen_unavailable_message(), error=RuntimeError)
    return VarlenProblem(
        batch, total_q, total_k, max_q, max_k, heads_q, heads_kv, head_dim, dtype, kernel_head_dim,
        bool(causal), None if window is None else tuple(window), False, softmax_scale,
    )
