"""The forward kernel on the GPU against the float32 reference, by FlashAttention's rule.

Quick subset by default; ``FLASH_ATTN_HOPPER_FULL_TESTS=1`` runs issue 3's full
sweep: dtypes x head dims (odd ones round up) x causal x GQA ratios 1/2/6 x
awkward sequence-length pairs x batch.  Every case draws fresh random inputs,
poisons the memory the op's outputs will land in with NaN, and checks out and
lse.  Configurations this build did not compile are skipped, naming the knob.
"""

from __future__ import annotations

import math

import pytest
import torch

import flash_attn_hopper
from flash_attn_hopper import manifest, ops
from flash_attn_hopper import flash_attn_func, flash_attn_qkvpacked_func, flash_attn_varlen_func

from helpers.cases import (
    BATCHES,
    DTYPE_IDS,
    DTYPES,
    EMPTY_SHAPES,
    FWD_SEQLEN_PAIRS,
    GQA,
    HDIMS,
    NHEADS_KV,
    STRIDED_LAYOUTS,
    WINDOW_SEQLEN_PAIRS,
    WINDOWS,
)
from helpers import location
from helpers.grads import check_grads
from helpers.inputs import poison_allocations, qkv
from helpers.kernels import compiled_config, skip_unless_compiled
from reference import assert_fa_close, attention_ref

pytestmark = pytest.mark.gpu

#: The kernel's lse is float32 end to end; this covers exp2/log approximations
#: where torch's low-precision lse happens to be exact (e.g. one key).
LSE_ATOL = 1e-4


def run_and_check(q, k, v, causal, **kwargs):
    b, sq, hq, d = q.shape
    poison_allocations(((b, sq, hq, d), q.dtype), ((b, hq, sq), torch.float32))
    out, lse = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True, **kwargs)
    ref, lse_ref = attention_ref(q, k, v, causal=causal, **kwargs)
    low, lse_low = attention_ref(q, k, v, causal=causal, upcast=False, **kwargs)
    assert out.shape == (b, sq, hq, d) and out.dtype == q.dtype
    assert lse.shape == (b, hq, sq) and lse.dtype == torch.float32
    assert_fa_close(out, ref, low, name="out")
    assert_fa_close(lse, lse_ref, lse_low, name="lse", atol=LSE_ATOL)
    return out, lse


def assert_blind_rows_empty(out, lse, blind):
    """Bottom-right causal: the first `blind` (seqlen_q - seqlen_k) queries see no key: O is 0, lse -inf."""
    assert torch.equal(out[:, :blind], torch.zeros_like(out[:, :blind]))
    assert torch.isneginf(lse[:, :, :blind]).all()


# --------------------------------------------------------------------------
# The sweep
# --------------------------------------------------------------------------


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("seqlen_q, seqlen_k", FWD_SEQLEN_PAIRS)
@pytest.mark.parametrize("gqa", GQA)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdim", HDIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_forward_sweep(dtype, hdim, causal, gqa, seqlen_q, seqlen_k, batch):
    skip_unless_compiled(hdim, dtype)
    seed = hash((hdim, causal, gqa, seqlen_q, seqlen_k, batch)) % (2**31)
    q, k, v = qkv(batch, seqlen_q, seqlen_k, NHEADS_KV * gqa, NHEADS_KV, hdim, dtype=dtype, seed=seed)
    out, lse = run_and_check(q, k, v, causal)
    if causal and seqlen_q > seqlen_k:
        assert_blind_rows_empty(out, lse, seqlen_q - seqlen_k)


# --------------------------------------------------------------------------
# Shapes and layouts
# --------------------------------------------------------------------------


def test_poisoning_reaches_the_outputs():
    """The NaN poisoning above is only worth something if the op's outputs land in the poisoned blocks."""
    d, dtype = compiled_config()
    q, k, v = qkv(2, 300, 300, 4, 4, d, dtype=dtype)
    addresses = poison_allocations(((2, 300, 4, d), dtype), ((2, 4, 300), torch.float32))
    out, lse = flash_attn_func(q, k, v, return_attn_probs=True)
    assert out.data_ptr() in addresses and lse.data_ptr() in addresses
    assert not out.isnan().any() and not lse.isnan().any()


