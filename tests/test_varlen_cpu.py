"""Variable-length attention's Python side without a GPU (issue 40).

The varlen ops run as float32 emulations of their contract on CPU tensors
(tests/op_emulator.py: each sequence through the dense emulation).  Where the extension
defines the ops the emulations become their CPU kernels; where it does not (no extension,
as here on CPU-only machines) stand-in ops with the contract's schemas get ops.py's fake
kernels, autograd formula and deterministic variant (ops.register_varlen), so this file
runs everywhere.  Checked: flash_attn_varlen_func's argument checks (every malformed input
the host can see raises before any launch), what reaches the ops (offsets, lengths, windows,
scale, determinism), outputs and gradients against the per-sequence float32 reference by
FlashAttention's rule, fake kernels (FakeTensorMode, meta), torch.compile / torch.export /
opcheck.  torch's registry route and the transformers integration are in
test_varlen_integrations_cpu.py.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import flash_attn_hopper
from flash_attn_hopper import _build_info, ops, support
from flash_attn_hopper import flash_attn_varlen_func

from helpers.grads import EMULATION_REL_NORM, assert_grads_close, deterministic_algorithms
from helpers.inputs import varlen_qkv
from helpers.kernels import compiled_config
from helpers.graphs import GraphRecorder
from helpers.varlen import check_forward, check_varlen_grads, inputs
from op_emulator import emulate_varlen_bwd, emulate_varlen_fwd, emulated_varlen_ops

FP16 = torch.float16
BF16 = torch.bfloat16


@pytest.fixture
def varlen_kernels(monkeypatch):
    """The varlen ops' emulations on CPU, reachable through flash_attn_varlen_func; yields (fwd, bwd) recorders."""
    with emulated_varlen_ops(monkeypatch) as recorders:
        yield recorders


