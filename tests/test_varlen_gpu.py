"""Variable-length attention on the GPU (issue 40): flash_attn_varlen_func's forward and backward
against the per-sequence float32 reference by FlashAttention's rule,

    |kernel - ref|.max() <= 2 * |pytorch_lowprec - ref|.max() + rounding noise,

over random lengths including 0 and 1, all-equal lengths, one long sequence among short ones,
seqused shorter than the segments, GQA ratios, causal and windows, both dtypes and the built head
dims; outputs and gradients land in NaN-poisoned memory, so a row the kernels forget shows up.
Then determinism (repeats bitwise equal), non-contiguous heads, malformed sequence contents
(clamped, never out of bounds), torch.compile / CUDA-graph capture, torch's varlen_attn through
the registry, and a tiny Llama trained 50 steps against transformers' "sdpa".

Needs the compiled extension with the varlen ops and a Hopper GPU; skipped with the reason otherwise.
"""

from __future__ import annotations

import copy
import functools
import zlib

import pytest
import torch

from flash_attn_hopper import flash_attn_func, flash_attn_varlen_func, ops
from flash_attn_hopper.integrations import transformers as fah_transformers

from helpers.cases import DTYPE_IDS, DTYPES, HDIMS
from helpers.grads import check_grads
from helpers.inputs import poison_allocations, varlen_qkv
from helpers.varlen import varlen_attn_options
from helpers.kernels import (
    compiled_config,
    cuda_kernel_names,
    is_our_backward_kernel,
    is_our_forward_kernel,
    is_torch_flash_kernel,
    skip_unless_compiled,
)
from reference import assert_fa_close, attention_ref_varlen

pytestmark = pytest.mark.gpu

LSE_ATOL = 1e-4


def seed_of(*parts) -> int:
    """A seed that is the same in every process (Python's str hashing is salted per process)."""
    return zlib.crc32(repr(parts).encode())


@pytest.fixture(autouse=True)
def needs_varlen_ops():
    if not ops.has_varlen_fwd_op():
        pytest.skip(ops.varlen_unavailable_message())


def needs_varlen_bwd():
    if not ops.has_varlen_bwd_op():
        pytest.skip(ops.varlen_backward_unavailable_message())


def reference(cu_q, cu_k, seqused_q=None, seqused_k=None):
    return functools.partial(attention_ref_varlen, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                             seqused_q=seqused_q, seqused_k=seqused_k)


def run_forward(q, k, v, cu_q, cu_k, max_q, max_k, seqused_q=None, seqused_k=None, **kwargs):
    """flash_attn_varlen_func into poisoned memory, checked against the reference; returns (out, lse)."""
    poison_allocations((tuple(q.shape), q.dtype), ((q.size(1), q.size(0)), torch.float32))
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, seqused_q=seqused_q, seqused_k=seqused_k,
                                      return_attn_probs=True, **kwargs)
    ref = reference(cu_q, cu_k, seqused_q, seqused_k)
    ref_kwargs = {key: kwargs[key] for key in ("causal", "window_size", "softmax_scale") if key in kwargs}
    ref_out, ref_lse = ref(q, k, v, **ref_kwargs)
    low_out, low_lse = ref(q, k, v, upcast=False, **ref_kwargs)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    assert lse.shape == (q.size(1), q.size(0)) and lse.dtype == torch.float32
    assert_fa_close(out, ref_out, low_out, name="out")
    assert_fa_close(lse, ref_lse, low_lse, name="lse", atol=LSE_ATOL)
    return out, lse