@pytest.mark.parametrize("causal", [False, True])
def test_inputs_sliced_from_packed_qkv(causal):
    d, dtype = compiled_config()
    b, s, hq, hk = 2, 333, 6, 2
    packed = torch.randn(b, s, hq + 2 * hk, d, device="cuda", dtype=dtype)
    q, k, v = packed.split([hq, hk, hk], dim=2)
    assert not q.is_contiguous() and not k.is_contiguous()
    out, lse = run_and_check(q, k, v, causal)
    contiguous = flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), causal=causal)
    assert torch.equal(out, contiguous), "strides changed the result"
    assert torch.equal(flash_attn_qkvpacked_func(packed, causal=causal, num_heads_q=hq), out)


def test_qkvpacked_five_dim_layout():
    d, dtype = compiled_config()
    packed = torch.randn(3, 129, 3, 4, d, device="cuda", dtype=dtype)
    out, lse = flash_attn_qkvpacked_func(packed, causal=True, return_attn_probs=True)
    q, k, v = packed.unbind(dim=2)
    run_and_check(q, k, v, True)
    assert torch.equal(out, flash_attn_func(q, k, v, causal=True))


@pytest.mark.parametrize("layout", STRIDED_LAYOUTS)
def test_strided_layouts(layout):
    d, dtype = compiled_config()
    b, s, h = 2, 257, 4
    q, k, v = qkv(b, s, s, h, h, d, dtype=dtype, layout=layout)
    assert q.stride(-1) == 1 and not q.is_contiguous()
    out, _ = run_and_check(q, k, v, False)
    assert torch.equal(out, flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous()))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdim", [64, 128, 256])
def test_many_batches(hdim, causal):
    # 3000 one-block tiles: a persistent grid gives each CTA twenty or more, so the tile-to-tile
    # hand-overs (pipeline state, the two Q buffers and the deferred O-store wait of the own-O
    # kernels at hdim 64 / 128, hdim 256's persistent short-keys kernels) run back to back.
    # Repeated: a moving result would be a race between consecutive tiles.
    skip_unless_compiled(hdim, torch.bfloat16)
    q, k, v = qkv(1500, 17, 33, 2, 1, hdim, dtype=torch.bfloat16, seed=3)
    out, lse = run_and_check(q, k, v, causal)
    for _ in range(3):
        again, again_lse = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
        assert torch.equal(again, out) and torch.equal(again_lse, lse)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("hdim", [64, 128])  # the persistent causal tiles
def test_persistent_ctas_running_into_tiles_with_nothing_to_attend(hdim, seed):
    """Bottom-right causal with far more queries than keys: most query tiles see no key, so the
    persistent CTAs of the dynamic scheduler finish a tile that wrote O and go straight on to
    tiles that write zeros. The zeros must not reach shared memory before the previous tile's O
    store has read it."""
    skip_unless_compiled(hdim, torch.bfloat16)
    q, k, v = qkv(4, 4224, 200, 8, 2, hdim, dtype=torch.bfloat16, seed=seed)
    out, lse = run_and_check(q, k, v, True)
    assert_blind_rows_empty(out, lse, 4224 - 200)
    again = flash_attn_func(q, k, v, causal=True)
    assert torch.equal(again, out)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdim", [64, 128, 256])
@pytest.mark.parametrize("direction", ["toward_first_key", "toward_last_key"])
def test_row_max_growing_across_key_blocks(direction, hdim, causal):
    """Keys scaled up along the sequence, so that a row's max grows by far more than the
    softmax's slack (it moves its max only past 2^8 in the exp2 domain) from one key block to the
    next: toward the first key, the blocks the kernel visits last; toward the last key, a max
    found in the first block visited and never moved. Checked for out and lse."""
    skip_unless_compiled(hdim, torch.bfloat16)
    q, k, v = qkv(2, 300, 2500, 4, 2, hdim, dtype=torch.bfloat16, seed=hdim + causal)
    ramp = torch.linspace(1, 0, 2500, device="cuda") if direction == "toward_first_key" else torch.linspace(0, 1, 2500, device="cuda")
    k = (k.float() * (1 + 12 * ramp)[None, :, None, None]).to(torch.bfloat16)
    run_and_check(q, k, v, causal)


