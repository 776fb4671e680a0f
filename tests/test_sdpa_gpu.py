"""The SDPA drop-in on the GPU: torch's semantics from our kernel (L != S causal both
ways, GQA, scale, head dims, layouts) by FlashAttention's tolerance rule, every fallback
bitwise equal to torch, torch.compile(fullgraph=True) with and without patch_sdpa,
torch.export, CUDA-graph capture and replay (forward, and forward + backward), and opcheck of
the op as SDPA calls it.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import flash_attn_hopper
from flash_attn_hopper import sdpa

from helpers.grads import check_grads, deterministic_algorithms
from helpers.inputs import sdpa_inputs
from helpers.kernels import compiled_config, cuda_kernel_names, is_our_forward_kernel, skip_unless_compiled
from reference import assert_fa_close, sdpa_ref

pytestmark = pytest.mark.gpu


def check_against_torch_semantics(out, q, k, v, is_causal, scale):
    ref = sdpa_ref(q, k, v, is_causal, scale)
    # The restated reference is torch's semantics: check it against torch itself first.
    torch.testing.assert_close(
        ref,
        sdpa.TORCH_SDPA(q.float(), k.float(), v.float(), is_causal=is_causal, scale=scale, enable_gqa=True),
        atol=2e-5,
        rtol=2e-5,
    )
    assert out.shape == ref.shape and out.dtype == q.dtype
    assert_fa_close(out, ref, sdpa_ref(q, k, v, is_causal, scale, upcast=False))


MATRIX = [
    # b, hq, hk, sq, sk, causal, scale
    (2, 8, 8, 512, 512, False, None),
    (2, 8, 8, 512, 512, True, None),
    (1, 6, 2, 113, 203, True, None),  # top-left causal, L < S
    (1, 6, 2, 203, 113, True, None),  # top-left causal, L > S
    (2, 4, 4, 3, 799, True, None),
    (2, 4, 4, 799, 3, True, None),
    (2, 16, 2, 1, 300, True, None),  # one query, top-left: it sees key 0 only
    (2, 4, 1, 256, 384, False, 0.3),  # MQA, custom scale
    (1, 6, 3, 1000, 1000, True, 0.05),
]


@pytest.mark.parametrize("b, hq, hk, sq, sk, causal, scale", MATRIX)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_drop_in_matches_torch(dtype, b, hq, hk, sq, sk, causal, scale):
    e, _ = compiled_config()
    skip_unless_compiled(e, dtype)
    q, k, v = sdpa_inputs(b, hq, hk, sq, sk, e, dtype, seed=sq * 7 + sk)
    enable_gqa = hq != hk
    assert sdpa.sdpa_fallback_reason(q, k, v, is_causal=causal, scale=scale, enable_gqa=enable_gqa) is None
    out = flash_attn_hopper.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=enable_gqa)
    check_against_torch_semantics(out, q, k, v, causal, scale)


@pytest.mark.parametrize("e", [64, 72, 96, 128, 136, 192, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims(e, causal):
    skip_unless_compiled(e, torch.bfloat16)
    q, k, v = sdpa_inputs(2, 4, 2, 177, 233, e, torch.bfloat16, seed=e)
    out = flash_attn_hopper.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    check_against_torch_semantics(out, q, k, v, causal, None)


@pytest.mark.parametrize("e, ev", [(192, 128), (176, 96)])
@pytest.mark.parametrize("causal", [False, True])
def test_value_head_dims_of_their_own_take_the_fast_path(e, ev, causal):
    skip_unless_compiled(e, torch.bfloat16)
    q, k, v = sdpa_inputs(2, 4, 2, 177, 233, e, torch.bfloat16, seed=e + ev)
    v = v[..., :ev]
    assert sdpa.sdpa_fallback_reason(q, k, v, is_causal=causal, enable_gqa=True) is None
    out = flash_attn_hopper.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    check_against_torch_semantics(out, q, k, v, causal, None)


@pytest.mark.parametrize("layout", ["bshd_memory", "bhsd_contiguous", "packed_qkv"])
def test_layouts_are_not_copied(layout):
    e, dtype = compiled_config()
    q, k, v = sdpa_inputs(2, 4, 4, 300, 300, e, dtype, layout="packed" if layout == "packed_qkv" else layout)
    out = flash_attn_hopper.scaled_dot_product_attention(q, k, v, is_causal=True)
    check_against_torch_semantics(out, q, k, v, True, None)
    names = cuda_kernel_names(lambda: flash_attn_hopper.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert sum(map(is_our_forward_kernel, names)) == 1, names
    # Any strides that are multiples of 16 bytes go to TMA as they are: no copy kernels.
    assert not any("copy" in n.lower() or "elementwise" in n.lower() for n in names), names


def test_profiler_shows_our_kernel_and_not_torchs():
    e, dtype = compiled_config()
    q, k, v = sdpa_inputs(2, 8, 2, 1024, 1024, e, dtype)
    names = cuda_kernel_names(lambda: flash_attn_hopper.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    assert any(map(is_our_forward_kernel, names)), names
    assert not any("pytorch_flash" in n or "fmha" in n or "cudnn" in n for n in names), names


# --------------------------------------------------------------------------
# Fallbacks: torch's function, unchanged
# --------------------------------------------------------------------------


def _fallback_case(name):
    e, dtype = compiled_config()
    q, k, v = sdpa_inputs(2, 8, 2, 200, 300, e, dtype, seed=11)
    mask = torch.rand(200, 300, device="cuda") > 0.3
    cases = {
        "attn_mask": ((q, k, v), dict(attn_mask=mask, enable_gqa=True), "attn_mask"),
        "dropout": ((q, k, v), dict(dropout_p=0.2, enable_gqa=True), "dropout"),
        "float32": ((q.float(), k.float(), v.float()), dict(is_causal=True, enable_gqa=True), "float32"),
        "head_dim_36": (sdpa_inputs(2, 4, 4, 100, 100, 36, dtype), dict(is_causal=True), "head dim 36"),
        "head_dim_264": (sdpa_inputs(2, 4, 4, 100, 100, 264, dtype), dict(), "head dim 264"),
        # v wider than q: no kernels of their own (those take only a narrower v, manifest.VALUE_HEAD_DIMS)
        "value_head_dim_differs": ((q, k, torch.cat([v, v[..., :8]], -1)), dict(enable_gqa=True), "value's head dim"),
        "three_dims": ((q[0], k[0], v[0]), dict(enable_gqa=True), "4 dimensions"),
        "mqa_broadcast_without_enable_gqa": ((q, k[:, :1], v[:, :1]), dict(), "enable_gqa"),
        "cpu": ((q.cpu(), k.cpu(), v.cpu()), dict(is_causal=True, enable_gqa=True), "cpu"),
        "grad": (
            tuple(t.detach().requires_grad_() for t in (q, k, v)),
            dict(is_causal=True, enable_gqa=True),
            "requires grad",
        ),
    }
    return cases[name]


FALLBACKS = [
    "attn_mask",
    "dropout",
    "float32",
    "head_dim_36",
    "head_dim_264",
    "value_head_dim_differs",
    "three_dims",
    "mqa_broadcast_without_enable_gqa",
    "cpu",
    "grad",
]


@pytest.mark.parametrize("name", FALLBACKS)
def test_fallbacks_are_torch_bitwise(name):
    args, kwargs, word = _fallback_case(name)
    if name == "grad" and sdpa.BACKWARD_READY:
        pytest.skip("the backward kernel exists: inputs that require grad take the fast path")
    reason = sdpa.sdpa_fallback_reason(*args, **kwargs)
    assert reason is not None and word in reason, reason
    try:
        torch.manual_seed(5)
        expected = sdpa.TORCH_SDPA(*args, **kwargs)
    except RuntimeError as err:
        with pytest.raises(RuntimeError, match=re.escape(str(err).splitlines()[0])):
            flash_attn_hopper.scaled_dot_product_attention(*args, **kwargs)
        return
    torch.manual_seed(5)
    out = flash_attn_hopper.scaled_dot_product_attention(*args, **kwargs)
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)
    if name == "grad":
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, args, dout)
        expected_grads = torch.autograd.grad(expected, args, dout)
        for got, want in zip(grads, expected_grads):
            # The same torch kernels, but FlashAttention-2 accumulates dq with atomics.
            torch.testing.assert_close(got, want, atol=1e-3, rtol=2e-2)


def test_a_head_dim_missing_from_the_build_falls_back():
    from flash_attn_hopper import _build_info, manifest

    compiled = _build_info.COMPILED
    missing = [h for h in manifest.HEAD_DIMS if compiled is not None and manifest.Instantiation("fwd", h, "bf16") not in compiled]
    if not missing:
        pytest.skip("this build has every head dim in bf16")
    q, k, v = sdpa_inputs(1, 2, 2, 64, 64, missing[0], torch.bfloat16)
    reason = sdpa.sdpa_fallback_reason(q, k, v)
    assert reason is not None and manifest.ENV_HDIMS in reason
    assert torch.equal(flash_attn_hopper.scaled_dot_product_attention(q, k, v), sdpa.TORCH_SDPA(q, k, v))


# --------------------------------------------------------------------------
# Compiler, export, graphs, opcheck
# --------------------------------------------------------------------------


class Block(torch.nn.Module):
    """Attention between two exactly-rounded elementwise ops (so compiled == eager bitwise)."""

    def __init__(self, causal=True, through_functional=False):
        super().__init__()
        self.causal = causal
        self.through_functional = through_functional

    def forward(self, q, k, v):
        attend = F.scaled_dot_product_attention if self.through_functional else flash_attn_hopper.scaled_dot_product_attention
        return attend(q * 2, k, v, is_causal=self.causal, enable_gqa=True) * 2


@pytest.mark.parametrize("causal", [False, True])
def test_compile_fullgraph_matches_eager(causal):
    e, dtype = compiled_config()
    q, k, v = sdpa_inputs(2, 8, 2, 300, 400, e, dtype, seed=3)
    torch._dynamo.reset()
    compiled = torch.compile(Block(causal), fullgraph=True)
    eager = Block(causal)(q, k, v)
    assert torch.equal(compiled(q, k, v), eager)
    names = cuda_kernel_names(lambda: compiled(q, k, v))
    assert any(map(is_our_forward_kernel, names)), names


def test_compile_fullgraph_of_code_calling_torch_sdpa_under_patch_sdpa():
    e, dtype = compiled_config()
    q, k, v = sdpa_inputs(2, 8, 2, 256, 256, e, dtype, seed=4)
    torch._dynamo.reset()
    with flash_attn_hopper.patch_sdpa():
        compiled = torch.compile(Block(True, through_functional=True), fullgraph=True)
        out = compiled(q, k, v)
        names = cuda_kernel_names(lambda: compiled(q, k, v))
    torch._dynamo.reset()
    assert torch.equal(out, Block(True)(q, k, v))
    assert any(map(is_our_forward_kernel, names)), names


def test_export_has_the_op_and_runs():
    e, dtype = compiled_config()
    q, k, v = sdpa_inputs(2, 8, 2, 128, 192, e, dtype, seed=5)
    exported = torch.export.export(Block(True), (q, k, v))
    targets = {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}
    assert "flash_attn_hopper.fwd.default" in targets, targets
    assert torch.equal(exported.module()(q, k, v), Block(True)(q, k, v))


def test_cuda_graph_capture_and_replay():
    e, dtype = compiled_config()
    q, k, v = sdpa_inputs(2, 8, 2, 512, 512, e, dtype, seed=6)
    before = flash_attn_hopper.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        flash_attn_hopper.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # warm-up
        with torch.cuda.graph(graph, stream=stream):
            captured = flash_attn_hopper.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.cuda.current_stream().wait_stream(stream)
    new_q, new_k, new_v = sdpa_inputs(2, 8, 2, 512, 512, e, dtype, seed=7)
    for t, new in ((q, new_q), (k, new_k), (v, new_v)):
        t.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    expected = flash_attn_hopper.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.equal(captured, expected)
    assert not torch.equal(captured, before)


needs_backward = pytest.mark.skipif(
    not sdpa.BACKWARD_READY, reason="this build has no backward kernels: inputs that require grad go to torch"
)


def block_ref(q, k, v, causal, upcast):
    """Block's maths, 2 * sdpa(2 q, k, v), through the reference."""
    return sdpa_ref(q * 2, k, v, causal, None, upcast=upcast) * 2