def run_backward(q, k, v, dout, cu_q, cu_k, max_q, max_k, seqused_q=None, seqused_k=None, **kwargs):
    """Gradients of flash_attn_varlen_func into poisoned memory, checked against the reference; returns them."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = flash_attn_varlen_func(*leaves, cu_q, cu_k, max_q, max_k, seqused_q=seqused_q, seqused_k=seqused_k,
                                 **kwargs)
    poison_allocations(*((tuple(t.shape), t.dtype) for t in (q, k, v)))
    grads = torch.autograd.grad(out, leaves, dout)
    ref_kwargs = {key: kwargs[key] for key in ("causal", "window_size", "softmax_scale") if key in kwargs}
    check_grads(grads, q, k, v, dout, attention=reference(cu_q, cu_k, seqused_q, seqused_k), **ref_kwargs)
    return grads


# --------------------------------------------------------------------------
# The sweep
# --------------------------------------------------------------------------

LENGTHS = {
    # id: (lens_q, lens_k)
    "random_with_0_and_1": ([117, 0, 1, 300, 64, 1, 255], None),
    "all_equal": ([256] * 4, None),
    "one_long_among_short": ([3, 1, 2049, 7, 1, 130], None),
    "q_and_k_differ": ([1, 300, 0, 77, 129], [239, 17, 64, 0, 500]),  # rows without keys; empty key sets
}


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("hdim", HDIMS)
@pytest.mark.parametrize("gqa", [1, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths", list(LENGTHS))
def test_forward(lengths, causal, gqa, hdim, dtype):
    skip_unless_compiled(hdim, dtype)
    lens_q, lens_k = LENGTHS[lengths]
    batch = varlen_qkv(lens_q, lens_k, 8, 8 // gqa, hdim, dtype=dtype, seed=seed_of(lengths, causal, gqa, hdim))
    q, k, v, _, cu_q, cu_k, max_q, max_k = batch
    run_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("hdim", HDIMS)
@pytest.mark.parametrize("gqa", [1, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths", list(LENGTHS))
def test_backward(lengths, causal, gqa, hdim, dtype):
    needs_varlen_bwd()
    skip_unless_compiled(hdim, dtype, ("fwd", "bwd"))
    lens_q, lens_k = LENGTHS[lengths]
    seed = seed_of(lengths, causal, gqa, hdim, "bwd")
    q, k, v, dout, cu_q, cu_k, max_q, max_k = varlen_qkv(lens_q, lens_k, 8, 8 // gqa, hdim, dtype=dtype, seed=seed)
    run_backward(q, k, v, dout, cu_q, cu_k, max_q, max_k, causal=causal)


@pytest.mark.parametrize("window", [(0, 0), (17, 5), (64, -1), (-1, 33), (100, 0)])
@pytest.mark.parametrize("causal", [False, True])
def test_windows_forward_and_backward(window, causal):
    hdim, dtype = compiled_config("bwd" if ops.has_varlen_bwd_op() else "fwd")
    q, k, v, dout, cu_q, cu_k, max_q, max_k = varlen_qkv([113, 1, 799, 0, 256], [203, 239, 3, 5, 256], 4, 2, hdim,
                                                         dtype=dtype, seed=seed_of(window))
    run_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, window_size=window)
    if ops.has_varlen_bwd_op():
        run_backward(q, k, v, dout, cu_q, cu_k, max_q, max_k, causal=causal, window_size=window)


@pytest.mark.parametrize("gqa", [1, 2, 8])
def test_gqa_ratios_with_a_custom_scale(gqa):
    hdim, dtype = compiled_config("bwd" if ops.has_varlen_bwd_op() else "fwd")
    q, k, v, dout, cu_q, cu_k, max_q, max_k = varlen_qkv([37, 200, 1, 90], None, 8, 8 // gqa, hdim, dtype=dtype,
                                                         seed=gqa)
    run_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal=True, softmax_scale=0.3)
    if ops.has_varlen_bwd_op():
        run_backward(q, k, v, dout, cu_q, cu_k, max_q, max_k, causal=True, softmax_scale=0.3)


@pytest.mark.parametrize("causal", [False, True])
def test_seqused_shorter_than_segments(causal):
    hdim, dtype = compiled_config("bwd" if ops.has_varlen_bwd_op() else "fwd")
    segments_q, segments_k = [300, 64, 129, 0, 17], [256, 64, 400, 9, 17]
    q, k, v, dout, cu_q, cu_k, _, _ = varlen_qkv(segments_q, segments_k, 8, 2, hdim, dtype=dtype, seed=11)
    used_q = torch.tensor([200, 0, 129, 0, 1], dtype=torch.int32, device="cuda")
    used_k = torch.tensor([256, 10, 1, 0, 17], dtype=torch.int32, device="cuda")
    out, lse = run_forward(q, k, v, cu_q, cu_k, 300, 400, used_q, used_k, causal=causal)
    unused_q = torch.ones(q.size(0), dtype=torch.bool, device="cuda")
    for start, n in zip(cu_q.tolist(), used_q.tolist()):
        unused_q[start : start + n] = False
    assert torch.equal(out[unused_q], torch.zeros_like(out[unused_q]))  # written, not left poisoned
    assert torch.isneginf(lse[:, unused_q]).all()
    if ops.has_varlen_bwd_op():
        grads = run_backward(q, k, v, dout, cu_q, cu_k, 300, 400, used_q, used_k, causal=causal)
        unused_k = torch.ones(k.size(0), dtype=torch.bool, device="cuda")
        for start, n in zip(cu_k.tolist(), used_k.tolist()):
            unused_k[start : start + n] = False
        assert not grads[0][unused_q].any() and not grads[1][unused_k].any() and not grads[2][unused_k].any()


def test_decoding_shaped_batch_with_seqused_k():
    # vLLM's call: one query per sequence over a KV cache filled up to seqused_k.
    hdim, dtype = compiled_config()
    q, k, v, _, cu_q, cu_k, _, _ = varlen_qkv([1] * 16, [1024] * 16, 32, 8, hdim, dtype=dtype, seed=12)
    used_k = torch.randint(0, 1025, (16,), generator=torch.Generator().manual_seed(0)).to(torch.int32).cuda()
    run_forward(q, k, v, cu_q, cu_k, 1, 1024, None, used_k, causal=True)


@pytest.mark.parametrize("layout", ["every_other_head", "row_gap", "packed"])
def test_non_contiguous_inputs(layout):
    hdim, dtype = compiled_config("bwd" if ops.has_varlen_bwd_op() else "fwd")
    q, k, v, dout, cu_q, cu_k, max_q, max_k = varlen_qkv([70, 1, 300, 0, 129], None, 4, 2, hdim, dtype=dtype,
                                                         seed=13, layout=layout)
    assert not q.is_contiguous()
    run_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
    if ops.has_varlen_bwd_op():
        run_backward(q, k, v, dout.transpose(0, 1).contiguous().transpose(0, 1), cu_q, cu_k, max_q, max_k,
                     causal=True)


def test_equal_lengths_agree_with_the_dense_kernel():
    hdim, dtype = compiled_config()
    q, k, v, _, cu_q, cu_k, max_q, max_k = varlen_qkv([512] * 4, None, 8, 2, hdim, dtype=dtype, seed=14)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
    dense = flash_attn_func(*(t.view(4, 512, t.size(1), t.size(2)) for t in (q, k, v)), causal=True)
    # Same tiles, same maths: at most a rounding step apart (the reference checks are the sweep's).
    torch.testing.assert_close(out.view(4, 512, 8, hdim), dense, atol=1e-2, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_repeats_are_bitwise_identical(causal):
    needs_varlen_bwd()
    hdim, dtype = compiled_config("bwd")
    q, k, v, dout, cu_q, cu_k, max_q, max_k = varlen_qkv([700, 1, 2049, 33, 0, 512], None, 8, 2, hdim, dtype=dtype,
                                                         seed=15)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]

    def grads():
        out = flash_attn_varlen_func(*leaves, cu_q, cu_k, max_q, max_k, causal=causal, deterministic=True)
        return torch.autograd.grad(out, leaves, dout)

    first = grads()
    for _ in range(20):
        assert all(torch.equal(a, b) for a, b in zip(first, grads()))
    check_grads(first, q, k, v, dout, attention=reference(cu_q, cu_k), causal=causal)


def test_launches_our_kernels_and_no_host_sync():
    hdim, dtype = compiled_config("bwd" if ops.has_varlen_bwd_op() else "fwd")
    q, k, v, dout, cu_q, cu_k, max_q, max_k = varlen_qkv([300, 1, 77], None, 4, 2, hdim, dtype=dtype, seed=16)
    names = cuda_kernel_names(lambda: flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True))
    assert any(map(is_our_forward_kernel, names)) and not any(map(is_torch_flash_kernel, names)), names
    torch.cuda.set_sync_debug_mode("error")  # a device-to-host copy on the way would raise
    try:
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    if ops.has_varlen_bwd_op():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = flash_attn_varlen_func(*leaves, cu_q, cu_k, max_q, max_k, causal=True)
        names = cuda_kernel_names(lambda: torch.autograd.grad(out, leaves, dout))
        assert any(map(is_our_backward_kernel, names)), names


# --------------------------------------------------------------------------
# Malformed sequence contents: clamped in the kernels, never out of bounds
# --------------------------------------------------------------------------

MALFORMED_CONTENTS = {
    "non_monotone": dict(cu_seqlens_q=[0, 300, 100, 500], cu_seqlens_k=[0, 300, 100, 500]),
    "last_offset_past_total": dict(cu_seqlens_q=[0, 100, 300, 4000], cu_seqlens_k=[0, 100, 300, 4000]),
    "negative_offsets": dict(cu_seqlens_q=[0, -50, 300, 500], cu_seqlens_k=[-7, 100, 300, 500]),
    "seqused_past_segment": dict(seqused_q=[200, 400, 9000], seqused_k=[100, 5000, 200]),
    "negative_seqused": dict(seqused_q=[-1, 100, 200], seqused_k=[100, -300, 200]),
    "max_seqlen_too_small": dict(max_seqlen_q=16, max_seqlen_k=16),
}


@pytest.mark.parametrize("case", list(MALFORMED_CONTENTS))
def test_malformed_sequence_contents_stay_in_bounds(case):
    """No exception, no fault; the tensors around the outputs stay untouched and the next valid call is right.
    (compute-sanitizer memcheck over this test is issue 40's out-of-bounds proof.)"""
    hdim, dtype = compiled_config("bwd" if ops.has_varlen_bwd_op() else "fwd")
    q, k, v, dout, cu_q, cu_k, max_q, max_k = varlen_qkv([100, 200, 200], None, 4, 2, hdim, dtype=dtype, seed=17)
    change = dict(MALFORMED_CONTENTS[case])
    args = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k)
    for name in ("cu_seqlens_q", "cu_seqlens_k", "seqused_q", "seqused_k"):
        if name in change:
            args[name] = torch.tensor(change.pop(name), dtype=torch.int32, device="cuda")
    args.update(change)
    guard = torch.full((1 << 20,), 7.0, device="cuda")
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = flash_attn_varlen_func(*leaves, **args, causal=True)
    if ops.has_varlen_bwd_op():
        torch.autograd.grad(out, leaves, dout)
    torch.cuda.synchronize()
    assert torch.equal(guard, torch.full_like(guard, 7.0))
    assert torch.equal(cu_q, torch.tensor([0, 100, 300, 500], dtype=torch.int32, device="cuda"))
    run_forward(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)


