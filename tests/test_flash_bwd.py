"""The backward kernel on the GPU: dq, dk, dv against autograd through the float32 reference,
by FlashAttention's rule.

Needs a build with the backward kernels (the default: any build without
``FLASH_ATTN_HOPPER_DISABLE_BACKWARD=1``) and a Hopper GPU; skipped with the reason
otherwise.  Quick subset by default;
``FLASH_ATTN_HOPPER_FULL_TESTS=1`` runs the forward's full sweep: dtypes x head dims (odd
ones round up) x causal x GQA ratios 1/2/6 x awkward sequence-length pairs x batch.  Every
case draws fresh inputs, poisons the memory the gradients will land in with NaN (as
test_flash_fwd.py does for the outputs), and checks dq, dk and dv:

    |grad - grad_ref|.max() <= 2 * |grad_pytorch_lowprec - grad_ref|.max() + rounding noise

where grad_ref is autograd through tests/reference.py in float32 and grad_pytorch_lowprec
the same in the inputs' dtype.  Then windows, top-left alignment (SDPA drop-in),
strided inputs, deterministic mode (100 repeats bitwise equal), memory (no seqlen² tensor
at 32k tokens), torch.compile of forward + backward, opcheck, and the benchmark's --bwd path.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import threading

import pytest
import torch

import flash_attn_hopper
from flash_attn_hopper import manifest, ops, sdpa
from flash_attn_hopper import flash_attn_func, flash_attn_qkvpacked_func

from conftest import REPO_ROOT
from helpers.cases import (
    BATCHES,
    BWD_SEQLEN_PAIRS,
    DTYPE_IDS,
    DTYPES,
    EMPTY_SHAPES,
    GQA,
    HDIMS,
    NHEADS_KV,
    STRIDED_LAYOUTS,
    WINDOW_SEQLEN_PAIRS,
    WINDOWS,
)
from helpers.grads import check_grads, deterministic_algorithms
from helpers.inputs import poison_allocations, qkv
from helpers.kernels import compiled_config, cuda_kernel_names, skip_unless_compiled
from reference import attention_ref, sdpa_ref

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not ops.has_bwd_op(),
        reason=manifest.direction_unavailable_message("bwd"),
    ),
]

#: The tests below need both kernels of a (head dim, dtype).
BOTH = ("fwd", "bwd")


def flash_grads(q, k, v, dout, poison=True, **kwargs):
    """out and (dq, dk, dv) through flash_attn_func, the gradients' memory poisoned first."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = flash_attn_func(q, k, v, **kwargs)
    if poison:  # in the backward's allocation order: dq, dk, dv (autograd materializes nothing for the lse)
        poison_allocations((q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype))
    return out, torch.autograd.grad(out, (q, k, v), dout)


# --------------------------------------------------------------------------
# The sweep
# --------------------------------------------------------------------------


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("seqlen_q, seqlen_k", BWD_SEQLEN_PAIRS)
@pytest.mark.parametrize("gqa", GQA)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdim", HDIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_backward_sweep(dtype, hdim, causal, gqa, seqlen_q, seqlen_k, batch):
    skip_unless_compiled(hdim, dtype, BOTH)
    seed = hash((hdim, causal, gqa, seqlen_q, seqlen_k, batch, "bwd")) % (2**31)
    q, k, v, dout = qkv(batch, seqlen_q, seqlen_k, NHEADS_KV * gqa, NHEADS_KV, hdim, dtype=dtype, seed=seed, dout=True)
    _, grads = flash_grads(q, k, v, dout, causal=causal)
    check_grads(grads, q, k, v, dout, causal=causal)
    if causal and seqlen_q > seqlen_k:
        # Bottom-right causal: the first seqlen_q - seqlen_k queries see no key, so their dq is 0.
        blind = grads[0][:, : seqlen_q - seqlen_k]
        assert torch.equal(blind, torch.zeros_like(blind))


