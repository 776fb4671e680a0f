"""Float32 emulations of ``torch.ops.flash_attn_hopper.fwd`` and ``bwd``'s contracts, and ways to install them.

The CPU tests of the SDPA drop-in, torch's registry route and the
transformers integration run their fast paths through this emulation, so
that what they check -- the layouts, scales, masks and alignment each layer
passes to the op -- is checked on any machine.  The contract (from
csrc/flash_api.cpp): q (b, sq, hq, d), k and v (b, sk, hk, d); query i sees
key j when  j >= i + off - left (left >= 0)  and  j <= i + off + right
(right >= 0, and right = 0 when causal), off = sk - sq, or 0 with top_left;
rows that see no key give out = 0 and lse = -inf.  out is a contiguous
(b, sq, hq, d) tensor in q's dtype, lse float32 (b, hq, sq).

``bwd`` (flash_attn_hopper/ops.py's BWD_SCHEMA) recomputes P from q, k and
the forward's lse, takes D = rowsum(dout * out) from the forward's output, and
returns contiguous dq like q, dk and dv like k and v, dk/dv summed over the
query heads of each group: the kernel's maths, so that wrong tensors or
arguments handed to it show up as wrong gradients.
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


def emulate_bwd(
    dout, q, k, v, out, softmax_lse, softmax_scale, causal,
    window_size_left=-1, window_size_right=-1, top_left=False, deterministic=False,
):
    """(dq, dk, dv) of the attention that produced ``out`` and ``softmax_lse``, in float32 maths."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.size(1), k.size(2)
    group = heads_q // heads_kv
    qf, dof = q.float(), dout.float()
    kf = k.float().repeat_interleave(group, dim=2)
    vf = v.float().repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", qf, kf) * softmax_scale
    masked = op_mask(seqlen_q, seqlen_k, causal, window_size_left, window_size_right, top_left, device=q.device)
    probs = torch.exp(scores - softmax_lse.float()[..., None]).masked_fill(masked, 0.0)
    dv = torch.einsum("bhqk,bqhd->bkhd", probs, dof)
    dprobs = torch.einsum("bqhd,bkhd->bhqk", dof, vf)
    rowsum = (dof * out.float()).sum(-1).transpose(1, 2)[..., None]  # (b, hq, sq, 1)
    dscores = probs * (dprobs - rowsum)
    dq = torch.einsum("bhqk,bkhd->bqhd", dscores, kf) * softmax_scale
    dk = torch.einsum("bhqk,bqhd->bkhd", dscores, qf) * softmax_scale
    # Query head h reads kv head h // group: its gradients go back there.
    dk = dk.reshape(batch, seqlen_k, heads_kv, group, head_dim).sum(3)
    dv = dv.reshape(batch, seqlen_k, heads_kv, group, head_dim).sum(3)
    return dq.to(q.dtype).contiguous(), dk.to(k.dtype).contiguous(), dv.to(v.dtype).contiguous()


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
    from flash_attn_hopper import _build_info, support

    kernel = EmulatedKernel()
    monkeypatch.setattr(support, "device_refusal", lambda q, k, v, names=None: None)
    monkeypatch.setattr(_build_info, "COMPILED", None)  # the emulation covers every head dim and dtype
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


class EmulatedBackward:
    """Records the bwd calls that reached the emulation (every argument, by name)."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, *args, **kwargs):
        # The dispatcher leaves trailing arguments that equal their defaults out of a Python kernel's call.
        schema = torch._C.parse_schema(f"flash_attn_hopper::{ops.BWD_SCHEMA}")
        call = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
        call.update(zip(ops.BWD_SCHEMA_ARGS, args), **kwargs)
        self.calls.append(call)
        return emulate_bwd(**call)


@contextlib.contextmanager
def emulated_bwd_op(device_type: str = "cpu", schema: str | None = None):
    """Give ``torch.ops.flash_attn_hopper.bwd`` the emulation as its kernel for ``device_type``.

    With a build that has the bwd op, the emulation is added as that op's
    kernel for the device (the real schema and fake kernel stay).  Without
    one, a stand-in op is defined with ``schema`` (default ops.BWD_SCHEMA, the
    contract csrc/flash_api.cpp implements) and ops.py's fake kernel, and
    removed again afterwards.  Needs the compiled extension (the forward's
    autograd formula is registered only with it).
    """
    kernel = EmulatedBackward()
    if ops.has_bwd_op():
        if schema is not None:
            pytest.skip("this build defines the real bwd op; no stand-in with another schema can replace it")
        library = torch.library.Library("flash_attn_hopper", "IMPL")
        library.impl("bwd", kernel, device_type.upper())
    else:
        library = torch.library.Library("flash_attn_hopper", "FRAGMENT")
        library.define(schema or ops.BWD_SCHEMA)
        library.impl("bwd", kernel, device_type.upper())
        ops.register_bwd_fake(lib=library)
    try:
        yield kernel
    finally:
        library._destroy()