# --------------------------------------------------------------------------
# torch.compile, CUDA graphs
# --------------------------------------------------------------------------


@pytest.mark.parametrize("deterministic", [False, True])
def test_torch_compile_forward_and_backward_matches_eager(deterministic):
    needs_varlen_bwd()
    hdim, dtype = compiled_config("bwd")
    q, k, v, dout, cu_q, cu_k, max_q, max_k = varlen_qkv([300, 1, 129, 64], None, 8, 2, hdim, dtype=dtype, seed=18)

    def block(q, k, v):
        return flash_attn_varlen_func(q * 0.5, k, v, cu_q, cu_k, max_q, max_k, causal=True,
                                      deterministic=deterministic) * 2

    def grads(fn):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = fn(*leaves)
        return (out,) + torch.autograd.grad(out, leaves, dout)

    torch._dynamo.reset()
    try:
        compiled = grads(torch.compile(block, fullgraph=True))
    finally:
        torch._dynamo.reset()
    eager = grads(block)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=0)


def test_cuda_graph_capture_and_replay_of_forward_and_backward():
    hdim, dtype = compiled_config("bwd" if ops.has_varlen_bwd_op() else "fwd")
    q, k, v, dout, cu_q, cu_k, max_q, max_k = varlen_qkv([300, 1, 129, 0, 64], None, 8, 2, hdim, dtype=dtype, seed=19)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    backward = ops.has_varlen_bwd_op()

    def step():
        out = flash_attn_varlen_func(*leaves, cu_q, cu_k, max_q, max_k, causal=True, deterministic=True)
        grads = torch.autograd.grad(out, leaves, dout) if backward else ()
        return (out,) + tuple(grads)

    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up outside the capture
        with torch.cuda.graph(graph, stream=stream):
            captured = step()
    torch.cuda.current_stream().wait_stream(stream)
    new_q = varlen_qkv([300, 1, 129, 0, 64], None, 8, 2, hdim, dtype=dtype, seed=20)[0]
    with torch.no_grad():
        leaves[0].copy_(new_q)
    cu_q2 = torch.tensor([0, 200, 201, 330, 330, 494], dtype=torch.int32, device="cuda")
    cu_q.copy_(cu_q2)  # new offsets, same total: read from device memory at replay
    cu_k.copy_(cu_q2)
    graph.replay()
    torch.cuda.synchronize()
    eager = step()
    assert all(torch.equal(a, b) for a, b in zip(captured, eager))