@pytest.mark.parametrize("seqlen_k", [4096, 4224, 5000, 6000, 8192])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_long_keys_on_either_tile(dtype, seqlen_k):
    """hdim 128 non-causal from 4096 keys runs 128x176 or 128x128 tiles, whichever pads fewer keys
    (policy.h fwd_keys_class_for; the rule itself is checked on the host): 4096, 6000 and 8192
    take 128x128 (6000 with a partial last block), 4224 (whole blocks of both: a tie) and 5000
    take 128x176."""
    skip_unless_compiled(128, dtype)
    q, k, v = qkv(1, 200, seqlen_k, 4, 2, 128, dtype=dtype, seed=seqlen_k)
    run_and_check(q, k, v, False)


@pytest.mark.parametrize("hdim, seqlen_k, causal", [(200, 500, False), (200, 500, True), (248, 700, False),
                                                    (120, 4224, False), (104, 5000, False)])
def test_direct_o_kernels_at_a_narrower_head_dim(hdim, seqlen_k, causal):
    """The persistent kernels that store O from registers in 16-byte chunks (kernel/fwd/epilogue.h
    kDirectO: hdim 256 below 4k keys, hdim 128's 128x176 tile) with a real head dim below the
    kernel's: chunks past it must not be written (they are the next head's columns), nor rows past
    seqlen_q (1000 = 7 x 128 + 104); 288 tiles, so CTAs run several and hand Q's buffer over."""
    skip_unless_compiled(hdim, torch.bfloat16)
    q, k, v = qkv(3, 1000, seqlen_k, 12, 4, hdim, dtype=torch.bfloat16, seed=hdim + seqlen_k + causal)
    run_and_check(q, k, v, causal)


@pytest.mark.parametrize("spike", [8.0, 100.0])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdim", [64, 128, 256])
def test_late_key_far_above_the_row_max(hdim, causal, spike):
    """The first key, whose block the kernel visits last, scaled by `spike`: its scores spread
    with a standard deviation of ~1.4 * spike in the exp2 domain (the scale folded in), against
    ~1.4 for the other keys. With 8, many rows move their max there by 8-30 (past the slack, p
    still finite); with 100, many by more than 128 (exp2 from the stale max overflows, so a
    kernel that skipped the max search must compute S again)."""
    skip_unless_compiled(hdim, torch.bfloat16)
    q, k, v = qkv(2, 300, 2500, 4, 2, hdim, dtype=torch.bfloat16, seed=hdim + causal + int(spike))
    k[:, 0] = k[:, 0] * spike
    run_and_check(q, k, v, causal)


@pytest.mark.parametrize("seqlen_k", [1025, 4097])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdim", HDIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_lone_key_in_the_first_key_block(dtype, hdim, causal, seqlen_k):
    """Key lengths one past a multiple of 64 / 128, so that the first key block the kernel visits
    holds one key (at the block widths that divide 1024), and that key scaled by 6: for about half
    the rows it carries the row's max, for the others a max far below the later blocks' scores.
    Kernels that skip the max search after the first full block must take that block's max
    exactly and fall back where the later scores overflow the slack."""
    skip_unless_compiled(hdim, dtype)
    q, k, v = qkv(1, 300, seqlen_k, 4, 2, hdim, dtype=dtype, seed=seqlen_k + hdim + causal)
    k[:, -1] = k[:, -1] * 6
    run_and_check(q, k, v, causal)


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q, seqlen_k", WINDOW_SEQLEN_PAIRS)
@pytest.mark.parametrize("gqa", [1, 6])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_local_window(window, causal, seqlen_q, seqlen_k, gqa, d):
    """Every head dim's local kernels: hdim 64's diagonal block masks and exponentiates only the
    half of it that a warpgroup needs, with bounds taken from the window."""
    if not manifest.FEATURES["local_window"]:
        pytest.skip("this version has no local-window kernels (manifest feature 'local_window' is off)")
    _, dtype = compiled_config()
    skip_unless_compiled(d, dtype)
    seed = hash((window, causal, seqlen_q, seqlen_k, gqa, d)) % (2**31)
    q, k, v = qkv(2, seqlen_q, seqlen_k, NHEADS_KV * gqa, NHEADS_KV, d, dtype=dtype, seed=seed)
    run_and_check(q, k, v, causal, window_size=window)


def test_custom_softmax_scale():
    d, dtype = compiled_config()
    q, k, v = qkv(2, 200, 300, 4, 2, d, dtype=dtype, seed=4)
    run_and_check(q, k, v, True, softmax_scale=0.3)


