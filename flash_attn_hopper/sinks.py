"""Learnable attention sinks (gpt-oss; FlashAttention-4's ``learnable_sink``): one extra logit per
head that joins every row's softmax denominator and contributes no value,

    out = sum_j e^{s_j} v_j / (sum_j e^{s_j} + e^{sink}),    lse' = logaddexp(lse, sink).

The forward kernels fold the sink into each row's softmax denominator at the end of the tile
(the ops' ``sink`` argument). The kernels' backward run on (out', lse') gives the exact gradients
of q, k and v (P' = exp(s - lse') is the sink softmax's probability, and D = rowsum(dout * out')
its row term); given the sink, it also returns the sink's own gradient, -sum over rows of
exp(sink - lse') * D, from the D its preprocess computes anyway. Two ops, registered like the
kernels' own (fake kernels, autograd), so that compile, export and CUDA graphs see them whole:
``fwd_sink`` (dense) and ``varlen_fwd_sink`` (variable length); decision 054.
"""

from __future__ import annotations

import torch

from . import op_autograd, ops

FWD_SINK_SCHEMA = (
    "fwd_sink(Tensor q, Tensor k, Tensor v, Tensor sink, float softmax_scale, bool causal, "
    "int window_size_left=-1, int window_size_right=-1, bool deterministic=False, float softcap=0.0, "
    "int num_splits=1) -> (Tensor out, Tensor softmax_lse)"
)
VARLEN_FWD_SINK_SCHEMA = (
    "varlen_fwd_sink(Tensor q, Tensor k, Tensor v, Tensor sink, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
    "Tensor? seqused_q, Tensor? seqused_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool causal, "
    "int window_size_left=-1, int window_size_right=-1, bool deterministic=False, float softcap=0.0, "
    "int num_splits=1) -> (Tensor out, Tensor softmax_lse)"
)


def _kernel_sink(sink):
    """The sink as the kernels read it: float32, contiguous (a no-op for a float32 sink)."""
    return sink.detach().to(torch.float32).contiguous()


def _fwd_sink_impl(q, k, v, sink, softmax_scale, causal, window_size_left=-1, window_size_right=-1,
                   deterministic=False, softcap=0.0, num_splits=1):
    return torch.ops.flash_attn_hopper.fwd.default(
        q, k, v, softmax_scale, causal, window_size_left, window_size_right, False, softcap, _kernel_sink(sink),
        num_splits,
    )


def _fwd_sink_fake(q, k, v, sink, softmax_scale, causal, *rest):
    batch, seqlen_q, heads, _ = q.shape
    return q.new_empty((batch, seqlen_q, heads, v.shape[-1])), q.new_empty((batch, heads, seqlen_q), dtype=torch.float32)


def _fwd_sink_setup(ctx, inputs, output):
    q, k, v, sink, softmax_scale, causal, window_size_left, window_size_right, deterministic, softcap, _ = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, sink, out, lse)
    ctx.args = (softmax_scale, causal, window_size_left, window_size_right, False,
                bool(deterministic or torch.are_deterministic_algorithms_enabled()), softcap)
    ctx.set_materialize_grads(False)


def _fwd_sink_backward(ctx, grad_out, grad_lse):
    q, k, v, sink, out, lse = ctx.saved_tensors
    if grad_out is None:  # only lse was used: like the kernels' ops, its gradient is not propagated
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), torch.zeros_like(sink), *(None,) * 7
    if grad_out.stride(-1) != 1:
        grad_out = grad_out.contiguous()
    dq, dk, dv, dsink = ops.bwd_op()(grad_out, q, k, v, out, lse, *ctx.args, _kernel_sink(sink))
    return dq, dk, dv, dsink.to(sink.dtype), *(None,) * 7


def _varlen_fwd_sink_impl(q, k, v, sink, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                          max_seqlen_k, softmax_scale, causal, window_size_left=-1, window_size_right=-1,
                          deterministic=False, softcap=0.0, num_splits=1):
    return ops.varlen_fwd_op()(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale,
        causal, window_size_left, window_size_right, False, softcap, _kernel_sink(sink), num_splits,
    )