@pytest.mark.parametrize("hdim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_more_key_block_tiles_than_sms(hdim, causal, deterministic):
    """A few hundred (key block, KV head, batch) tiles: the default mode's persistent kernels
    (head dims <= 128; non-causal striding, causal drawing tiles from a counter) walk several
    tiles per CTA, their K/V loads, dQ staging buffers and barrier phases running on from tile to
    tile; causal tiles of every length (bottom-right, more keys than queries); GQA sums dK/dV over
    query heads; the key length is not a multiple of any key block; hdim 256 runs the split Q/dO
    pipelines."""
    dtype = torch.bfloat16
    skip_unless_compiled(hdim, dtype, BOTH)
    seed = hash((hdim, causal, deterministic, "many tiles")) % (2**31)
    # 8 x 16 x 3 = 384 tiles of 128 keys
    q, k, v, dout = qkv(3, 437, 1001, 48, 16, hdim, dtype=dtype, seed=seed, dout=True)
    _, grads = flash_grads(q, k, v, dout, causal=causal, deterministic=deterministic)
    check_grads(grads, q, k, v, dout, causal=causal)


def test_poisoning_reaches_the_gradients():
    """The NaN poisoning is only worth something if dq, dk and dv land in the poisoned blocks."""
    d, dtype = compiled_config("bwd")
    q, k, v, dout = qkv(2, 300, 300, 4, 2, d, dtype=dtype, dout=True)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = flash_attn_func(q, k, v)
    # The backward's first allocations are dq, dk, dv: no zero gradient for the unused lse comes
    # before them (ops._setup_context turns autograd's materialization off).
    addresses = poison_allocations((q.shape, dtype), (k.shape, dtype), (v.shape, dtype))
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert [g.data_ptr() for g in grads] == addresses
    assert not any(g.isnan().any() for g in grads)


def test_keys_no_query_sees_get_zero_gradients():
    d, dtype = compiled_config("bwd")
    q, k, v, dout = qkv(2, 100, 300, 4, 2, d, dtype=dtype, seed=1, dout=True)
    _, (dq, dk, dv) = flash_grads(q, k, v, dout, window_size=(10, 0))
    # Query i sees keys i + 200 - 10 ... i + 200: keys below 190 are seen by nobody.
    assert torch.equal(dk[:, :190], torch.zeros_like(dk[:, :190]))
    assert torch.equal(dv[:, :190], torch.zeros_like(dv[:, :190]))
    check_grads((dq, dk, dv), q, k, v, dout, window_size=(10, 0))


# --------------------------------------------------------------------------
# Masks: windows, top-left
# --------------------------------------------------------------------------


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q, seqlen_k", WINDOW_SEQLEN_PAIRS)
@pytest.mark.parametrize("gqa", [1, 6])
def test_local_window(window, causal, seqlen_q, seqlen_k, gqa):
    d, dtype = compiled_config("bwd")
    seed = hash((window, causal, seqlen_q, seqlen_k, gqa, "bwd")) % (2**31)
    q, k, v, dout = qkv(2, seqlen_q, seqlen_k, NHEADS_KV * gqa, NHEADS_KV, d, dtype=dtype, seed=seed, dout=True)
    _, grads = flash_grads(q, k, v, dout, causal=causal, window_size=window)
    check_grads(grads, q, k, v, dout, causal=causal, window_size=window)


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(113, 203), (203, 113), (1, 239), (256, 256)])
def test_top_left_causal_through_the_sdpa_drop_in(seqlen_q, seqlen_k):
    """torch's is_causal (top-left aligned) on our kernels, forward and backward."""
    assert sdpa.BACKWARD_READY, "a build with the bwd op must let gradients through the drop-in"
    d, dtype = compiled_config("bwd")
    q, k, v, dout = qkv(
        2, seqlen_q, seqlen_k, 6, 2, d, dtype=dtype, seed=2, dout=True, heads_first=True, layout="bshd_memory"
    )
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]

    def run():
        out = flash_attn_hopper.scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=True)
        return torch.autograd.grad(out, leaves, dout)

    assert flash_attn_hopper.sdpa_fallback_reason(*leaves, is_causal=True, enable_gqa=True) is None
    names = cuda_kernel_names(run)
    assert any("flash_bwd_kernel" in n and "pytorch_flash" not in n for n in names), names
    check_grads(run(), q, k, v, dout, attention=sdpa_ref, is_causal=True)


def test_custom_softmax_scale():
    d, dtype = compiled_config("bwd")
    q, k, v, dout = qkv(2, 200, 300, 4, 2, d, dtype=dtype, seed=3, dout=True)
    _, grads = flash_grads(q, k, v, dout, causal=True, softmax_scale=0.3)
    check_grads(grads, q, k, v, dout, causal=True, softmax_scale=0.3)


# --------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_packed_qkv_and_strided_gradient(causal):
    d, dtype = compiled_config("bwd")
    b, s, hq, hk = 2, 333, 6, 2
    gen = torch.Generator(device="cuda").manual_seed(4)
    packed = torch.randn(b, s, hq + 2 * hk, d, device="cuda", dtype=dtype, generator=gen).requires_grad_()
    dout = torch.randn(b, s, hq, 2 * d, device="cuda", dtype=dtype, generator=gen)[..., ::2]  # last dim strided
    out = flash_attn_qkvpacked_func(packed, causal=causal, num_heads_q=hq)
    (dqkv,) = torch.autograd.grad(out, packed, dout)
    q, k, v = packed.detach().split([hq, hk, hk], dim=2)
    check_grads(dqkv.split([hq, hk, hk], dim=2), q, k, v, dout.contiguous(), causal=causal)