def varlen_grads(q, k, v, dout, *args, **kwargs):
    """(out, (dq, dk, dv)) of flash_attn_varlen_func(q, k, v, *args, **kwargs) on fresh leaves."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = flash_attn_varlen_func(q, k, v, *args, **kwargs)
    return out, torch.autograd.grad(out, (q, k, v), dout)


# --------------------------------------------------------------------------
# The contract
# --------------------------------------------------------------------------


def test_schema_constants_agree():
    fwd = torch._C.parse_schema(f"flash_attn_hopper::{ops.VARLEN_FWD_SCHEMA}")
    bwd = torch._C.parse_schema(f"flash_attn_hopper::{ops.VARLEN_BWD_SCHEMA}")
    assert tuple(a.name for a in fwd.arguments) == ops.VARLEN_FWD_SCHEMA_ARGS
    assert tuple(a.name for a in bwd.arguments) == ops.VARLEN_BWD_SCHEMA_ARGS
    assert [str(a.type) for a in fwd.arguments] == (
        ["Tensor"] * 5 + ["Optional[Tensor]"] * 2
        + ["int", "int", "float", "bool", "int", "int", "bool", "float", "Optional[Tensor]", "int", "int"]
    )
    assert [str(a.type) for a in bwd.arguments] == (
        ["Tensor"] * 8 + ["Optional[Tensor]"] * 2
        + ["int", "int", "float", "bool", "int", "int", "bool", "bool", "float", "Optional[Tensor]"]
    )
    assert [a.default_value for a in fwd.arguments[11:]] == [-1, -1, False, 0.0, None, 1, 1]
    assert [a.default_value for a in bwd.arguments[14:]] == [-1, -1, False, False, 0.0, None]
    assert [r.name for r in fwd.returns] == ["out", "softmax_lse"]
    assert [r.name for r in bwd.returns] == ["dq", "dk", "dv", "dsink"]
    # The varlen ops share the dense ones' tail: fwd's window arguments, bwd's determinism.
    dense = torch._C.parse_schema(f"flash_attn_hopper::{ops.BWD_SCHEMA}")
    assert [a.name for a in bwd.arguments[12:]] == [a.name for a in dense.arguments[6:]]
    if ops.extension_loaded() and ops.has_varlen_fwd_op():  # a build of this version: the compiled ops are the contract
        assert str(torch.ops.flash_attn_hopper.varlen_fwd.default._schema) == str(fwd)
        if ops.has_varlen_bwd_op():
            assert str(torch.ops.flash_attn_hopper.varlen_bwd.default._schema) == str(bwd)


def test_deterministic_variant_has_varlen_fwds_schema(varlen_kernels):
    fwd = torch.ops.flash_attn_hopper.varlen_fwd.default._schema
    det = getattr(torch.ops.flash_attn_hopper, ops.VARLEN_DETERMINISTIC_FWD_NAME).default._schema
    assert [(a.name, str(a.type), a.default_value) for a in det.arguments] == [
        (a.name, str(a.type), a.default_value) for a in fwd.arguments
    ]
    assert [r.name for r in det.returns] == [r.name for r in fwd.returns]


def test_stand_in_ops_are_removed_again(monkeypatch):
    if ops.has_varlen_fwd_op() and ops.extension_loaded():
        pytest.skip("this build defines the varlen ops itself")
    with emulated_varlen_ops(monkeypatch):
        assert ops.has_varlen_fwd_op() and ops.has_varlen_bwd_op()
    assert not ops.has_varlen_fwd_op() and not ops.has_varlen_bwd_op()
    assert not hasattr(torch.ops.flash_attn_hopper, ops.VARLEN_DETERMINISTIC_FWD_NAME)


def test_emulated_varlen_backward_is_autograd_through_the_emulated_forward():
    """The emulation's backward (which the wiring tests lean on) against torch's autograd, in float32."""
    q, k, v, dout, cu_q, cu_k, max_q, max_k = inputs([5, 0, 1, 9, 4], [7, 3, 0, 9, 2], hq=6, hk=2, dtype=torch.float32)
    seqused = torch.tensor([5, 0, 1, 6, 2], dtype=torch.int32)
    for causal, left, right, used in [(False, -1, -1, None), (True, -1, -1, None), (False, 3, 2, seqused)]:
        args = (cu_q, cu_k, used, None, max_q, max_k, 0.2, causal, left, right)
        out, lse = emulate_varlen_fwd(q, k, v, *args)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = torch.autograd.grad(emulate_varlen_fwd(*leaves, *args)[0], leaves, dout)
        got = emulate_varlen_bwd(dout, q, k, v, out, lse, *args)[:3]
        assert_grads_close(got, ref, max_rel_norm=EMULATION_REL_NORM, what=f"{args[6:]}")


# --------------------------------------------------------------------------
# Forward and backward against the per-sequence reference
# --------------------------------------------------------------------------

CASES = {
    # id: (lens_q, lens_k, hq, hk, causal, window_size)
    "random_with_0_and_1": ([5, 0, 1, 17, 9], None, 4, 2, False, (-1, -1)),
    "random_with_0_and_1_causal": ([5, 0, 1, 17, 9], None, 4, 2, True, (-1, -1)),
    "all_equal": ([16, 16, 16, 16], None, 4, 4, True, (-1, -1)),
    "one_long_among_short": ([1, 2, 70, 3, 1], None, 6, 2, True, (-1, -1)),
    "q_and_k_differ_bottom_right": ([3, 10, 0, 7, 12], [9, 4, 5, 7, 0], 4, 1, True, (-1, -1)),  # rows without keys
    "mqa_not_causal": ([3, 10, 7], [9, 4, 7], 4, 1, False, (-1, -1)),
    "window": ([20, 33, 1], None, 4, 2, False, (5, 3)),
    "window_left_causal": ([20, 33, 4], [25, 30, 9], 4, 2, True, (6, -1)),
    "window_right_only": ([20, 33], [12, 40], 4, 4, False, (-1, 4)),
    "single_sequence": ([41], [57], 4, 2, True, (-1, -1)),
}


@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_the_reference(varlen_kernels, case, dtype):
    fwd, _ = varlen_kernels
    lens_q, lens_k, hq, hk, causal, window = CASES[case]
    q, k, v, _, cu_q, cu_k, max_q, max_k = inputs(lens_q, lens_k, hq, hk, dtype=dtype, seed=len(case))
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, window_size=window,
                                      return_attn_probs=True)
    check_forward(out, lse, q, k, v, cu_q, cu_k, causal=causal, window_size=window)
    (call,) = fwd.calls
    assert call["cu_seqlens_q"] is cu_q and call["cu_seqlens_k"] is cu_k
    assert call["seqused_q"] is None and call["seqused_k"] is None
    assert (call["max_seqlen_q"], call["max_seqlen_k"]) == (max_q, max_k)
    assert call["softmax_scale"] == pytest.approx(64**-0.5) and call["top_left"] is False


@pytest.mark.parametrize("case", list(CASES))
def test_gradients_match_the_reference(varlen_kernels, case):
    fwd, bwd = varlen_kernels
    lens_q, lens_k, hq, hk, causal, window = CASES[case]
    q, k, v, dout, cu_q, cu_k, max_q, max_k = inputs(lens_q, lens_k, hq, hk, seed=len(case) + 1)
    _, grads = varlen_grads(q, k, v, dout, cu_q, cu_k, max_q, max_k, causal=causal, window_size=window)
    check_varlen_grads(grads, q, k, v, dout, cu_q, cu_k, causal=causal, window_size=window)
    (f,), (b,) = fwd.calls, bwd.calls
    # The backward gets exactly what the forward got, and the forward's own outputs.
    for name in ("cu_seqlens_q", "cu_seqlens_k", "seqused_q", "seqused_k", "max_seqlen_q", "max_seqlen_k",
                 "softmax_scale", "causal", "window_size_left", "window_size_right", "top_left"):
        assert b[name] is f[name] or b[name] == f[name], name
    assert b["deterministic"] is False
    assert b["softmax_lse"].shape == (hq, sum(lens_q))


def test_head_dims_not_a_multiple_of_8_run_zero_padded(varlen_kernels):
    fwd, bwd = varlen_kernels
    q, k, v, dout, cu_q, cu_k, max_q, max_k = inputs([5, 0, 17], [9, 3, 1], hq=4, hk=2, d=59, seed=59)
    out, grads = varlen_grads(q, k, v, dout, cu_q, cu_k, max_q, max_k, causal=True)
    assert out.shape == q.shape
    check_varlen_grads(grads, q, k, v, dout, cu_q, cu_k, causal=True)
    (f,), (b,) = fwd.calls, bwd.calls
    assert f["q"].shape[-1] == 64 and f["softmax_scale"] == pytest.approx(59**-0.5) == b["softmax_scale"]



@pytest.mark.parametrize("d, dv, calls, width", [(128, 64, 1, 128), (64, 512, 8, 64), (192, 128, 1, 128)])
def test_a_value_head_dim_other_than_qs(varlen_kernels, d, dv, calls, width):
    """dv != d: the forward's and the backward's kernels take 192 / 128 as it is; other pairs one call on q, k, v padded to one width, or past 256 a call per
    piece of v's head dim."""
    fwd, bwd = varlen_kernels
    q, k, _, _, cu_q, cu_k, max_q, max_k = inputs([5, 0, 17], [9, 3, 1], hq=4, hk=2, d=d, seed=d)
    _, _, v, dout, *_ = inputs([5, 0, 17], [9, 3, 1], hq=4, hk=2, d=dv, seed=dv)
    out, grads = varlen_grads(q, k, v, dout, cu_q, cu_k, max_q, max_k, causal=True)
    assert out.shape == (*q.shape[:-1], dv) and [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    check_varlen_grads(grads, q, k, v, dout, cu_q, cu_k, causal=True)
    assert len(fwd.calls) == calls == len(bwd.calls) and all(c["v"].shape[-1] == width for c in fwd.calls)
    assert all(b[n].shape[-1] == f["v"].shape[-1] for f, b in zip(fwd.calls, bwd.calls) for n in ("v", "out", "dout"))
    assert fwd.calls[0]["softmax_scale"] == pytest.approx(d**-0.5) == bwd.calls[0]["softmax_scale"]


def test_effective_windows_reach_the_op(varlen_kernels):
    fwd, _ = varlen_kernels
    q, k, v, _, cu_q, cu_k, max_q, max_k = inputs([10, 30], [20, 12])  # max_q 30, max_k 20
    for window, causal, expected in [
        ((-1, -1), False, (False, -1, -1)),
        ((-1, -1), True, (True, -1, 0)),
        ((-1, 0), False, (True, -1, 0)),  # a window that is causal becomes causal
        ((19, 29), False, (False, -1, -1)),  # sides reaching max_seqlen - 1 are unbounded for every sequence
        ((18, 28), False, (False, 18, 28)),
        ((4, 7), True, (True, 4, 0)),
    ]:
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, window_size=window)
        call = fwd.calls[-1]
        assert (call["causal"], call["window_size_left"], call["window_size_right"]) == expected, window


