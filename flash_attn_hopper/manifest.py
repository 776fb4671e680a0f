"""The one feature manifest of flash_attn_hopper.

Everything that decides *what* gets compiled and *what* a build can do reads
this file: the instantiation generator (``tools/build/generate_instantiations.py``),
``setup.py``'s build filter, the runtime "not compiled in" errors and the
tests' skip lists.  Pure Python on purpose: it is imported by ``setup.py``
before torch is known to be usable, so it must not import torch.

Build knobs (environment variables read at build time):

* ``FLASH_ATTN_HOPPER_HDIMS``   comma-separated head dims, e.g. ``64,128``
* ``FLASH_ATTN_HOPPER_DTYPES``  comma-separated dtypes, e.g. ``bf16``
* ``FLASH_ATTN_HOPPER_DISABLE_BACKWARD=1``  no backward kernels, whatever
  else is set

Unset (or ``all``) hdims/dtypes mean everything the manifest offers; the
backward is built unless disabled.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, Mapping

# --------------------------------------------------------------------------
# What the source tree offers
# --------------------------------------------------------------------------

#: Head dims with their own kernel instantiation.  Any multiple of 8 up to
#: 256 runs on the next one up (see :func:`round_up_headdim`).
HEAD_DIMS: tuple[int, ...] = (64, 96, 128, 192, 256)

#: Largest head dim accepted at all, and the granularity of accepted dims.
MAX_HEAD_DIM = 256
HEAD_DIM_MULTIPLE = 8

#: Size limits of the kernels (csrc/flash_api.cpp checks them through the generated manifest.h): batch and query heads index the
#: grids' y/z dimensions (at most 65535), and seqlen_q + seqlen_k must stay below 2**29 so that
#: no index sum overflows a 32-bit int.
MAX_BATCH = 65535
MAX_HEADS = 65535
MAX_SEQLEN_SUM = 2**29 - 1


def size_limit_problem(batch: int, heads_q: int, seqlen_q: int, seqlen_k: int) -> str | None:
    """What exceeds the kernels' size limits, or None."""
    if batch > MAX_BATCH:
        return f"batch {batch} is over the kernels' limit of {MAX_BATCH}; split it into several calls"
    if heads_q > MAX_HEADS:
        return f"nheads_q {heads_q} is over the kernels' limit of {MAX_HEADS}"
    if seqlen_q + seqlen_k > MAX_SEQLEN_SUM:
        return f"seqlen_q + seqlen_k = {seqlen_q + seqlen_k} is over the kernels' limit of {MAX_SEQLEN_SUM} (2**29 - 1)"
    return None


@dataclass(frozen=True)
class DType:
    name: str  # the spelling used by the knobs and file names
    cutlass_type: str  # the C++ element type of the instantiation
    torch_name: str  # attribute of the torch module, e.g. torch.bfloat16
    aten_name: str  # the at::ScalarType enumerator csrc/flash_api.cpp checks, e.g. BFloat16


DTYPES: Mapping[str, DType] = {
    "fp16": DType("fp16", "cutlass::half_t", "float16", "Half"),
    "bf16": DType("bf16", "cutlass::bfloat16_t", "bfloat16", "BFloat16"),
}

#: FP8 (e4m3) inputs: a knob dtype of its own (``FLASH_ATTN_HOPPER_DTYPES=...,fp8``) with its own
#: direction (forward only, bf16 output); DTYPES stays the 16-bit dtypes every other direction takes.
FP8 = DType("fp8", "cutlass::float_e4m3_t", "float8_e4m3fn", "Float8_e4m3fn")
#: Every dtype a build selection may name, in the knobs' order.
BUILD_DTYPES: Mapping[str, DType] = {**DTYPES, FP8.name: FP8}

#: Accepted alternative spellings in ``FLASH_ATTN_HOPPER_DTYPES``.
DTYPE_ALIASES: Mapping[str, str] = {
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "e4m3": "fp8",
    "float8_e4m3fn": "fp8",
}


@dataclass(frozen=True)
class Direction:
    name: str  # "fwd" / "bwd"
    entry_point: str  # the templated host launcher each instantiation file instantiates
    registry_macro: str  # X-macro in generated/fwd_registry.h listing the compiled pairs
    description: str
    launch_header: str  # the csrc/ header that declares entry_point
    params_type: str  # the params struct entry_point takes by reference
    hdims: tuple[int, ...] | None = None  # the head dims it has kernels for (None: every one)
    dtypes: tuple[str, ...] = tuple(DTYPES)  # the dtypes it has kernels for


