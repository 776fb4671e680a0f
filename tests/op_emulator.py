"""A float32 emulation of ``torch.ops.flash_attn_hopper.fwd``'s contract, and ways to install it.

The CPU tests of the SDPA drop-in, torch's registry route and the
transformers integration run their fast paths through this emulation, so
that what they check -- the layouts, scales, masks and alignment each layer
passes to the op -- is checked on any machine.  The contract (from
csrc/flash_api.cpp): q (b, sq, hq, d), k and v (b, sk, hk, d); query i sees
key j when  j >= i + off - left (left >= 0)  and  j <= i + off + right
(right >= 0, and right = 0 when causal), off = sk - sq, or 0 with top_left;
rows that see no key give out = 0 and lse = -inf.  out is a contiguous
(b, sq, hq, d) tensor in q's dtype, lse float32 (b, hq, sq).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from flash_attn_hopper import ops


def op_mask(seqlen_q, seqlen_k, causal, left, right, top_left, device=None) -> torch.Tensor:
    """(seqlen_q, seqlen_k) bool, True where the op masks the key out."""
    if causal:
        right = 0
    offset = 0 if top_left else seqlen_k - seqlen_q
    row = torch.arange(seqlen_q, device=device).view(-1, 1) + offset
    col = torch.arange(seqlen_k, device=device).view(1, -1)
    masked = torch.zeros(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if right >= 0:
        masked = masked | (col > row + right)
    if left >= 0:
        masked = masked | (col < row - left)
    return masked


def emulate_fwd(q, k, v, softmax_scale, causal, window_size_left=-1, window_size_right=-1, top_left=False):
    """What the op returns, computed in float32 with plain torch ops (also on fake tensors)."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.size(1), k.size(2)
    group = heads_q // heads_kv
    kf = k.float().repeat_interleave(group, dim=2)
    vf = v.float().repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), kf) * softmax_scale
    masked = op_mask(seqlen_q, seqlen_k, causal, window_size_left, window_size_right, top_left, device=q.device)
    scores = scores.masked_fill(masked, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.softmax(scores, dim=-1).masked_fill(masked.all(dim=-1, keepdim=True), 0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, vf).to(q.dtype).contiguous()
    return out, lse.contiguous()


class EmulatedKernel:
    """Counts and records the op calls that reached the emulation."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, q, k, v, softmax_scale, causal, window_size_left=-1, window_size_right=-1, top_left=False):
        self.calls.append((q, k, v, softmax_scale, causal, window_size_left, window_size_right, top_left))
        return emulate_fwd(q, k, v, softmax_scale, causal, window_size_left, window_size_right, top_left)


@contextlib.contextmanager
def emulated_op(monkeypatch: pytest.MonkeyPatch, device_type: str = "cpu"):
    """Make the op run the emulation on ``device_type`` tensors and let the routing accept that device.

    With the compiled extension the emulation becomes the op's kernel for that
    dispatch key, so calls go through the real schema (argument names, defaults,
    the fake kernel under torch.compile).  Without it, ``torch.ops.flash_attn_hopper.fwd``
    itself is replaced by the emulation.
    """
    from flash_attn_hopper import sdpa

    kernel = EmulatedKernel()
    monkeypatch.setattr(sdpa, "kernel_refusal", lambda device: None)
    monkeypatch.setattr(sdpa, "_COMPILED_FWD", None)  # the emulation covers every head dim and dtype
    if ops.extension_loaded():
        library = torch.library.Library("flash_attn_hopper", "IMPL")

        def cpu_kernel(*args, **kwargs):
            return kernel(*args, **kwargs)

        library.impl("fwd", cpu_kernel, device_type.upper())
        try:
            yield kernel
        finally:
            library._destroy()
    else:
        monkeypatch.setattr(torch.ops.flash_attn_hopper, "fwd", kernel, raising=False)
        yield kernel