def test_seqused_shorter_than_segments(varlen_kernels):
    fwd, bwd = varlen_kernels
    segments_q, segments_k = [8, 5, 12, 0, 6], [9, 5, 3, 4, 6]
    q, k, v, dout, cu_q, cu_k, _, _ = inputs(segments_q, segments_k, seed=3)
    used_q = torch.tensor([5, 0, 12, 0, 1], dtype=torch.int32)
    used_k = torch.tensor([9, 3, 1, 0, 6], dtype=torch.int32)
    kwargs = dict(seqused_q=used_q, seqused_k=used_k, causal=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = flash_attn_varlen_func(*leaves, cu_q, cu_k, 12, 9, return_attn_probs=True, **kwargs)
    grads = torch.autograd.grad(out, leaves, dout)
    check_forward(out, lse, q, k, v, cu_q, cu_k, used_q, used_k, causal=True)
    check_varlen_grads(grads, q, k, v, dout, cu_q, cu_k, used_q, used_k, causal=True)
    # Rows outside every used part: out 0, lse -inf, gradients 0.
    unused_q = torch.ones(q.size(0), dtype=torch.bool)
    for start, n in zip(cu_q.tolist(), used_q.tolist()):
        unused_q[start : start + n] = False
    unused_k = torch.ones(k.size(0), dtype=torch.bool)
    for start, n in zip(cu_k.tolist(), used_k.tolist()):
        unused_k[start : start + n] = False
    assert unused_q.any() and unused_k.any()
    assert torch.equal(out[unused_q], torch.zeros_like(out[unused_q]))
    assert torch.isneginf(lse[:, unused_q]).all()
    assert not grads[0][unused_q].any() and not grads[1][unused_k].any() and not grads[2][unused_k].any()
    assert fwd.calls[0]["seqused_q"] is used_q and bwd.calls[0]["seqused_k"] is used_k


def test_seqused_k_alone(varlen_kernels):
    # vLLM's decoding call: one query per sequence over a KV cache filled up to seqused_k.
    q, k, v, _, cu_q, cu_k, _, max_k = inputs([1, 1, 1], [16, 16, 16], hq=8, hk=2, seed=5)
    used_k = torch.tensor([16, 3, 9], dtype=torch.int32)
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1, max_k, seqused_k=used_k, causal=True,
                                      return_attn_probs=True)
    check_forward(out, lse, q, k, v, cu_q, cu_k, None, used_k, causal=True)