#: Every direction the project knows how to generate files for.
DIRECTIONS: Mapping[str, Direction] = {
    "fwd": Direction(
        "fwd", "flash::run_flash_fwd", "FLASH_ATTN_HOPPER_FOR_EACH_FWD", "forward",
        "launch/fwd_launch.cuh", "flash::FwdParams",
    ),
    "bwd": Direction(
        "bwd", "flash::run_flash_bwd", "FLASH_ATTN_HOPPER_FOR_EACH_BWD", "backward",
        "launch/bwd_launch.cuh", "flash::BwdParams",
    ),
    "paged": Direction(
        "paged", "flash::run_flash_fwd_paged", "FLASH_ATTN_HOPPER_FOR_EACH_PAGED", "paged-KV forward",
        "launch/paged_launch.cuh", "flash::FwdParams",
    ),
    # FA3's qv (MLA decode: q/k head dim 64, v's up to 512): kernels of their own, in their own files.
    "qv": Direction(
        "qv", "flash::run_flash_fwd_qv", "FLASH_ATTN_HOPPER_FOR_EACH_QV", "qv forward",
        "launch/qv_launch.cuh", "flash::FwdParams", hdims=(64,),
    ),
    # FP8 (e4m3) forward: head dims up to 64 / 128 / 256 on those kernels (fp8_head_dim).
    "fp8": Direction(
        "fp8", "flash::run_flash_fwd_fp8", "FLASH_ATTN_HOPPER_FOR_EACH_FP8", "FP8 forward",
        "launch/fp8_launch.cuh", "flash::FwdParams", hdims=(64, 128, 256), dtypes=(FP8.name,),
    ),
}

#: dv != d with kernels of their own (csrc/kernel/common/policy.h fwd_value_head_dim; the backward's
#: BwdPolicy::kNarrowV reads v at its head dim too): the q/k head dim's manifest head dim -> the
#: widest v head dim they take. Other pairs run on zero-padded copies (docs/decisions/061, 064).
VALUE_HEAD_DIMS: Mapping[int, int] = {192: 128}

#: Directions whose kernels exist in csrc/ and are verified on a GPU in this
#: version: built by default (for the selected head dims and dtypes).
AVAILABLE_DIRECTIONS: tuple[str, ...] = ("fwd", "bwd", "paged", "qv", "fp8")

#: Attention features and whether this version has kernels for them.  The
#: Python layer refuses an unavailable feature before any launch, naming it.
FEATURES: Mapping[str, bool] = {
    "causal": True,  # bottom-right aligned
    "gqa": True,  # nheads_q a multiple of nheads_kv, K/V shared, never copied
    "lse": True,  # return_attn_probs=True returns the float32 log-sum-exp
    "strided_inputs": True,  # any strides with a contiguous last dim
    "local_window": True,  # window_size other than (-1, -1) / causal
    "softcap": True,  # scores softcap * tanh(s / softcap), forward and backward (a build may leave it out)
    "varlen": True,  # flash_attn_varlen_func: packed sequences (cu_seqlens, seqused), forward and backward
    "paged_kv": True,  # flash_attn_with_kvcache / flash_attn_varlen_func with page_table (forward)
    "qv": True,  # FA3's qv (d 64, dv up to 512), dense / varlen / contiguous KV cache, forward
    "fp8": True,  # e4m3 q, k, v with descales, bf16 out: dense / varlen forward (a build may leave it out)
    # Verified backward kernels in this version (a build may still leave them out):
    # build_info()["features"]["backward"] says what the installed build can do.
    "backward": "bwd" in AVAILABLE_DIRECTIONS,
}

# --------------------------------------------------------------------------
# Knobs and commands quoted in messages
# --------------------------------------------------------------------------

ENV_HDIMS = "FLASH_ATTN_HOPPER_HDIMS"
ENV_DTYPES = "FLASH_ATTN_HOPPER_DTYPES"
ENV_DISABLE_BACKWARD = "FLASH_ATTN_HOPPER_DISABLE_BACKWARD"
#: Leaves the softcap kernels out (they double the kernels of each file; FA3's FLASHATTENTION_DISABLE_SOFTCAP).
ENV_DISABLE_SOFTCAP = "FLASH_ATTN_HOPPER_DISABLE_SOFTCAP"

BUILD_COMMAND = "pip install --no-build-isolation -v ."

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


# --------------------------------------------------------------------------
# Selection: what one build compiles
# --------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Instantiation:
    """One generated translation unit: a (direction, head dim, dtype) triple."""

    direction: str
    hdim: int
    dtype: str

    @property
    def filename(self) -> str:
        return f"flash_{self.direction}_hdim{self.hdim}_{self.dtype}_sm90.cu"

    @property
    def cutlass_type(self) -> str:
        return BUILD_DTYPES[self.dtype].cutlass_type


