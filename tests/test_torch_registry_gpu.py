"""torch's flash-attention registry route on the GPU: after
``activate_flash_attention_impl("flash_attn_hopper")`` SDPA's FLASH backend runs our
kernel (seen in the profiler) and matches torch; calls we do not cover run torch's
FlashAttention-2 unchanged; in a build with the backward kernels autograd runs our
backward too (gradients against the float32 reference by FlashAttention's rule, laid out
as aten's meta kernels promise), otherwise aten's backward differentiates our forward;
direct ``aten::_flash_attention_forward`` / ``_flash_attention_backward`` calls (bottom-right
causal, windows, rows without keys) agree with the kernels they replace; torch.compile
(forward and backward), CUDA graphs; restore brings torch back.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn import attention
from torch.nn.attention import SDPBackend, sdpa_kernel

from flash_attn_hopper import _build_info, manifest, support, torch_registry
from flash_attn_hopper.sdpa import TORCH_SDPA
from flash_attn_hopper.torch_registry import IMPL_NAME

from helpers.grads import assert_grads_close, check_grads, deterministic_algorithms, reference_grads
from helpers.inputs import qkv, sdpa_inputs
from helpers.kernels import (
    compiled_config,
    cuda_kernel_names,
    is_our_backward_kernel,
    is_our_forward_kernel,
    is_torch_flash_kernel,
    skip_unless_compiled,
)
from reference import assert_fa_close, sdpa_ref

pytestmark = pytest.mark.gpu

#: Why activation leaves aten's backward kernels alone in this build (None: it overrides them).
BACKWARD_REFUSAL = torch_registry.backward_override_refusal()

needs_our_backward = pytest.mark.skipif(
    BACKWARD_REFUSAL is not None,
    reason=f"activation overrides only the forward ops in this build: {BACKWARD_REFUSAL}",
)


@pytest.fixture
def activated():
    attention.activate_flash_attention_impl(IMPL_NAME)
    try:
        yield
    finally:
        attention.restore_flash_attention_impl()


def flash_sdpa(*args, **kwargs):
    # torch's own function: through a leaked patch_sdpa() these tests would check our drop-in, not the registry.
    assert F.scaled_dot_product_attention is TORCH_SDPA, "F.scaled_dot_product_attention is not torch's"
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(*args, **kwargs)


@pytest.mark.parametrize("layout", ["bshd_memory", "bhsd_contiguous"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("gqa", [1, 4])
def test_flash_backend_runs_our_kernel_after_activation(activated, layout, causal, gqa):
    e, dtype = compiled_config()
    q, k, v = sdpa_inputs(2, 8, 8 // gqa, 777, 777, e, dtype, seed=gqa, layout=layout)
    call = lambda: flash_sdpa(q, k, v, is_causal=causal, enable_gqa=gqa > 1)  # noqa: E731
    names = cuda_kernel_names(call)
    assert any(map(is_our_forward_kernel, names)), names
    assert not any(map(is_torch_flash_kernel, names)), names
    out = call()
    assert out.shape == q.shape and out.dtype == dtype
    assert out.stride() == torch.empty_like(q).stride(), "not the layout aten's meta kernel promises"
    assert_fa_close(out, sdpa_ref(q, k, v, causal), sdpa_ref(q, k, v, causal, upcast=False))


def test_torch_pads_odd_head_dims_and_we_take_them(activated):
    e = 70  # torch pads to 72 and passes scale = 1/sqrt(70)
    skip_unless_compiled(72, torch.bfloat16)
    q, k, v = sdpa_inputs(2, 4, 4, 300, 300, e, torch.bfloat16, seed=9)
    names = cuda_kernel_names(lambda: flash_sdpa(q, k, v, is_causal=True))
    assert any(map(is_our_forward_kernel, names)), names
    out = flash_sdpa(q, k, v, is_causal=True)
    assert_fa_close(out, sdpa_ref(q, k, v, True), sdpa_ref(q, k, v, True, upcast=False))


def test_without_activation_torch_runs_its_own_kernel():
    e, dtype = compiled_config()
    q, k, v = sdpa_inputs(1, 4, 4, 256, 256, e, dtype)
    assert attention.current_flash_attention_impl() != IMPL_NAME
    names = cuda_kernel_names(lambda: flash_sdpa(q, k, v, is_causal=True))
    assert any(map(is_torch_flash_kernel, names)) and not any(map(is_our_forward_kernel, names)), names


def test_restore_brings_torchs_kernel_back():
    e, dtype = compiled_config()
    q, k, v = sdpa_inputs(1, 4, 4, 256, 256, e, dtype)
    attention.activate_flash_attention_impl(IMPL_NAME)
    try:
        assert any(map(is_our_forward_kernel, cuda_kernel_names(lambda: flash_sdpa(q, k, v))))
    finally:
        attention.restore_flash_attention_impl()
    names = cuda_kernel_names(lambda: flash_sdpa(q, k, v))
    assert any(map(is_torch_flash_kernel, names)) and not any(map(is_our_forward_kernel, names)), names


def test_dropout_falls_back_to_torchs_kernel_bitwise():
    e, dtype = compiled_config()
    q, k, v = sdpa_inputs(2, 4, 4, 300, 300, e, dtype, seed=2)
    torch.manual_seed(11)
    expected = flash_sdpa(q, k, v, dropout_p=0.3)
    attention.activate_flash_attention_impl(IMPL_NAME)
    try:
        torch.manual_seed(11)
        out = flash_sdpa(q, k, v, dropout_p=0.3)
        names = cuda_kernel_names(lambda: flash_sdpa(q, k, v, dropout_p=0.3))
    finally:
        attention.restore_flash_attention_impl()
    assert torch.equal(out, expected)
    assert any(map(is_torch_flash_kernel, names)) and not any(map(is_our_forward_kernel, names)), names


def test_a_configuration_missing_from_the_build_falls_back(activated):
    compiled = _build_info.COMPILED
    missing = [
        (h, d)
        for h in manifest.HEAD_DIMS
        for d in manifest.DTYPES
        if compiled is not None and manifest.Instantiation("fwd", h, d) not in compiled
    ]
    if not missing:
        pytest.skip("this build has every head dim and dtype")
    hdim, dtype_name = missing[0]
    dtype = getattr(torch, manifest.DTYPES[dtype_name].torch_name)
    q, k, v = sdpa_inputs(1, 4, 4, 200, 200, hdim, dtype)
    names = cuda_kernel_names(lambda: flash_sdpa(q, k, v, is_causal=True))
    assert any(map(is_torch_flash_kernel, names)) and not any(map(is_our_forward_kernel, names)), names


def check_sdpa_outputs(out, grads, q, k, v, dout, causal):
    """out and (dq, dk, dv) of SDPA against sdpa_ref and autograd through it, by FlashAttention's rule."""
    with torch.no_grad():
        assert_fa_close(out, sdpa_ref(q, k, v, causal), sdpa_ref(q, k, v, causal, upcast=False))
    check_grads(grads, q, k, v, dout, attention=sdpa_ref, is_causal=causal)