@pytest.mark.parametrize("layout", ["every_other_head", "row_gap", "packed"])
def test_non_contiguous_inputs_are_read_in_place(varlen_kernels, layout):
    fwd, bwd = varlen_kernels
    q, k, v, dout, cu_q, cu_k, max_q, max_k = inputs([7, 1, 12], hq=4, hk=2, layout=layout, seed=6)
    assert not q.is_contiguous()
    _, grads = varlen_grads(q, k, v, dout, cu_q, cu_k, max_q, max_k, causal=True)
    check_varlen_grads(grads, q, k, v, dout, cu_q, cu_k, causal=True)
    call = fwd.calls[0]
    assert call["q"].stride() == q.stride() and call["k"].stride() == k.stride()  # no copies on the way
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


def test_a_broadcast_or_strided_gradient_reaches_the_backward_readable(varlen_kernels):
    _, bwd = varlen_kernels
    q, k, v, _, cu_q, cu_k, max_q, max_k = inputs([7, 5], seed=7)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flash_attn_varlen_func(*leaves, cu_q, cu_k, max_q, max_k)
    out.sum().backward()  # autograd hands over an expanded (all strides 0) gradient
    dout = bwd.calls[0]["dout"]
    assert dout.stride(-1) == 1 and all(s != 0 for s in dout.stride())


def test_gradient_of_lse_alone_is_zero_without_a_backward_call(varlen_kernels):
    _, bwd = varlen_kernels
    q, k, v, _, cu_q, cu_k, max_q, max_k = inputs([7, 5], seed=8)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    _, lse = flash_attn_varlen_func(*leaves, cu_q, cu_k, max_q, max_k, return_attn_probs=True)
    grads = torch.autograd.grad(lse[torch.isfinite(lse)].sum(), leaves)
    assert all(not g.any() for g in grads) and bwd.calls == []