@pytest.mark.parametrize("op", ["fwd", "bwd"])
def test_non_positive_scale_is_refused_by_the_raw_ops(op):
    """The raw ops (no Python checks in front of them) refuse a scale the kernels cannot take with
    a RuntimeError. Run in a child process: the same check thrown from later in the binding (after
    the outputs were allocated) ended the process on the H200, which here fails the test instead
    of killing the test worker."""
    if op == "bwd" and not ops.has_bwd_op():
        pytest.skip("this build has no backward op")
    d, dtype = compiled_config(op)
    call = {
        "fwd": "torch.ops.flash_attn_hopper.fwd(q, q, q, scale, False)",
        "bwd": "torch.ops.flash_attn_hopper.bwd(q, q, q, q, q, lse, scale, False)",
    }[op]
    code = (
        "import torch, flash_attn_hopper._C\n"
        f"q = torch.randn(1, 64, 2, {d}, device='cuda', dtype=torch.{str(dtype).removeprefix('torch.')})\n"
        "lse = torch.zeros(1, 2, 64, device='cuda')\n"
        "for scale in (0.0, -0.3):\n"
        "    try:\n"
        f"        {call}\n"
        "        print('no error')\n"
        "    except RuntimeError as e:\n"
        "        print('refused:', 'softmax_scale must be a positive finite number' in str(e))\n"
        "o, _ = torch.ops.flash_attn_hopper.fwd(q, q, q, 0.1, False)\n"
        "print('still usable:', bool(torch.isfinite(o).all()))\n"
    )
    result = location.run_python(["-c", code], timeout=300)  # outside the checkout: the installed package
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-2000:]}"
    assert result.stdout.split("\n")[:3] == ["refused: True", "refused: True", "still usable: True"], result.stdout


def test_wide_window_and_causal_window_match_plain_calls():
    d, dtype = compiled_config()
    q, k, v = qkv(2, 150, 190, 4, 2, d, dtype=dtype, seed=5)
    assert torch.equal(flash_attn_func(q, k, v, window_size=(-1, 0)), flash_attn_func(q, k, v, causal=True))
    assert torch.equal(flash_attn_func(q, k, v, window_size=(500, 500)), flash_attn_func(q, k, v))


@pytest.mark.parametrize("shape_q, shape_k", EMPTY_SHAPES)
def test_empty_inputs(shape_q, shape_k):
    d, dtype = compiled_config()
    b, sq, hq = shape_q
    _, sk, hk = shape_k
    q, k, v = qkv(b, sq, sk, hq, hk, d, dtype=dtype)
    out, lse = flash_attn_func(q, k, v, return_attn_probs=True)
    assert out.shape == (b, sq, hq, d) and lse.shape == (b, hq, sq)
    if sk == 0 and b * sq > 0:  # nothing to attend to
        assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


# --------------------------------------------------------------------------
# Determinism, graphs, compile, dispatcher checks
# --------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_hundred_repeats_are_bitwise_identical(causal):
    d, dtype = compiled_config()
    q, k, v = qkv(2, 1111, 1500, 8, 2, d, dtype=dtype, seed=6)
    first, first_lse = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    for _ in range(100):
        out, lse = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
        assert torch.equal(out, first) and torch.equal(lse, first_lse)


def test_cuda_graph_capture_and_replay():
    d, dtype = compiled_config()
    q, k, v = qkv(2, 512, 512, 4, 4, d, dtype=dtype, seed=7)
    expected = flash_attn_func(q, k, v, causal=True)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        flash_attn_func(q, k, v, causal=True)  # warm-up outside the capture
        with torch.cuda.graph(graph, stream=stream):
            captured = flash_attn_func(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(stream)
    new_q, _, _ = qkv(2, 512, 512, 4, 4, d, dtype=dtype, seed=8)
    q.copy_(new_q)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, flash_attn_func(q, k, v, causal=True))
    assert not torch.equal(captured, expected)


def test_torch_compile_inductor_matches_eager():
    d, dtype = compiled_config()
    q, k, v = qkv(2, 300, 300, 4, 2, d, dtype=dtype, seed=9)

    def block(q, k, v):
        return flash_attn_func(q * 1.5, k, v, causal=True) * 2  # elementwise: bitwise reproducible

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    assert torch.equal(compiled(q, k, v), block(q, k, v))


