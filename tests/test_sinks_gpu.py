"""Learnable sinks on the GPU: flash_attn_func / flash_attn_varlen_func with learnable_sink against
the float32 reference with the sink as one more softmax column, forward and backward (the sink's
gradient included)."""
from __future__ import annotations

import functools

import pytest
import torch

from flash_attn_hopper import flash_attn_func, flash_attn_varlen_func, ops

from helpers.grads import check_grads
from helpers.inputs import qkv, varlen_qkv
from helpers.kernels import (compiled_config, cuda_kernel_names, is_our_backward_kernel, is_our_forward_kernel,
                             skip_unless_compiled)
from reference import assert_fa_close, attention_ref, attention_ref_varlen

pytestmark = pytest.mark.gpu


def _sink(hq, seed):
    return torch.randn(hq, generator=torch.Generator().manual_seed(seed)).mul(2).cuda()


def _check_sink_grad(got, want):
    assert torch.allclose(got.float(), want, rtol=2e-2, atol=2e-3 * max(1.0, want.abs().max().item())), (got, want)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hq, hk", [(4, 4), (8, 2)])
def test_dense(causal, hq, hk):
    d, dtype = compiled_config("bwd" if ops.has_bwd_op() else "fwd")
    q, k, v = qkv(2, 257, 300, hq, hk, d, dtype=dtype, seed=hq + causal)
    sink = _sink(hq, hq)
    out, lse = flash_attn_func(q, k, v, causal=causal, learnable_sink=sink, return_attn_probs=True)
    ref, lse_ref = attention_ref(q, k, v, causal=causal, sink=sink)
    low, lse_low = attention_ref(q, k, v, causal=causal, sink=sink, upcast=False)
    assert_fa_close(out, ref, low, name="out")
    assert_fa_close(lse, lse_ref, lse_low, name="lse", atol=1e-3)
    if not ops.has_bwd_op():
        return
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    s = sink.clone().requires_grad_()
    o = flash_attn_func(*leaves, causal=causal, learnable_sink=s)
    g = torch.Generator(device=o.device).manual_seed(hq * 10 + hk + causal)  # the same dout whatever ran before
    dout = torch.randn(o.shape, device=o.device, dtype=o.dtype, generator=g)
    *grads, ds = torch.autograd.grad(o, [*leaves, s], dout)
    check_grads(grads, q, k, v, dout, causal=causal, attention=functools.partial(attention_ref, sink=sink))
    f = [t.detach().float().requires_grad_() for t in (q, k, v)]
    sf = sink.clone().requires_grad_()
    (want,) = torch.autograd.grad(attention_ref(*f, causal=causal, sink=sf)[0], sf, dout.float())
    _check_sink_grad(ds, want)


def test_varlen():
    d, dtype = compiled_config("bwd" if ops.has_bwd_op() else "fwd")
    skip_unless_compiled(d, dtype)
    q, k, v, dout, cu_q, cu_k, max_q, max_k = varlen_qkv([130, 0, 1, 77], [200, 5, 64, 0], 4, 2, d, dtype=dtype,
                                                         device="cuda", seed=3)
    sink = _sink(4, 4)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    s = sink.clone().requires_grad_()
    out, lse = flash_attn_varlen_func(*leaves, cu_q, cu_k, max_q, max_k, causal=True, learnable_sink=s,
                                      return_attn_probs=True)
    ref = functools.partial(attention_ref_varlen, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, sink=sink)
    (ro, rl), (lo, ll) = ref(q, k, v, causal=True), ref(q, k, v, causal=True, upcast=False)
    assert_fa_close(out, ro, lo, name="out")
    assert_fa_close(lse, rl, ll, name="lse", atol=1e-3)
    if not ops.has_varlen_bwd_op():
        return
    *grads, ds = torch.autograd.grad(out, [*leaves, s], dout)
    check_grads(grads, q, k, v, dout, causal=True, attention=ref)
    f = [t.detach().float().requires_grad_() for t in (q, k, v)]
    sf = sink.clone().requires_grad_()
    o, _ = attention_ref_varlen(*f, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, sink=sf, causal=True)
    (want,) = torch.autograd.grad(o, sf, dout.float())
    _check_sink_grad(ds, want)


