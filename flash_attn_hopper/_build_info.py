"""What this installation was built with, and what it can run here."""

from __future__ import annotations

import copy

import re

from . import manifest, ops
from ._version import TORCH_MIN_VERSION, __version__


def _read_build_config() -> dict | None:
    try:
        from ._build_config import CONFIG
    except ImportError:
        return None
    return CONFIG


# Read once at import: the values are fixed for the life of the process, and
# torch.compile traces plain global reads without a graph break.
_CONFIG: dict | None = _read_build_config()

#: The (direction, hdim, dtype) set compiled into ``_C``; None when no build
#: recorded it (then only the C++ checks guard the dispatch).
COMPILED: frozenset[manifest.Instantiation] | None = (
    None
    if _CONFIG is None
    else frozenset(manifest.Instantiation(c["direction"], c["hdim"], c["dtype"]) for c in _CONFIG["compiled"])
)


def backward_compiled() -> bool | None:
    """Whether the recorded build compiled backward kernels; None without a build record."""
    if COMPILED is None:
        return None
    return any(inst.direction == "bwd" for inst in COMPILED)


def backward_available() -> bool:
    """Whether gradients can flow through the kernels: the extension defines the bwd op
    and (when the build was recorded) the build compiled backward kernels."""
    return ops.has_bwd_op() and backward_compiled() is not False


def compiled_feature(feature: str) -> bool:
    """Whether the recorded build compiled an optional kernel family its selection names (``softcap``);
    True without a build record or for a record from before the knob (then the C++ checks guard it)."""
    if _CONFIG is None:
        return True
    return bool(_CONFIG.get("selection", {}).get(feature, True))


def build_config() -> dict | None:
    """The configuration setup.py recorded, or None when no build wrote one."""
    return copy.deepcopy(_CONFIG) if _CONFIG is not None else None


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


def torch_requirement_met(requirement: str | None, torch_version: str) -> bool | None:
    """Whether ``torch_version`` satisfies a recorded requirement such as ">=2.14,<2.15"; None if unknown."""
    if not requirement:
        return None
    version = _version_tuple(torch_version)
    for clause in requirement.split(","):
        match = re.fullmatch(r"\s*(>=|<|==)\s*([\d.]+)\s*", clause)
        if match is None:
            return None
        op, bound = match.group(1), _version_tuple(match.group(2))
        head = version[: len(bound)]
        if (op == ">=" and head < bound) or (op == "<" and head >= bound) or (op == "==" and head != bound):
            return False
    return True


def build_info() -> dict:
    """A dict describing the build and whether it can run here.

    Keys: ``version``; ``available`` and ``unavailable_reason``;
    ``extension_loaded`` and ``load_error``; ``has_backward_op`` (the
    extension defines the bwd op); and, when
    setup.py recorded the build (``build_config_found``), everything it wrote:
    ``selection`` (the knobs' choice), ``compiled`` (list of
    {direction, hdim, dtype}), ``torch_version`` / ``torch_cuda_version`` at
    build time, ``nvcc_version``, ``cutlass_version`` / ``cutlass_origin`` /
    ``cutlass_path``, ``nvcc_flags``, ``cxx_flags``, ``max_jobs``,
    ``build_seconds``, ``compile_seconds`` per file, ``built_at``.  Also the
    manifest's ``supported_head_dims``, ``supported_dtypes`` and ``features``,
    where ``features["backward"]`` says whether this build can compute
    gradients, ``features["varlen"]`` whether it has the variable-length op and
    ``features["softcap"]`` whether it compiled the softcap kernels
    (the manifest's own entries only say what every build of this version can).
    Torch versions: ``torch_min_version`` (the oldest torch the sources build
    against), ``torch_requirement`` (the torch versions this build's extension
    loads under, e.g. ">=2.14,<2.15": the one minor version it was compiled
    against; None without a build record) and ``torch_requirement_met``.
    """
    import torch

    reason = ops.unavailable_reason()
    info = {
        "version": __version__,
        "available": reason is None,
        "unavailable_reason": reason,
        "extension_loaded": ops.extension_loaded(),
        "load_error": ops.LOAD_ERROR,
        "has_backward_op": ops.has_bwd_op(),
        "runtime_torch_version": torch.__version__,
        "runtime_torch_cuda_version": torch.version.cuda,
        "supported_head_dims": list(manifest.HEAD_DIMS),
        "supported_dtypes": list(manifest.DTYPES),
        "features": dict(
            manifest.FEATURES,
            backward=backward_available(),
            varlen=bool(manifest.FEATURES["varlen"]) and ops.has_varlen_fwd_op(),
            softcap=bool(manifest.FEATURES["softcap"]) and compiled_feature("softcap"),
        ),
    }
    config = build_config()
    info["build_config_found"] = config is not None
    info["torch_min_version"] = TORCH_MIN_VERSION
    info["torch_requirement"] = None
    if config is not None:
        info.update(config)
    info["torch_requirement_met"] = torch_requirement_met(info["torch_requirement"], torch.__version__)
    return info