# --------------------------------------------------------------------------
# torch's varlen_attn through the registry
# --------------------------------------------------------------------------


@pytest.fixture
def activated():
    attention = pytest.importorskip("torch.nn.attention")
    if not hasattr(attention, "activate_flash_attention_impl"):
        pytest.skip(f"torch {torch.__version__} has no flash-attention registry")
    try:
        from torch.nn.attention import varlen
    except ImportError:
        pytest.skip(f"torch {torch.__version__} has no torch.nn.attention.varlen (varlen_attn)")
    attention.activate_flash_attention_impl("flash_attn_hopper")
    try:
        yield varlen
    finally:
        attention.restore_flash_attention_impl()


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (32, 0)])
def test_torch_varlen_attn_runs_our_kernels(activated, window):
    varlen = activated
    hdim, dtype = compiled_config("bwd" if ops.has_varlen_bwd_op() else "fwd")
    q, k, v, dout, cu_q, cu_k, max_q, max_k = varlen_qkv([300, 1, 129, 64], None, 8, 2, hdim, dtype=dtype, seed=21)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]

    options = varlen_attn_options(varlen, window, gqa=True)

    def forward():
        return varlen.varlen_attn(*leaves, cu_q, cu_k, max_q, max_k, return_aux=varlen.AuxRequest(lse=True), **options)

    names = cuda_kernel_names(forward)
    assert any(map(is_our_forward_kernel, names)) and not any(map(is_torch_flash_kernel, names)), names
    out, lse = forward()
    causal = window == (-1, 0)
    ref_out, ref_lse = attention_ref_varlen(q, k, v, cu_q, cu_k, causal=causal, window_size=window)
    low_out, _ = attention_ref_varlen(q, k, v, cu_q, cu_k, causal=causal, window_size=window, upcast=False)
    assert_fa_close(out, ref_out, low_out)
    assert lse.shape == (8, q.size(0)) and torch.equal(torch.isposinf(lse), torch.isneginf(ref_lse))
    if ops.has_varlen_bwd_op():
        names = cuda_kernel_names(lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True))
        assert any(map(is_our_backward_kernel, names)) and not any(map(is_torch_flash_kernel, names)), names
        grads = torch.autograd.grad(out, leaves, dout)
        check_grads(grads, q, k, v, dout, attention=reference(cu_q, cu_k), causal=causal, window_size=window)