def test_rows_without_keys_and_unused_rows_give_the_sink_as_lse():
    """The kernels' own answer where no key is seen: out 0 and LSE = the sink, for an empty k
    (the binding's early return), bottom-right causal rows, and varlen rows outside seqused_q."""
    d, dtype = compiled_config("fwd")
    sink = _sink(4, 5)
    q, k, v = qkv(2, 40, 0, 4, 2, d, dtype=dtype, seed=1)
    out, lse = flash_attn_func(q, k, v, learnable_sink=sink, return_attn_probs=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(lse, sink.view(1, 4, 1).expand(2, 4, 40))
    q, k, v = qkv(1, 50, 20, 4, 2, d, dtype=dtype, seed=2)  # causal: the first 30 rows see nothing
    out, lse = flash_attn_func(q, k, v, causal=True, learnable_sink=sink, return_attn_probs=True)
    assert torch.equal(out[:, :30], torch.zeros_like(out[:, :30]))
    assert torch.equal(lse[:, :, :30], sink.view(1, 4, 1).expand(1, 4, 30))
    q, k, v, _, cu_q, cu_k, max_q, max_k = varlen_qkv([30, 20], [25, 40], 4, 2, d, dtype=dtype, device="cuda", seed=4)
    used = torch.tensor([10, 20], dtype=torch.int32, device="cuda")
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, seqused_q=used, learnable_sink=sink,
                                      return_attn_probs=True)
    assert torch.equal(out[10:30], torch.zeros_like(out[10:30]))
    assert torch.equal(lse[:, 10:30], sink.view(4, 1).expand(4, 20))
    ref = functools.partial(attention_ref_varlen, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_q=used, sink=sink)
    (ro, _), (lo, _) = ref(q, k, v), ref(q, k, v, upcast=False)
    keep = torch.cat([torch.arange(10), torch.arange(30, 50)]).cuda()
    assert_fa_close(out[keep], ro[keep], lo[keep], name="out")


def test_the_sink_costs_no_extra_pass_over_out():
    """The forward kernel folds the sink in: the call launches our forward kernel and nothing that
    reads out again (no elementwise kernels beside a float32 cast of a bf16 sink)."""
    d, dtype = compiled_config("fwd")
    q, k, v = qkv(2, 512, 512, 4, 2, d, dtype=dtype, seed=6)
    sink = _sink(4, 7)  # float32: no cast
    names = cuda_kernel_names(lambda: flash_attn_func(q, k, v, causal=True, learnable_sink=sink))
    others = [n for n in names if not is_our_forward_kernel(n) and not n.startswith(("Memset", "Memcpy"))]
    assert others == [], names


def test_varlen_gaps_deterministic():
    """The sink's gradient from the kernels' per-row terms with seqused_q / seqused_k shorter than
    the segments (rows between the sequences' padded rows), a 0-length one, GQA, in deterministic
    mode: right, and bitwise equal on a second run."""
    d, dtype = compiled_config("bwd" if ops.has_varlen_bwd_op() else "fwd")
    skip_unless_compiled(d, dtype)
    if not ops.has_varlen_bwd_op():
        pytest.skip("this build has no varlen backward")
    q, k, v, dout, cu_q, cu_k, max_q, max_k = varlen_qkv([200, 3, 0, 129], [150, 40, 9, 300], 6, 2, d,
                                                         dtype=dtype, device="cuda", seed=8)
    used_q = torch.tensor([170, 3, 0, 1], dtype=torch.int32, device="cuda")
    used_k = torch.tensor([150, 17, 9, 256], dtype=torch.int32, device="cuda")
    sink = _sink(6, 9)

    def run():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        s = sink.clone().requires_grad_()
        out = flash_attn_varlen_func(*leaves, cu_q, cu_k, max_q, max_k, seqused_q=used_q, seqused_k=used_k,
                                     causal=True, learnable_sink=s, deterministic=True)
        return torch.autograd.grad(out, [*leaves, s], dout)

    first, second = run(), run()
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    f = [t.detach().float() for t in (q, k, v)]
    sf = sink.clone().requires_grad_()
    o, _ = attention_ref_varlen(*f, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_q=used_q, seqused_k=used_k,
                                sink=sf, causal=True)
    (want,) = torch.autograd.grad(o, sf, dout.float())
    _check_sink_grad(first[3], want)


def test_the_sink_gradient_costs_no_extra_pass_over_dout():
    """The backward's preprocess gives the sink's per-row terms: beside our backward kernels only
    fills and one small reduction run (no elementwise pass over dout and out)."""
    d, dtype = compiled_config("bwd" if ops.has_bwd_op() else "fwd")
    if not ops.has_bwd_op():
        pytest.skip("this build has no backward")
    q, k, v = (t.requires_grad_() for t in qkv(2, 512, 512, 4, 2, d, dtype=dtype, seed=6))
    sink = _sink(4, 7).requires_grad_()
    out = flash_attn_func(q, k, v, causal=True, learnable_sink=sink)
    dout = torch.randn_like(out)
    names = cuda_kernel_names(lambda: torch.autograd.grad(out, [q, k, v, sink], dout, retain_graph=True))
    others = [n for n in names if not is_our_backward_kernel(n) and not n.startswith(("Memset", "Memcpy"))]
    assert len(others) <= 1 and all("reduce" in n.lower() for n in others), names
