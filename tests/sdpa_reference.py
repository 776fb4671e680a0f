"""Helpers of the GPU tests of the SDPA drop-in, torch's registry route and the integrations.

``sdpa_ref`` is torch SDPA's maths restated in (batch, heads, seqlen, head_dim)
layout with the top-left causal mask: in float32 it is the reference, in the
inputs' dtype it is "PyTorch's own low-precision error" of FlashAttention's
tolerance rule (reference.assert_fa_close).  ``cuda_kernel_names`` lists the
kernels a call launches, and ``is_our_forward_kernel`` tells ours from torch's
FlashAttention-2, whose kernel has the same base name in namespace ``pytorch_flash``;
``is_our_backward_kernel`` does the same for the three kernels of our backward.
``compiled_config``, ``skip_unless_compiled`` and ``poison_allocations`` serve the
kernel tests (test_flash_fwd.py, test_flash_bwd.py) too.
"""

from __future__ import annotations

import math

import pytest
import torch

from flash_attn_hopper import _build_info, manifest


def sdpa_ref(q, k, v, is_causal=False, scale=None, upcast=True):
    """softmax(q kᵀ · scale + top-left causal mask) v for q (b, hq, L, e), k/v (b, hk, S, e); GQA by repetition."""
    dtype = torch.float32 if upcast else q.dtype
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    group = q.size(1) // k.size(1)
    q, k, v = q.to(dtype), k.to(dtype).repeat_interleave(group, 1), v.to(dtype).repeat_interleave(group, 1)
    scores = (q * scale) @ k.transpose(-2, -1)
    if is_causal:
        keep = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


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


def poison_allocations(*specs) -> list[int]:
    """Fill the blocks an op's next allocations will get with NaN; return their addresses.

    ``specs`` are (shape, dtype) of what the op allocates itself (outputs, gradients), so
    we cannot hand it a poisoned buffer. Instead: empty torch's cache, allocate NaN
    tensors of those sizes and free them; the caching allocator gives those cached
    blocks to the next allocations of the same sizes, so rows a kernel forgets to
    write stay NaN.
    """
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    blocks = [torch.full(shape, float("nan"), dtype=dtype, device="cuda") for shape, dtype in specs]
    addresses = [t.data_ptr() for t in blocks]
    del blocks
    return addresses


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


def random_bhsd(b, h, s, e, dtype, seed, layout="bshd_memory"):
    """(b, h, s, e) tensor; by default a transposed view of (b, s, h, e) memory, as models make them."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if layout == "bshd_memory":
        return torch.randn(b, s, h, e, device="cuda", dtype=dtype, generator=gen).transpose(1, 2)
    return torch.randn(b, h, s, e, device="cuda", dtype=dtype, generator=gen)