# --------------------------------------------------------------------------
# transformers: a tiny Llama trained on padded and on packed batches tracks "sdpa"
# --------------------------------------------------------------------------


def test_transformers_padding_mask_runs_the_varlen_kernel():
    import types

    hdim, dtype = compiled_config()
    gen = torch.Generator(device="cuda").manual_seed(22)
    # (batch, heads, seqlen, head_dim) views of (batch, seqlen, heads, head_dim) memory, as models make them.
    q, k, v = (torch.randn(3, 200, h, hdim, device="cuda", dtype=dtype, generator=gen).transpose(1, 2) for h in (8, 2, 2))
    lengths = [200, 150, 1]  # right padding
    mask = (torch.arange(200, device="cuda")[None] < torch.tensor(lengths, device="cuda")[:, None]).long()
    module = types.SimpleNamespace(num_key_value_groups=4, is_causal=True, training=False)
    call = lambda: fah_transformers.attention_forward(module, q, k, v, mask)  # noqa: E731
    names = cuda_kernel_names(call)
    assert any(map(is_our_forward_kernel, names)) and not any(map(is_torch_flash_kernel, names)), names
    out, weights = call()
    assert weights is None and out.shape == (3, 200, 8, hdim)
    for b, n in enumerate(lengths):
        seq = [t[b, :, :n].transpose(0, 1) for t in (q, k, v)]  # (n, heads, head_dim)
        cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
        ref, _ = attention_ref_varlen(*seq, cu, cu, causal=True)
        low, _ = attention_ref_varlen(*seq, cu, cu, causal=True, upcast=False)
        assert_fa_close(out[b, :n], ref, low)
        assert not out[b, n:].any()  # padded query rows are 0