@dataclass(frozen=True)
class Selection:
    """The subset of the manifest one build compiles (from the knobs)."""

    hdims: tuple[int, ...]
    dtypes: tuple[str, ...]
    directions: tuple[str, ...]
    softcap: bool = True  # the softcap kernels are compiled

    def instantiations(self) -> list[Instantiation]:
        return [
            Instantiation(direction, hdim, dtype)
            for direction in self.directions
            for hdim in self.hdims
            if DIRECTIONS[direction].hdims is None or hdim in DIRECTIONS[direction].hdims
            for dtype in self.dtypes
            if dtype in DIRECTIONS[direction].dtypes
        ]

    def as_dict(self) -> dict:
        return {
            "hdims": list(self.hdims),
            "dtypes": list(self.dtypes),
            "directions": list(self.directions),
            "softcap": self.softcap,
        }


def _split(value: str) -> list[str]:
    return [item.strip() for item in value.replace(";", ",").split(",") if item.strip()]


def parse_hdims(value: str | None) -> tuple[int, ...]:
    """Parse ``FLASH_ATTN_HOPPER_HDIMS``; ``None``, empty or ``all`` means all."""
    if value is None or value.strip().lower() in ("", "all"):
        return HEAD_DIMS
    chosen = set()
    for item in _split(value):
        try:
            hdim = int(item)
        except ValueError:
            raise ValueError(
                f"{ENV_HDIMS}={value!r}: {item!r} is not an integer; "
                f"use a comma-separated subset of {','.join(map(str, HEAD_DIMS))} (or 'all')"
            ) from None
        if hdim not in HEAD_DIMS:
            served_by = round_up_headdim(hdim)
            why = (
                f"it runs on the hdim-{served_by} kernels, so build {served_by}"
                if served_by is not None
                else "it is not supported at all"
            )
            raise ValueError(
                f"{ENV_HDIMS}={value!r}: head dim {hdim} has no kernel of its own ({why}); "
                f"choose from {','.join(map(str, HEAD_DIMS))} (or 'all')"
            )
        chosen.add(hdim)
    if not chosen:
        raise ValueError(f"{ENV_HDIMS}={value!r} selects no head dim")
    return tuple(sorted(chosen))


def parse_dtypes(value: str | None) -> tuple[str, ...]:
    """Parse ``FLASH_ATTN_HOPPER_DTYPES``; ``None``, empty or ``all`` means all."""
    if value is None or value.strip().lower() in ("", "all"):
        return tuple(BUILD_DTYPES)
    chosen = set()
    for item in _split(value):
        name = DTYPE_ALIASES.get(item.lower(), item.lower())
        if name not in BUILD_DTYPES:
            raise ValueError(
                f"{ENV_DTYPES}={value!r}: unknown dtype {item!r}; choose from {','.join(BUILD_DTYPES)} (or 'all')"
            )
        chosen.add(name)
    if not chosen:
        raise ValueError(f"{ENV_DTYPES}={value!r} selects no dtype")
    return tuple(name for name in BUILD_DTYPES if name in chosen)  # manifest order


def parse_flag(name: str, value: str | None) -> bool:
    if value is None:
        return False
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"{name}={value!r}: expected 1/0 (or true/false, yes/no, on/off)")


def selection_from_env(env: Mapping[str, str] | None = None) -> Selection:
    """The build selection the knobs in ``env`` (default ``os.environ``) ask for."""
    env = os.environ if env is None else env
    hdims = parse_hdims(env.get(ENV_HDIMS))
    dtypes = parse_dtypes(env.get(ENV_DTYPES))
    disable_backward = parse_flag(ENV_DISABLE_BACKWARD, env.get(ENV_DISABLE_BACKWARD))
    disable_softcap = parse_flag(ENV_DISABLE_SOFTCAP, env.get(ENV_DISABLE_SOFTCAP))
    directions = list(AVAILABLE_DIRECTIONS)
    if disable_backward and "bwd" in directions:
        directions.remove("bwd")
    return Selection(hdims=hdims, dtypes=dtypes, directions=tuple(directions), softcap=not disable_softcap)


def full_selection() -> Selection:
    return selection_from_env({})


# --------------------------------------------------------------------------
# Run-time helpers
# --------------------------------------------------------------------------