def test_deterministic_reaches_the_backward(varlen_kernels):
    fwd, bwd = varlen_kernels
    q, k, v, dout, cu_q, cu_k, max_q, max_k = inputs([9, 4], seed=9)
    varlen_grads(q, k, v, dout, cu_q, cu_k, max_q, max_k, deterministic=True)
    varlen_grads(q, k, v, dout, cu_q, cu_k, max_q, max_k)
    with deterministic_algorithms():  # torch's switch at the forward call
        varlen_grads(q, k, v, dout, cu_q, cu_k, max_q, max_k)
    assert [c["deterministic"] for c in bwd.calls] == [True, False, True]
    assert len(fwd.calls) == 3  # the deterministic variant runs varlen_fwd's kernel


def test_custom_scale_and_default_scale_of_the_head_dim(varlen_kernels):
    fwd, bwd = varlen_kernels
    q, k, v, dout, cu_q, cu_k, max_q, max_k = inputs([9, 4], d=72, seed=10)
    _, grads = varlen_grads(q, k, v, dout, cu_q, cu_k, max_q, max_k, softmax_scale=0.3)
    check_varlen_grads(grads, q, k, v, dout, cu_q, cu_k, softmax_scale=0.3)
    flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k)
    assert [c["softmax_scale"] for c in fwd.calls] == [0.3, pytest.approx(72**-0.5)]
    assert bwd.calls[0]["softmax_scale"] == 0.3


def test_scheduling_hints_are_ignored(varlen_kernels):
    q, k, v, _, cu_q, cu_k, max_q, max_k = inputs([9, 4], seed=11)
    base = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
    hinted = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True, num_splits=4, pack_gqa=True)
    assert torch.equal(base, hinted)


def test_empty_batch_and_empty_sequences_reach_the_op(varlen_kernels):
    fwd, _ = varlen_kernels
    q, k, v, _, cu_q, cu_k, _, _ = inputs([0, 0], [0, 3])
    out, lse = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 0, 3, return_attn_probs=True)
    assert out.shape == (0, 4, 64) and lse.shape == (4, 0)
    none = torch.zeros(1, dtype=torch.int32)
    out = flash_attn_varlen_func(q, k, v, none, none, 0, 0)  # batch 0
    assert out.shape == (0, 4, 64) and len(fwd.calls) == 2


# --------------------------------------------------------------------------
# What is refused, before any launch
# --------------------------------------------------------------------------


def _valid(dtype=BF16, d=64):
    q, k, v, _, cu_q, cu_k, max_q, max_k = varlen_qkv([4, 6], hq=4, hk=2, d=d, dtype=dtype, device="cpu")
    return dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k)