def test_backward_runs_the_builds_backward_on_our_forward(activated):
    # With the backward kernels activation overrides aten's backward ops too; without them aten's
    # FlashAttention-2 backward differentiates our forward (it needs only out and the log-sum-exp).
    e, dtype = compiled_config("bwd" if BACKWARD_REFUSAL is None else "fwd")
    q, k, v = sdpa_inputs(2, 8, 2, 300, 300, e, dtype, seed=4, requires_grad=True)
    dout = torch.randn(2, 8, 300, e, device="cuda", dtype=dtype)

    def forward_backward():
        out = flash_sdpa(q, k, v, is_causal=True, enable_gqa=True)
        return out, torch.autograd.grad(out, (q, k, v), dout)

    names = cuda_kernel_names(forward_backward)
    assert any(map(is_our_forward_kernel, names)), names
    if BACKWARD_REFUSAL is None:
        assert any("flash_bwd_kernel" in n and is_our_backward_kernel(n) for n in names), names
        assert not any(map(is_torch_flash_kernel, names)), names
    else:
        assert any("bwd" in n and is_torch_flash_kernel(n) for n in names), names
        assert not any(map(is_our_backward_kernel, names)), names
    out, grads = forward_backward()
    check_sdpa_outputs(out, grads, q, k, v, dout, True)