def _name_transformers_accepts():
    import transformers.utils

    name = fah_transformers.register()
    check = getattr(getattr(transformers.utils, "generic", None), "is_flash_attention_requested", None)
    if check is not None and check(requested_attention_implementation=name):
        # transformers >= 5 hands names containing "flash" to its own FlashAttention loader.
        name = fah_transformers.register("hopper_attention")
    return name


def _use(model, implementation):
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(implementation)
    else:  # transformers before set_attn_implementation
        model.config._attn_implementation = implementation
    assert model.config._attn_implementation == implementation


def _train(model, batches, steps):
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(steps):
        batch = batches[step % len(batches)]
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _batches(kind, vocab, generator):
    batches = []
    for _ in range(5):
        if kind == "padded":
            ids = torch.randint(0, vocab, (4, 96), generator=generator)
            lengths = torch.randint(8, 97, (4,), generator=generator)
            mask = (torch.arange(96)[None] < lengths[:, None]).long()
            batches.append(dict(input_ids=ids.cuda(), attention_mask=mask.cuda(),
                                labels=ids.masked_fill(mask == 0, -100).cuda()))
        else:
            lengths = torch.randint(1, 60, (8,), generator=generator).tolist()
            ids = torch.randint(0, vocab, (1, sum(lengths)), generator=generator)
            position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
            labels = ids.clone()
            labels[0, torch.tensor([0] + lengths[:-1]).cumsum(0)] = -100  # no prediction across a boundary
            batches.append(dict(input_ids=ids.cuda(), position_ids=position_ids.cuda(), labels=labels.cuda(),
                                use_cache=False))
    return batches


@pytest.mark.parametrize("kind", ["padded", "packed"])
def test_tiny_llama_training_tracks_sdpa(kind):
    transformers = pytest.importorskip("transformers", reason="the end-to-end check needs Hugging Face transformers")
    needs_varlen_bwd()
    skip_unless_compiled(32, torch.bfloat16, ("fwd", "bwd"))
    name = _name_transformers_accepts()
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=512, use_cache=False,
    )
    torch.manual_seed(0)
    sdpa_model = transformers.LlamaForCausalLM(copy.deepcopy(config)).to("cuda", torch.bfloat16)
    _use(sdpa_model, "sdpa")
    models = {"sdpa": sdpa_model}
    for implementation in ("eager", name):
        model = transformers.LlamaForCausalLM(copy.deepcopy(config)).to("cuda", torch.bfloat16)
        model.load_state_dict(sdpa_model.state_dict())
        _use(model, implementation)
        models[implementation] = model
    ours = models[name]
    batches = _batches(kind, config.vocab_size, torch.Generator().manual_seed(1))
    names = cuda_kernel_names(lambda: ours(**batches[0]).loss.backward())
    assert any(map(is_our_forward_kernel, names)) and any(map(is_our_backward_kernel, names)), names
    ours.zero_grad(set_to_none=True)
    losses = {implementation: _train(model, batches, 50) for implementation, model in models.items()}
    sdpa_losses = losses["sdpa"]
    assert sdpa_losses[-1] < sdpa_losses[0] - 0.5, f"the model did not learn: {sdpa_losses[0]} -> {sdpa_losses[-1]}"
    # bf16 noise: rounding differences grow chaotically over 50 steps of training (on CPU, eager vs
    # sdpa: ~0.002 over the first steps, 0.04 mean and 0.25 max over 50). So, FlashAttention's rule
    # applied to the run: the mean distance to "sdpa" at most twice PyTorch's own (eager's) plus a
    # little, and the first steps, before the noise grows, close; a wrong mask shows at once.
    ours_gap = [abs(a - b) for a, b in zip(losses[name], sdpa_losses)]
    eager_gap = [abs(a - b) for a, b in zip(losses["eager"], sdpa_losses)]
    report = f"ours {[round(x, 4) for x in losses[name]]}\nsdpa {[round(x, 4) for x in sdpa_losses]}"
    assert max(ours_gap[:5]) <= 0.01, report
    assert sum(ours_gap) / len(ours_gap) <= 2 * sum(eager_gap) / len(eager_gap) + 0.01, report