@needs_backward
@pytest.mark.parametrize("causal", [False, True])
def test_compile_fullgraph_forward_and_backward_matches_eager(causal):
    e, dtype = compiled_config()
    q, k, v = sdpa_inputs(2, 8, 2, 300, 400, e, dtype, seed=13, requires_grad=True)
    dout = torch.randn(2, 8, 300, e, device="cuda", dtype=dtype)
    block = Block(causal)
    with deterministic_algorithms():
        torch._dynamo.reset()
        compiled = torch.compile(block, fullgraph=True)
        out = compiled(q, k, v)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        names = cuda_kernel_names(lambda: torch.autograd.grad(compiled(q, k, v), (q, k, v), dout))
        torch._dynamo.reset()
        eager_out = block(q, k, v)
        eager_grads = torch.autograd.grad(eager_out, (q, k, v), dout)
    assert any(map(is_our_forward_kernel, names)), names
    assert any("flash_bwd_kernel" in n for n in names), names
    assert torch.equal(out, eager_out)
    for name, got, want in zip(("dq", "dk", "dv"), grads, eager_grads):
        assert torch.equal(got, want), name
    # And the gradients are right: FlashAttention's rule against the float32 reference.
    check_grads(grads, q, k, v, dout, attention=block_ref, causal=causal)


