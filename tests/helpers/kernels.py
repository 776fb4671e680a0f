"""What this build compiled, the extension skip mark, and which CUDA kernels a call launched.

``compiled_config`` and ``skip_unless_compiled`` read the build record
(flash_attn_hopper/_build_info.py); without one the C++ dispatch decides.
``cuda_kernel_names`` lists the kernels a call launches, and ``is_our_forward_kernel`` tells
ours from torch's FlashAttention-2, whose kernel has the same base name in namespace
``pytorch_flash``; ``is_our_backward_kernel`` does the same for the three kernels of our backward.
"""

from __future__ import annotations

import pytest
import torch

from flash_attn_hopper import _build_info, manifest, ops


def needs_extension(why: str = "needs the compiled extension"):
    """A skip mark for tests that need the compiled extension: ``why``, what failed to load, the build command."""
    return pytest.mark.skipif(
        not ops.extension_loaded(), reason=f"{why} ({ops.LOAD_ERROR}); build it with `{manifest.BUILD_COMMAND}`"
    )


def compiled_config(direction: str = "fwd") -> tuple[int, torch.dtype]:
    """One (head dim, dtype) with a kernel of ``direction`` ("fwd" / "bwd") in this build, preferring 128 / bf16.

    For "bwd" the forward kernel exists too: a build compiles the backward for the forward's pairs.
    """
    compiled = _build_info.COMPILED
    if compiled is None or manifest.Instantiation(direction, 128, "bf16") in compiled:
        return 128, torch.bfloat16
    inst = sorted(i for i in compiled if i.direction == direction)[0]
    return inst.hdim, getattr(torch, manifest.DTYPES[inst.dtype].torch_name)


def skip_unless_compiled(head_dim: int, dtype: torch.dtype, directions: tuple[str, ...] = ("fwd",)) -> None:
    """Skip, naming the knob, unless this build compiled ``directions`` for (head_dim, dtype).

    Without a build record the C++ dispatch decides.
    """
    compiled = _build_info.COMPILED
    if compiled is None:
        return
    name = manifest.dtype_name(str(dtype).removeprefix("torch."))
    for direction in directions:
        message = manifest.not_compiled_message(direction, head_dim, name, compiled)
        if message is not None:
            pytest.skip(message)


def cuda_kernel_names(fn) -> list[str]:
    """Names of the CUDA kernels ``fn()`` launches, in order."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [event.name for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA]


def is_our_forward_kernel(name: str) -> bool:
    return "flash_fwd_kernel" in name and "pytorch_flash" not in name


#: Our backward's kernels (namespace ``flash``).  torch's FlashAttention-2 backward kernels
#: (flash_bwd_dq_dk_dv_loop_..., flash_bwd_dot_do_o_kernel, flash_bwd_convert_dq_kernel, ...)
#: contain none of these names, and live in namespace ``pytorch_flash``.
OUR_BACKWARD_KERNELS = ("flash_bwd_kernel", "flash_bwd_preprocess_kernel", "flash_bwd_dq_postprocess_kernel")


def is_our_backward_kernel(name: str) -> bool:
    return any(kernel in name for kernel in OUR_BACKWARD_KERNELS) and "pytorch_flash" not in name


def is_torch_flash_kernel(name: str) -> bool:
    return "pytorch_flash" in name