@pytest.mark.parametrize("layout", STRIDED_LAYOUTS)
def test_strided_layouts(layout):
    d, dtype = compiled_config("bwd")
    b, s, h = 2, 257, 4
    q, k, v, dout = qkv(b, s, s, h, h, d, dtype=dtype, seed=5, layout=layout, dout=True)
    assert q.stride(-1) == 1 and not q.is_contiguous()
    _, grads = flash_grads(q, k, v, dout, causal=True)
    check_grads(grads, q, k, v, dout, causal=True)
    # Deterministic mode: the layout must not change a single bit.
    _, strided = flash_grads(q, k, v, dout, causal=True, deterministic=True)
    _, contiguous = flash_grads(*(t.contiguous() for t in (q, k, v, dout)), causal=True, deterministic=True)
    for a, c in zip(strided, contiguous):
        assert torch.equal(a, c), "strides changed the gradients"


@pytest.mark.parametrize("shape_q, shape_k", EMPTY_SHAPES)
def test_empty_inputs(shape_q, shape_k):
    d, dtype = compiled_config("bwd")
    (b, sq, hq), (_, sk, hk) = shape_q, shape_k
    q, k, v, dout = qkv(b, sq, sk, hq, hk, d, dtype=dtype, dout=True)
    _, (dq, dk, dv) = flash_grads(q, k, v, dout, poison=False)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    for g in (dq, dk, dv):
        assert torch.equal(g, torch.zeros_like(g))


# --------------------------------------------------------------------------
# Deterministic mode
# --------------------------------------------------------------------------