@needs_backward
def test_cuda_graph_capture_and_replay_of_forward_and_backward():
    e, dtype = compiled_config()
    q, k, v = sdpa_inputs(2, 8, 2, 512, 512, e, dtype, seed=14, requires_grad=True)
    dout = torch.randn(2, 8, 512, e, device="cuda", dtype=dtype)

    def step():
        out = flash_attn_hopper.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        # Detached, so that no autograd graph (and no AccumulateGrad node of q, k, v tied to the
        # stream it was made on) outlives the step: the capture below must not sync with it.
        return (out.detach(), *grads)

    with deterministic_algorithms():
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        # Every step runs on the side stream, as torch's whole-network capture recipe does.
        with torch.cuda.stream(stream):
            before = [t.clone() for t in step()]
            step()  # warm-up outside the capture
            with torch.cuda.graph(graph, stream=stream):
                captured = step()
        torch.cuda.current_stream().wait_stream(stream)
        new = sdpa_inputs(2, 8, 2, 512, 512, e, dtype, seed=15)
        with torch.no_grad():
            for t, fresh in zip((q, k, v), new):
                t.copy_(fresh)
            dout.copy_(torch.randn_like(dout))
        graph.replay()
        torch.cuda.synchronize()
        expected = step()
    names = ("out", "dq", "dk", "dv")
    for name, got, want, old in zip(names, captured, expected, before):
        assert torch.equal(got, want), name
        assert not torch.equal(got, old), f"{name}: the replay did not recompute"


@pytest.mark.parametrize("sq, sk", [(100, 100), (77, 130), (130, 77)])
def test_opcheck_as_sdpa_calls_the_op(sq, sk):
    e, dtype = compiled_config()
    q, k, v = (t.transpose(1, 2) for t in sdpa_inputs(2, 4, 2, sq, sk, e, dtype, seed=8))
    torch.library.opcheck(torch.ops.flash_attn_hopper.fwd.default, (q, k, v, e**-0.5, True, -1, -1, True))