I32 = torch.int32
MALFORMED = {
    # id: (changes to a valid call, exception, fragments of its message)
    "cu_q_int64": (dict(cu_seqlens_q=torch.tensor([0, 4, 10])), ValueError, ["cu_seqlens_q", "torch.int64", "torch.int32"]),
    "cu_k_float": (dict(cu_seqlens_k=torch.tensor([0.0, 4.0, 10.0])), ValueError, ["cu_seqlens_k", "int32"]),
    "cu_q_2d": (dict(cu_seqlens_q=torch.tensor([[0, 4, 10]], dtype=I32)), ValueError, ["1-dimensional", "(1, 3)"]),
    "cu_q_empty": (dict(cu_seqlens_q=torch.zeros(0, dtype=I32)), ValueError, ["cu_seqlens_q is empty"]),
    "cu_q_strided": (dict(cu_seqlens_q=torch.tensor([0, 9, 4, 9, 10, 9], dtype=I32)[::2]), ValueError, ["contiguous"]),
    "cu_q_list": (dict(cu_seqlens_q=[0, 4, 10]), TypeError, ["cu_seqlens_q must be a torch.Tensor", "list"]),
    "cu_k_none": (dict(cu_seqlens_k=None), TypeError, ["cu_seqlens_k must be a torch.Tensor"]),
    "cu_on_meta": (dict(cu_seqlens_k=torch.zeros(3, dtype=I32, device="meta")), ValueError, ["cu_seqlens_k is on meta", "q is on cpu"]),
    "batch_mismatch": (dict(cu_seqlens_k=torch.tensor([0, 4, 8, 10], dtype=I32)), ValueError, ["batch size mismatch", "2 sequences", "3 sequences"]),
    "seqused_q_length": (dict(seqused_q=torch.tensor([4, 6, 1], dtype=I32)), ValueError, ["seqused_q has 3 entries", "2 sequences"]),
    "seqused_k_int64": (dict(seqused_k=torch.tensor([4, 6])), ValueError, ["seqused_k", "int32"]),
    "seqused_k_0d": (dict(seqused_k=torch.tensor(4, dtype=I32)), ValueError, ["seqused_k must be 1-dimensional"]),
    "seqused_k_list": (dict(seqused_k=[4, 6]), TypeError, ["seqused_k must be a torch.Tensor"]),
    "max_q_float": (dict(max_seqlen_q=6.0), TypeError, ["max_seqlen_q must be a Python int", "float"]),
    "max_q_tensor": (dict(max_seqlen_q=torch.tensor(6)), TypeError, ["max_seqlen_q must be a Python int", "Tensor"]),
    "max_k_bool": (dict(max_seqlen_k=True), TypeError, ["max_seqlen_k must be a Python int", "bool"]),
    "max_k_none": (dict(max_seqlen_k=None), TypeError, ["max_seqlen_k must be a Python int"]),
    "max_k_negative": (dict(max_seqlen_k=-1), ValueError, ["max_seqlen_k=-1 is negative"]),
    "max_over_limit": (dict(max_seqlen_q=2**29, max_seqlen_k=6), ValueError, ["max_seqlen_q + max_seqlen_k", "2**29 - 1"]),
    "batch_over_limit": (dict(cu_seqlens_q=torch.zeros(65537, dtype=I32), cu_seqlens_k=torch.zeros(65537, dtype=I32)), ValueError, ["batch 65536"]),
    "q_4d": (dict(q=torch.zeros(2, 5, 4, 64, dtype=BF16)), ValueError, ["q must have 3 dimensions", "flash_attn_func"]),
    "k_2d": (dict(k=torch.zeros(10, 64, dtype=BF16)), ValueError, ["k must have 3 dimensions", "(total_k, nheads_kv, headdim)"]),
    "q_float32": (dict(q=torch.zeros(10, 4, 64)), ValueError, ["q has dtype torch.float32", "float16"]),
    "v_other_dtype": (dict(v=torch.zeros(10, 2, 64, dtype=FP16)), ValueError, ["v has dtype torch.float16", "different dtypes"]),
    "kv_shapes_differ": (dict(v=torch.zeros(9, 2, 64, dtype=BF16)), ValueError, ["k and v must have the same shape"]),
    "head_dim_mismatch": (dict(k=torch.zeros(10, 2, 32, dtype=BF16), v=torch.zeros(10, 2, 32, dtype=BF16)), ValueError, ["head dim mismatch"]),
    "head_dim_264": (dict(q=torch.zeros(10, 4, 264, dtype=BF16), k=torch.zeros(10, 2, 264, dtype=BF16), v=torch.zeros(10, 2, 264, dtype=BF16)), ValueError, ["head dim 264"]),
    "heads_not_multiple": (dict(k=torch.zeros(10, 3, 64, dtype=BF16), v=torch.zeros(10, 3, 64, dtype=BF16)), ValueError, ["multiple of nheads_kv (3)"]),
    "q_last_dim_strided": (dict(q=torch.zeros(10, 4, 128, dtype=BF16)[..., ::2]), ValueError, ["q's last dimension must be contiguous"]),
    "q_not_a_tensor": (dict(q=[[0.0]]), TypeError, ["q must be a torch.Tensor"]),
    "negative_window": (dict(window_size=(-2, 0)), ValueError, ["window_size entries must be >= -1"]),
    "window_not_a_pair": (dict(window_size=5), ValueError, ["window_size must be a pair"]),
    "scale_zero": (dict(softmax_scale=0.0), ValueError, ["softmax_scale=0.0 is not positive"]),
    "scale_tensor": (dict(softmax_scale=torch.tensor(0.1)), TypeError, ["softmax_scale must be a Python float"]),
    "causal_int": (dict(causal=1), TypeError, ["causal must be a bool"]),
    "deterministic_int": (dict(deterministic=1), TypeError, ["deterministic must be a bool"]),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_inputs_are_refused_before_any_launch(case):
    changes, error, fragments = MALFORMED[case]
    call = dict(_valid(), **changes)
    with pytest.raises(error) as info:
        flash_attn_varlen_func(**call)
    for fragment in fragments:
        assert fragment in str(info.value), f"{fragment!r} not in: {info.value}"


def test_features_of_other_issues_are_refused():
    with pytest.raises(RuntimeError) as info:
        flash_attn_varlen_func(**_valid(), sm_margin=4)
    for fragment in ["not available in this version", "sm_margin=4"]:
        assert fragment in str(info.value)


def test_descales_with_16_bit_inputs_are_refused():
    with pytest.raises(ValueError, match="v_descale applies to FP8"):
        flash_attn_varlen_func(**_valid(), v_descale=torch.ones(1))


def test_a_valid_call_on_cpu_stops_at_the_device_check():
    hdim, dtype = compiled_config()  # a compiled pair: the refusal is the device's, not the build's
    with pytest.raises(ValueError, match="are on cpu; flash_attn_hopper runs on NVIDIA Hopper"):
        flash_attn_varlen_func(**_valid(dtype, hdim))


def test_a_build_without_the_varlen_op_is_refused_with_the_rebuild_hint(monkeypatch):
    monkeypatch.setattr(support, "device_refusal", lambda q, k, v, names=None: None)
    monkeypatch.setattr(_build_info, "COMPILED", None)
    monkeypatch.setattr(ops, "has_varlen_fwd_op", lambda: False)
    with pytest.raises(RuntimeError, match="no variable-length op.*Rebuild it"):
        flash_attn_varlen_func(**_valid())


def test_a_varlen_op_with_other_arguments_is_refused_by_name(monkeypatch):
    if ops.has_varlen_fwd_op():
        pytest.skip("this build defines varlen_fwd; no stand-in with another schema can replace it")
    monkeypatch.setattr(support, "device_refusal", lambda q, k, v, names=None: None)
    monkeypatch.setattr(_build_info, "COMPILED", None)
    library = torch.library.Library("flash_attn_hopper", "FRAGMENT")
    try:
        library.define(ops.VARLEN_FWD_SCHEMA.replace("Tensor? seqused_q", "Tensor? used_q"))
        with pytest.raises(RuntimeError, match="out of step"):
            flash_attn_varlen_func(**_valid())
    finally:
        library._destroy()


def test_without_a_varlen_bwd_op_gradients_raise_the_reason(monkeypatch):
    with emulated_varlen_ops(monkeypatch, backward=False):
        q, k, v, dout, cu_q, cu_k, max_q, max_k = inputs([5, 3])
        with torch.no_grad():  # inference needs no backward
            flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k)
        with pytest.raises(RuntimeError, match="gradients through flash_attn_varlen_func cannot be computed"):
            varlen_grads(q, k, v, dout, cu_q, cu_k, max_q, max_k)