SDPA_BACKWARD_CASES = [
    # is_causal, L, S (SDPA's FLASH backend takes is_causal only with L == S)
    (False, 777, 777),
    (True, 777, 777),
    (False, 300, 777),
    (False, 777, 500),
]


@needs_our_backward
@pytest.mark.parametrize("layout", ["bshd_memory", "bhsd_contiguous"])
@pytest.mark.parametrize("causal, seqlen_q, seqlen_k", SDPA_BACKWARD_CASES)
@pytest.mark.parametrize("gqa", [1, 4])
def test_flash_backend_runs_our_backward_after_activation(activated, layout, causal, seqlen_q, seqlen_k, gqa):
    e, dtype = compiled_config("bwd")
    q, k, v = sdpa_inputs(
        2, 8, 8 // gqa, seqlen_q, seqlen_k, e, dtype, seed=gqa + seqlen_k, layout=layout, requires_grad=True
    )
    dout = torch.randn(2, 8, seqlen_q, e, device="cuda", dtype=dtype)

    def forward_backward():
        out = flash_sdpa(q, k, v, is_causal=causal, enable_gqa=gqa > 1)
        out.backward(dout)

    names = cuda_kernel_names(forward_backward)
    assert any(map(is_our_forward_kernel, names)), names
    assert any("flash_bwd_kernel" in n and is_our_backward_kernel(n) for n in names), names
    assert not any(map(is_torch_flash_kernel, names)), names
    # autograd.grad hands back what the backward op returned (.grad may be re-laid out by AccumulateGrad).
    out = flash_sdpa(q, k, v, is_causal=causal, enable_gqa=gqa > 1)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    for name, grad, t in zip(("dq", "dk", "dv"), grads, (q, k, v)):
        assert grad.stride() == torch.empty_like(t).stride(), (
            f"{name}: not the layout aten's meta kernel promises; leaf strides {t.stride()}, backward kernel "
            f"{torch.library.get_kernel('aten::_scaled_dot_product_flash_attention_backward', 'CUDA')!r}"
        )
    check_sdpa_outputs(out, grads, q, k, v, dout, causal)


def test_dropout_backward_runs_torchs_kernels(activated):
    # Refused by the forward and the backward override alike: torch's FlashAttention-2 both ways.
    e, dtype = compiled_config()
    q, k, v = sdpa_inputs(2, 4, 4, 300, 300, e, dtype, seed=3, requires_grad=True)
    dout = torch.randn(2, 4, 300, e, device="cuda", dtype=dtype)

    def forward_backward():
        out = flash_sdpa(q, k, v, dropout_p=0.3)
        out.backward(dout)

    names = cuda_kernel_names(forward_backward)
    assert any("bwd" in n and is_torch_flash_kernel(n) for n in names), names
    assert not any(map(is_our_forward_kernel, names)) and not any(map(is_our_backward_kernel, names)), names
    assert all(t.grad is not None and bool(t.grad.isfinite().all()) for t in (q, k, v))


# --------------------------------------------------------------------------
# aten::_flash_attention_forward called directly: FlashAttention-2's conventions
# --------------------------------------------------------------------------

WINDOWS = [
    # seqlen_q, seqlen_k, is_causal, window_size_left, window_size_right
    (300, 200, True, None, None),  # bottom-right: the first 100 rows see no key
    (200, 300, True, None, None),
    (256, 256, False, None, None),
    (128, 256, False, 32, 8),
    (256, 128, True, 24, None),
    (300, 100, False, 16, None),  # FA2 bounds the right side at seqlen_k: rows without keys
    (77, 77, False, -5, 300),  # negative and too-large sizes are unbounded
    (1, 200, True, None, None),
]