def _varlen_fwd_sink_fake(q, k, v, sink, *rest):
    total_q, heads, _ = q.shape
    return q.new_empty((total_q, heads, v.shape[-1])), q.new_empty((heads, total_q), dtype=torch.float32)


def _varlen_fwd_sink_setup(ctx, inputs, output):
    (q, k, v, sink, cu_q, cu_k, used_q, used_k, max_q, max_k, softmax_scale, causal, window_size_left,
     window_size_right, deterministic, softcap, _) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, sink, out, lse, cu_q, cu_k, used_q, used_k)
    ctx.args = (max_q, max_k, softmax_scale, causal, window_size_left, window_size_right, False,
                bool(deterministic or torch.are_deterministic_algorithms_enabled()), softcap)
    ctx.set_materialize_grads(False)


def _varlen_fwd_sink_backward(ctx, grad_out, grad_lse):
    q, k, v, sink, out, lse, cu_q, cu_k, used_q, used_k = ctx.saved_tensors
    if grad_out is None:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), torch.zeros_like(sink), *(None,) * 13
    if grad_out.stride(-1) != 1:
        grad_out = grad_out.contiguous()
    dq, dk, dv, dsink = ops.varlen_bwd_op()(grad_out, q, k, v, out, lse, cu_q, cu_k, used_q, used_k, *ctx.args,
                                            _kernel_sink(sink))
    return dq, dk, dv, dsink.to(sink.dtype), *(None,) * 13


def register(lib) -> None:
    """Define the two ops in ``lib`` (a ``torch.library.Library`` of flash_attn_hopper)."""
    lib.define(FWD_SINK_SCHEMA)
    lib.impl("fwd_sink", _fwd_sink_impl, "CompositeExplicitAutograd")
    torch.library.register_fake("flash_attn_hopper::fwd_sink", _fwd_sink_fake, lib=lib)
    op_autograd.register_autograd(
        "flash_attn_hopper::fwd_sink", _fwd_sink_backward, setup_context=_fwd_sink_setup, lib=lib
    )
    lib.define(VARLEN_FWD_SINK_SCHEMA)
    lib.impl("varlen_fwd_sink", _varlen_fwd_sink_impl, "CompositeExplicitAutograd")
    torch.library.register_fake("flash_attn_hopper::varlen_fwd_sink", _varlen_fwd_sink_fake, lib=lib)
    op_autograd.register_autograd(
        "flash_attn_hopper::varlen_fwd_sink", _varlen_fwd_sink_backward, setup_context=_varlen_fwd_sink_setup,
        lib=lib,
    )


def kernel_sink(sink, heads_q: int, q):
    """A learnable_sink checked (check_sink) and as the kernels take it, float32 contiguous; None stays None."""
    if sink is None:
        return None
    check_sink(sink, heads_q, q)
    return sink.float().contiguous()


def check_sink(sink, heads_q: int, q) -> None:
    """A clear error for a learnable_sink that is not a (nheads,) float32-or-q.dtype tensor on q's device."""
    if not isinstance(sink, torch.Tensor):
        raise TypeError(f"learnable_sink must be a torch.Tensor of shape ({heads_q},), got {type(sink).__name__}")
    if tuple(sink.shape) != (heads_q,):
        raise ValueError(f"learnable_sink must have shape (nheads,) = ({heads_q},), got {tuple(sink.shape)}")
    if sink.dtype not in (torch.float32, q.dtype):
        raise ValueError(f"learnable_sink must be float32 or q's dtype ({q.dtype}), got {sink.dtype}")
    if sink.device != q.device:
        raise ValueError(f"learnable_sink is on {sink.device}, q on {q.device}: put them on one device")


if ops._PY_LIBRARY is not None:  # the extension loaded: the sink ops join its Python-defined ones
    register(ops._PY_LIBRARY)