@pytest.mark.parametrize("hdim", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_hundred_repeats_are_bitwise_identical(hdim, causal):
    dtype = torch.bfloat16
    skip_unless_compiled(hdim, dtype, BOTH)
    q, k, v, dout = qkv(2, 1111, 1500, 8, 2, hdim, dtype=dtype, seed=6, dout=True)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = flash_attn_func(q, k, v, causal=causal, deterministic=True)
    first = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    check_grads(first, q, k, v, dout, causal=causal)
    for _ in range(100):
        again = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        for a, b in zip(first, again):
            assert torch.equal(a, b)


def test_torch_deterministic_switch_gives_the_deterministic_gradients():
    d, dtype = compiled_config("bwd")
    q, k, v, dout = qkv(2, 700, 700, 8, 2, d, dtype=dtype, seed=7, dout=True)
    _, per_call = flash_grads(q, k, v, dout, causal=True, deterministic=True)
    with deterministic_algorithms():
        _, switched = flash_grads(q, k, v, dout, causal=True)
    for a, b in zip(per_call, switched):
        assert torch.equal(a, b)


# --------------------------------------------------------------------------
# Memory, compile, opcheck, benchmark
# --------------------------------------------------------------------------


def test_no_seqlen_squared_allocation_at_32k_tokens():
    d, dtype = compiled_config("bwd")
    b, s = 1, 32768
    hq, hk = (4, 2) if d <= 128 else (2, 1)  # so that the bound below stays under one s x s matrix
    q, k, v, dout = qkv(b, s, s, hq, hk, d, dtype=dtype, seed=8, dout=True)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.memory_allocated()
    out = flash_attn_func(q, k, v, causal=True)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - baseline
    # out, lse, dq, dk, dv, the float32 dQ accumulator and per-row sums: a few dozen copies of q at most.
    bound = 32 * q.numel() * q.element_size()
    smallest_square = s * s * q.element_size()  # one head's seqlen x seqlen matrix in the input dtype
    assert bound < smallest_square
    assert extra <= bound, f"peak {extra / 2**20:.0f} MiB above the inputs; bound {bound / 2**20:.0f} MiB"
    assert all(torch.isfinite(g).all() for g in grads)


def test_forward_and_backward_in_a_thread_that_made_no_cuda_call():
    """A fresh thread whose first CUDA work is ours (its memory from the caching allocator, no
    runtime call before): the binding binds the device's context itself before it encodes TMA
    descriptors, and the results (deterministic mode) equal the main thread's bit for bit."""
    d, dtype = compiled_config("bwd")
    q, k, v, dout = qkv(2, 333, 517, 4, 2, d, dtype=dtype, seed=10, dout=True)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    want = flash_attn_func(q, k, v, causal=True, deterministic=True)
    want_grads = torch.autograd.grad(want, (q, k, v), dout)
    del want, want_grads  # their blocks stay cached for the thread's allocations
    want = flash_attn_func(q, k, v, causal=True, deterministic=True)
    want_grads = torch.autograd.grad(want, (q, k, v), dout)
    torch.cuda.synchronize()
    got: dict[str, object] = {}

    def work():
        try:
            out = flash_attn_func(q, k, v, causal=True, deterministic=True)
            got["out"], got["grads"] = out, torch.autograd.grad(out, (q, k, v), dout)
            torch.cuda.synchronize()
        except BaseException as error:  # noqa: BLE001 - reported by the main thread below
            got["error"] = error

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert "error" not in got, got.get("error")
    assert torch.equal(got["out"], want)
    for g, w in zip(got["grads"], want_grads):
        assert torch.equal(g, w)


@pytest.mark.parametrize("deterministic", [False, True])
def test_torch_compile_fullgraph_forward_and_backward(deterministic):
    d, dtype = compiled_config("bwd")
    q, k, v, dout = qkv(2, 300, 300, 4, 2, d, dtype=dtype, seed=9, dout=True)

    def block(q, k, v):
        return flash_attn_func(q * 1.5, k, v, causal=True, deterministic=deterministic) * 2

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    out = compiled(*leaves)
    grads = torch.autograd.grad(out, leaves, dout)
    torch._dynamo.reset()
    eager_out = block(*leaves)
    eager = torch.autograd.grad(eager_out, leaves, dout)
    assert torch.equal(out, eager_out)
    if deterministic:
        for a, b in zip(grads, eager):
            assert torch.equal(a, b)

    def block_ref(q, k, v, upcast):
        return attention_ref(q * 1.5, k, v, causal=True, upcast=upcast)[0] * 2

    check_grads(grads, q, k, v, dout, attention=block_ref)


def test_opcheck():
    d, dtype = compiled_config("bwd")
    q, k, v, dout = qkv(2, 100, 120, 4, 2, d, dtype=dtype, seed=10, dout=True)
    out, lse = torch.ops.flash_attn_hopper.fwd(q, k, v, d**-0.5, True)
    bwd = torch.ops.flash_attn_hopper.bwd.default
    torch.library.opcheck(bwd, (dout, q, k, v, out, lse, d**-0.5, True))
    torch.library.opcheck(bwd, (dout, q, k, v, out, lse, d**-0.5, False, 20, 7, True, True))
    sink = torch.randn(q.size(2), device=q.device)
    out_s, lse_s = torch.ops.flash_attn_hopper.fwd(q, k, v, d**-0.5, True, sink=sink)
    torch.library.opcheck(bwd, (dout, q, k, v, out_s, lse_s, d**-0.5, True, -1, -1, False, False, 0.0, sink))
    # The forward ops with inputs that require grad: their autograd formula and the traced backward.
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    det = getattr(torch.ops.flash_attn_hopper, ops.DETERMINISTIC_FWD_NAME).default
    torch.library.opcheck(det, (*leaves, d**-0.5, True))
    torch.library.opcheck(det, (*leaves, d**-0.5, False, 30, 0, True))


def test_build_reports_its_backward():
    info = flash_attn_hopper.build_info()
    assert info["has_backward_op"] and info["features"]["backward"]
    if info["build_config_found"]:
        fwd = {(c["hdim"], c["dtype"]) for c in info["compiled"] if c["direction"] == "fwd"}
        bwd = {(c["hdim"], c["dtype"]) for c in info["compiled"] if c["direction"] == "bwd"}
        assert bwd == fwd, "the backward is built for the forward's head dims and dtypes"


def test_benchmark_bwd_path_times_the_backward():
    spec = importlib.util.spec_from_file_location("benchmark_attn", REPO_ROOT / "benchmarks" / "benchmark_attn.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules["benchmark_attn"] = bench
    spec.loader.exec_module(bench)
    d, dtype = compiled_config("bwd")
    dtype_name = manifest.dtype_name(str(dtype).removeprefix("torch."))
    args = bench.parse_args(["--bwd", "--warmup", "2", "--rep", "5", "--dtype", dtype_name])
    run = bench.PROVIDERS["flash_attn_hopper"]()
    row = bench.measure_point("flash_attn_hopper", run, dtype, d, True, 1024, args)
    assert math.isfinite(row.fwd_tflops) and row.fwd_tflops > 0
    assert math.isfinite(row.bwd_tflops) and row.bwd_tflops > 0