@pytest.mark.parametrize("s_q, s_k, causal, left, right", WINDOWS)
def test_direct_flash_attention_forward_matches_the_kernel_it_replaces(s_q, s_k, causal, left, right):
    e, dtype = compiled_config()
    q, k, v = qkv(2, s_q, s_k, 6, 2, e, dtype=dtype, seed=s_q + s_k)
    windows = dict(window_size_left=left, window_size_right=right)

    def call():
        return torch.ops.aten._flash_attention_forward(q, k, v, None, None, s_q, s_k, 0.0, causal, False, **windows)

    out_torch, lse_torch, *_ = call()
    attention.activate_flash_attention_impl(IMPL_NAME)
    try:
        names = cuda_kernel_names(call)
        out, lse, rng_state, unused, debug_mask = call()
    finally:
        attention.restore_flash_attention_impl()
    assert any(map(is_our_forward_kernel, names)), names
    assert out.shape == out_torch.shape and out.stride() == out_torch.stride() and out.dtype == out_torch.dtype
    assert lse.shape == lse_torch.shape and lse.dtype == torch.float32
    assert rng_state.shape == (2,) and unused.shape == () and debug_mask.numel() == 0
    # Two fp32-accumulating kernels of the same maths: within a couple of output ulps.
    torch.testing.assert_close(out.float(), out_torch.float(), atol=2e-2, rtol=0)
    # Same infinities (FA2: +inf for rows without keys), finite values close.
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_torch)) and torch.equal(lse[lse.isinf()], lse_torch[lse_torch.isinf()])
    torch.testing.assert_close(lse, lse_torch, atol=1e-3, rtol=1e-4)


@needs_our_backward
@pytest.mark.parametrize("s_q, s_k, causal, left, right", WINDOWS)
def test_direct_flash_attention_backward_matches_the_kernel_it_replaces(s_q, s_k, causal, left, right):
    e, dtype = compiled_config("bwd")
    q, k, v, dout = qkv(2, s_q, s_k, 6, 2, e, dtype=dtype, seed=s_q * s_k, dout=True)
    windows = dict(window_size_left=left, window_size_right=right)

    def forward():
        return torch.ops.aten._flash_attention_forward(q, k, v, None, None, s_q, s_k, 0.0, causal, False, **windows)

    def backward(out, lse, rng_state, unused):
        # cum_seq_q / cum_seq_k: None is the undefined tensor aten's dense calls pass.
        return torch.ops.aten._flash_attention_backward(
            dout, q, k, v, out, lse, None, None, s_q, s_k, 0.0, causal, rng_state, unused, **windows
        )

    out_torch, lse_torch, rng_torch, unused_torch, _ = forward()
    grads_torch = backward(out_torch, lse_torch, rng_torch, unused_torch)
    attention.activate_flash_attention_impl(IMPL_NAME)
    try:
        names = cuda_kernel_names(lambda: backward(*forward()[:4]))
        out, lse, rng_state, unused, _ = forward()
        grads = backward(out, lse, rng_state, unused)
        # Our backward on torch's forward: the same conventions (lse +inf for rows without keys).
        grads_on_torchs_forward = backward(out_torch, lse_torch, rng_torch, unused_torch)
    finally:
        attention.restore_flash_attention_impl()
    assert any(map(is_our_forward_kernel, names)), names
    assert any("flash_bwd_kernel" in n and is_our_backward_kernel(n) for n in names), names
    assert not any(map(is_torch_flash_kernel, names)), names
    # The reference applies the window FlashAttention-2 applies (what the forward test above checks).
    window = support.fa2_window(left, right, causal, s_k)
    ref = reference_grads(q, k, v, dout, causal=causal, window_size=window)
    low = reference_grads(q, k, v, dout, causal=causal, window_size=window, upcast=False)
    assert_grads_close(grads, ref, low, like=(q, k, v))
    assert_grads_close(grads_on_torchs_forward, ref, low, like=(q, k, v), what="on torch's forward")
    for name, ours, theirs in zip(("dq", "dk", "dv"), grads, grads_torch):
        assert ours.stride() == theirs.stride(), name
        # And no gross difference from the kernel replaced (a wrong mask or scale is far above 5%).
        bound = 0.05 * float(theirs.float().abs().max()) + 1e-3
        assert float((ours.float() - theirs.float()).abs().max()) <= bound, name


def test_inplace_forward_writes_the_given_buffer(activated):
    if not hasattr(torch.ops.aten, "_flash_attention_forward_no_dropout_inplace"):
        pytest.skip(f"torch {torch.__version__} has no aten::_flash_attention_forward_no_dropout_inplace")
    e, dtype = compiled_config()
    q = torch.randn(2, 200, 4, e, device="cuda", dtype=dtype)
    k = torch.randn(2, 300, 4, e, device="cuda", dtype=dtype)
    out = torch.full_like(q, float("nan"))
    lse = torch.ops.aten._flash_attention_forward_no_dropout_inplace(out, q, k, k, None, None, 200, 300, 0.0, True, False)
    expected, expected_lse, *_ = torch.ops.aten._flash_attention_forward(q, k, k, None, None, 200, 300, 0.0, True, False)
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)