def test_build_info_reports_varlen_of_this_build(monkeypatch):
    assert flash_attn_hopper.build_info()["features"]["varlen"] is ops.has_varlen_fwd_op()
    with emulated_varlen_ops(monkeypatch):
        assert flash_attn_hopper.build_info()["features"]["varlen"] is True


# --------------------------------------------------------------------------
# Fake kernels, torch.compile, torch.export, opcheck
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cuda", "meta"])
def test_fake_kernels_give_the_contract_shapes(varlen_kernels, device):
    def run():
        q = torch.empty(37, 8, 128, dtype=BF16, device=device)
        k = torch.empty(50, 2, 128, dtype=BF16, device=device)[:, :, :]
        cu = torch.zeros(4, dtype=torch.int32, device=device)
        out, lse = flash_attn_varlen_func(q, k, k, cu, cu, 20, 30, causal=True, return_attn_probs=True)
        assert out.shape == (37, 8, 128) and out.dtype == BF16 and out.device.type == device
        assert lse.shape == (8, 37) and lse.dtype == torch.float32
        bwd = torch.ops.flash_attn_hopper.varlen_bwd.default
        dq, dk, dv, dsink = bwd(out, q, k, k, out, lse, cu, cu, None, None, 20, 30, 0.1, True)
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape) and dq.is_contiguous()
        assert dsink.shape == (0,) and dsink.dtype == torch.float32

    if device == "meta":
        run()
    else:
        with FakeTensorMode():
            run()