def round_up_headdim(hdim: int) -> int | None:
    """The compiled head dim that serves ``hdim``, or None if none can.

    ``hdim`` must be a positive multiple of 8 and at most 256; the kernels pad
    it up to the next manifest head dim.
    """
    if hdim <= 0 or hdim % HEAD_DIM_MULTIPLE != 0 or hdim > MAX_HEAD_DIM:
        return None
    for candidate in HEAD_DIMS:
        if hdim <= candidate:
            return candidate
    return None


def own_value_kernels(head_dim: int, head_dim_v: int) -> bool:
    """Whether the forward kernels take v's head dim ``head_dim_v`` beside q / k's ``head_dim`` as
    they are (VALUE_HEAD_DIMS; both multiples of 8)."""
    rounded = round_up_headdim(head_dim) if head_dim % HEAD_DIM_MULTIPLE == 0 else None
    widest = VALUE_HEAD_DIMS.get(rounded, 0) if rounded else 0
    return head_dim_v != head_dim and 0 < head_dim_v <= widest and head_dim_v % HEAD_DIM_MULTIPLE == 0


def dtype_name(torch_dtype_name: str) -> str | None:
    """Manifest name ("fp16"/"bf16") for a torch dtype's name ("float16"...)."""
    for name, info in DTYPES.items():
        if info.torch_name == torch_dtype_name:
            return name
    return None


def backward_knob(backward: bool) -> str | None:
    """The knob setting that gives a build with (``backward``) or without backward kernels; None if none is needed."""
    if not backward and "bwd" in AVAILABLE_DIRECTIONS:
        return f"{ENV_DISABLE_BACKWARD}=1"
    return None


def rebuild_hint(hdims: Iterable[int], dtypes: Iterable[str], backward: bool = False) -> str:
    """The command line that builds a selection including ``hdims`` × ``dtypes``, with or without the backward."""
    parts = [
        f"{ENV_HDIMS}={','.join(str(h) for h in sorted(set(hdims)))}",
        f"{ENV_DTYPES}={','.join(d for d in BUILD_DTYPES if d in set(dtypes))}",
    ]
    knob = backward_knob(backward)
    if knob is not None:
        parts.append(knob)
    return " ".join(parts + [BUILD_COMMAND])


def direction_unavailable_message(direction: str) -> str:
    """Why a build has no kernels of ``direction`` at all (not one missing head dim)."""
    info = DIRECTIONS[direction]
    if direction not in AVAILABLE_DIRECTIONS:
        return (
            f"flash_attn_hopper: {info.description} kernels are not part of this version "
            f"(available directions: {', '.join(DIRECTIONS[d].description for d in AVAILABLE_DIRECTIONS)})."
        )
    return f"flash_attn_hopper: this build has no {info.description} kernels; rebuild without {ENV_DISABLE_BACKWARD}=1."


def not_compiled_message(
    direction: str,
    hdim: int,
    dtype: str,
    compiled: Iterable[Instantiation],
) -> str | None:
    """None if (direction, hdim rounded up, dtype) is in ``compiled``; else why not and how to fix.

    ``hdim`` is the caller's head dim; it is rounded up to a manifest head dim.
    """
    compiled = set(compiled)
    ours = [inst for inst in compiled if inst.direction == direction]
    # No kernels of the direction at all: not in this version, or the build left the backward out.
    if direction not in AVAILABLE_DIRECTIONS or (direction == "bwd" and not ours):
        return direction_unavailable_message(direction)
    rounded = round_up_headdim(hdim)
    if rounded is None:
        return (
            f"flash_attn_hopper: head dim {hdim} is not supported; it must be a positive multiple of "
            f"{HEAD_DIM_MULTIPLE} and at most {MAX_HEAD_DIM}."
        )
    if Instantiation(direction, rounded, dtype) in compiled:
        return None
    have_hdims = sorted({inst.hdim for inst in ours})
    have_dtypes = [d for d in BUILD_DTYPES if d in {inst.dtype for inst in ours}]
    # The hint rebuilds what the build had, plus the missing pair: the backward stays as it was.
    backward = direction == "bwd" or any(inst.direction == "bwd" for inst in compiled)
    hint = rebuild_hint(set(have_hdims) | {rounded}, set(have_dtypes) | {dtype}, backward)
    served = f"head dim {hdim} (runs on the hdim-{rounded} kernels)" if rounded != hdim else f"head dim {hdim}"
    return (
        f"flash_attn_hopper was built without {DIRECTIONS[direction].description} kernels for {served} "
        f"in {dtype}. This build has head dims {have_hdims or 'none'} and dtypes {have_dtypes or 'none'}. "
        f"Rebuild with: {hint}"
    )