def test_opcheck():
    d, dtype = compiled_config()
    q, k, v = qkv(2, 100, 120, 4, 2, d, dtype=dtype, seed=10)
    torch.library.opcheck(torch.ops.flash_attn_hopper.fwd.default, (q, k, v, d**-0.5, True))


def test_backward():
    d, dtype = compiled_config()
    q, k, v = (t.requires_grad_() for t in qkv(2, 128, 160, 4, 2, d, dtype=dtype, seed=11))
    out = flash_attn_func(q, k, v, causal=True)
    dout = torch.randn_like(out)
    if not ops.has_bwd_op():
        with pytest.raises(RuntimeError, match="this build has no backward kernels"):
            out.backward(dout)
        return
    check_grads(torch.autograd.grad(out, (q, k, v), dout), q, k, v, dout, causal=True)


def test_build_info_reports_the_gpu_build():
    info = flash_attn_hopper.build_info()
    assert info["available"] and info["extension_loaded"] and info["unavailable_reason"] is None
    if info["build_config_found"]:
        assert info["compiled"], "the build compiled no kernel"
    d, dtype = compiled_config()
    assert math.isfinite(flash_attn_func(*qkv(1, 8, 8, 1, 1, d, dtype=dtype)).float().sum().item())



def check_padded_grads(q, k, v, causal):
    """The gradients of a call that runs on zero-padded copies, against the reference (a build with the backward)."""
    if not ops.has_bwd_op():
        return
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = flash_attn_func(q, k, v, causal=causal)
    dout = torch.randn_like(out)
    check_grads(torch.autograd.grad(out, (q, k, v), dout), q, k, v, dout, causal=causal)

@pytest.mark.parametrize("d", [59, 111])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims_not_a_multiple_of_8(d, causal):
    """FA3's odd head dims run on copies zero-padded to the next multiple of 8 (64, 112 -> the 64 and
    128 kernels), forward and backward, with the real head dim's scale."""
    padded = -(-d // 8) * 8
    skip_unless_compiled(padded, torch.bfloat16)
    q, k, v = qkv(2, 113, 203, 4, 2, d, dtype=torch.bfloat16, seed=d)
    run_and_check(q, k, v, causal)
    check_padded_grads(q, k, v, causal)


@pytest.mark.parametrize("d, dv", [(192, 128), (176, 96), (64, 256), (64, 512)])
@pytest.mark.parametrize("causal", [False, True])
def test_value_head_dim_other_than_qs(d, dv, causal):
    """FA3's dv != d: 192 / 128 (and any q head dim rounding to 192 with v's up to 128) on the
    forward's own kernels and the backward's (v, out, dout at v's head dim); 64 / 256 on q, k, v
    zero-padded to the wider head dim; dv > 256 (64 / 512) in pieces of v's head dim: out and the
    gradients against the float32 reference, with q's head dim's scale."""
    skip_unless_compiled(max(d, dv) if dv <= 256 else d, torch.bfloat16)
    q, k, _ = qkv(2, 113, 203, 4, 2, d, dtype=torch.bfloat16, seed=d + dv)
    v = qkv(2, 113, 203, 4, 2, dv, dtype=torch.bfloat16, seed=d * dv)[2]
    out, lse = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    ref, ref_lse = attention_ref(q, k, v, causal=causal)
    low, _ = attention_ref(q, k, v, causal=causal, upcast=False)
    assert out.shape == (*q.shape[:-1], dv)
    assert_fa_close(out, ref, low, name="out")
    assert torch.allclose(lse, ref_lse, atol=1e-3)
    check_padded_grads(q, k, v, causal)
    if dv < d <= 192:  # the split path of the own kernels, and their varlen form
        split = flash_attn_func(q, k, v, causal=causal, num_splits=3)
        assert_fa_close(split, ref, low, name="out (3 splits)")
        cu_q = torch.arange(0, 3 * 113, 113, dtype=torch.int32, device=q.device)
        cu_k = torch.arange(0, 3 * 203, 203, dtype=torch.int32, device=q.device)
        packed = flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, 113, 203,
                                        causal=causal)
        assert_fa_close(packed.view_as(out), ref, low, name="out (varlen)")