def _op_nodes(gm, name):
    return [n for n in gm.graph.nodes if n.op == "call_function" and str(n.target).startswith(f"flash_attn_hopper.{name}")]


@pytest.mark.parametrize("deterministic", [False, True])
def test_compile_fullgraph_forward_and_backward(varlen_kernels, deterministic):
    q, k, v, dout, cu_q, cu_k, max_q, max_k = inputs([9, 1, 14], [9, 6, 20], seed=12)

    def block(q, k, v):
        out = flash_attn_varlen_func(q * 1.5, k, v, cu_q, cu_k, max_q, max_k, causal=True, window_size=(6, 0),
                                     deterministic=deterministic)
        return out * 2

    torch._dynamo.reset()
    recorder = GraphRecorder()
    compiled = torch.compile(block, fullgraph=True, backend=recorder.backend())
    try:
        _, grads = varlen_grads_of(compiled, q, k, v, dout)
    finally:
        torch._dynamo.reset()
    _, eager = varlen_grads_of(block, q, k, v, dout)
    for a, b in zip(grads, eager):
        assert torch.equal(a, b)
    (fw_graph,), (bw_graph,) = recorder.forward, recorder.backward
    name = ops.VARLEN_DETERMINISTIC_FWD_NAME if deterministic else "varlen_fwd."
    assert len(_op_nodes(fw_graph, name)) == 1
    (node,) = _op_nodes(bw_graph, "varlen_bwd")
    assert node.args[-1] is deterministic or node.kwargs.get("deterministic", False) is deterministic


def varlen_grads_of(fn, q, k, v, dout):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    return out, torch.autograd.grad(out, (q, k, v), dout)


def test_export_records_which_backward_the_forward_wants(varlen_kernels):
    q, k, v, _, cu_q, cu_k, max_q, max_k = inputs([9, 5], seed=13)

    class Attention(torch.nn.Module):
        def __init__(self, deterministic):
            super().__init__()
            self.deterministic = deterministic

        def forward(self, q, k, v, cu_q, cu_k):
            return flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True,
                                          deterministic=self.deterministic)

    for deterministic, name in ((False, "varlen_fwd"), (True, ops.VARLEN_DETERMINISTIC_FWD_NAME)):
        exported = torch.export.export(Attention(deterministic), (q, k, v, cu_q, cu_k))
        targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
        assert any(t.startswith(f"flash_attn_hopper.{name}.") for t in targets), targets
        assert torch.equal(exported.module()(q, k, v, cu_q, cu_k), Attention(deterministic)(q, k, v, cu_q, cu_k))


def test_opcheck_of_the_varlen_ops(varlen_kernels):
    q, k, v, dout, cu_q, cu_k, max_q, max_k = inputs([9, 0, 5], [7, 3, 5], seed=14, dtype=torch.float32)
    q, k, v = (t.to(FP16).requires_grad_() for t in (q, k, v))
    used = torch.tensor([9, 0, 2], dtype=torch.int32)
    fwd_args = (q, k, v, cu_q, cu_k, used, None, max_q, max_k, 0.125, True, 3, 0)
    torch.library.opcheck(torch.ops.flash_attn_hopper.varlen_fwd.default, fwd_args)
    det = getattr(torch.ops.flash_attn_hopper, ops.VARLEN_DETERMINISTIC_FWD_NAME).default
    torch.library.opcheck(det, fwd_args)
    out, lse = torch.ops.flash_attn_hopper.varlen_fwd.default(*(t.detach() if isinstance(t, torch.Tensor) else t for t in fwd_args))
    bwd_args = (dout.to(FP16), q.detach(), k.detach(), v.detach(), out, lse, cu_q, cu_k, used, None, max_q, max_k,
                0.125, True, 3, 0, False, True)
    torch.library.opcheck(torch.ops.flash_attn_hopper.varlen_bwd.default, bwd_args)
    sink = torch.randn(q.size(1), generator=torch.Generator().manual_seed(15)).to(q.device)
    plain = tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in fwd_args)
    out_s, lse_s = torch.ops.flash_attn_hopper.varlen_fwd.default(*plain, False, 0.0, sink)
    torch.library.opcheck(torch.ops.flash_attn_hopper.varlen_bwd.default,
                          (*bwd_args[:4], out_s, lse_s, *bwd_args[6:], 0.0, sink))