# --------------------------------------------------------------------------
# Compiler and graphs with the registry active
# --------------------------------------------------------------------------


class Block(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q * 2, k, v, is_causal=True, enable_gqa=True) * 2


@pytest.mark.parametrize("layout", ["bshd_memory", "bhsd_contiguous"])
def test_inductor_runs_our_kernel_and_matches_eager(activated, layout):
    # Inductor checks the strides of what aten ops return against their meta kernels.
    e, dtype = compiled_config()
    q, k, v = sdpa_inputs(2, 8, 2, 384, 384, e, dtype, seed=6, layout=layout)
    torch._dynamo.reset()
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        compiled = torch.compile(Block(), fullgraph=True)
        out = compiled(q, k, v)
        names = cuda_kernel_names(lambda: compiled(q, k, v))
        eager = Block()(q, k, v)
    torch._dynamo.reset()
    assert any(map(is_our_forward_kernel, names)), names
    assert torch.equal(out, eager)


@needs_our_backward
@pytest.mark.parametrize("layout", ["bshd_memory", "bhsd_contiguous"])
def test_inductor_runs_our_backward_and_matches_eager(activated, layout):
    # Inductor checks the gradients' strides against the backward ops' meta kernels.
    # Deterministic mode (warn_only: nothing else must raise) makes our dQ bitwise reproducible.
    e, dtype = compiled_config("bwd")
    q, k, v = sdpa_inputs(2, 8, 2, 384, 384, e, dtype, seed=6, layout=layout, requires_grad=True)
    dout = torch.randn(2, 8, 384, e, device="cuda", dtype=dtype)

    def forward_backward(model):
        out = model(q, k, v)
        return out, torch.autograd.grad(out, (q, k, v), dout)

    torch._dynamo.reset()
    try:
        with deterministic_algorithms(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            compiled = torch.compile(Block(), fullgraph=True)
            out, grads = forward_backward(compiled)
            names = cuda_kernel_names(lambda: forward_backward(compiled))
            eager_out, eager_grads = forward_backward(Block())
    finally:
        torch._dynamo.reset()
    assert any(map(is_our_forward_kernel, names)), names
    assert any("flash_bwd_kernel" in n and is_our_backward_kernel(n) for n in names), names
    assert torch.equal(out, eager_out)
    for name, got, want in zip(("dq", "dk", "dv"), grads, eager_grads):
        assert torch.equal(got, want), name


def test_cuda_graph_capture_and_replay(activated):
    e, dtype = compiled_config()
    q, k, v = sdpa_inputs(2, 8, 2, 512, 512, e, dtype, seed=7)
    before = flash_sdpa(q, k, v, is_causal=True, enable_gqa=True)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        flash_sdpa(q, k, v, is_causal=True, enable_gqa=True)  # warm-up outside the capture
        with torch.cuda.graph(graph, stream=stream):
            captured = flash_sdpa(q, k, v, is_causal=True, enable_gqa=True)
    torch.cuda.current_stream().wait_stream(stream)
    for t, new in zip((q, k, v), sdpa_inputs(2, 8, 2, 512, 512, e, dtype, seed=8)):
        t.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, flash_sdpa(q, k, v, is_causal=True, enable_gqa=True))
    assert not torch.equal(captured, before)


def test_activation_records_what_it_replaced(activated):
    from torch.nn.attention import _registry

    impl, handle = _registry._FLASH_ATTENTION_ACTIVE
    assert impl == IMPL_NAME and isinstance(handle, torch_registry.Activation)
    assert "_scaled_dot_product_flash_attention" in handle.op_names
    assert handle.backward_refusal == BACKWARD_REFUSAL
    backward = {"_scaled_dot_product_flash_attention_backward", "_flash_attention_backward"}
    assert backward <= set(handle.op_names) if BACKWARD_REFUSAL is None else not backward & set(handle.op_names)
