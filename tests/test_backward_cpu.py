"""The backward's Python side without a GPU: what the autograd formula hands the bwd op,
and what comes back to the caller.

The forward op runs a float32 emulation of its contract on CPU tensors and the bwd op
one of its own (tests/op_emulator.py: P recomputed from the forward's lse, D from the
forward's output, the kernel's maths); in a build without the bwd op (CI's) a stand-in
with the contract's schema (ops.BWD_SCHEMA) and ops.py's fake kernel takes its place.
So gradients through flash_attn_func, the SDPA drop-in and torch.compile are checked
against autograd through the float32 reference, and a wrong window, alignment, scale or
saved tensor handed to the backward shows up as a wrong gradient.  The kernel's own
numbers are the GPU tests' business (test_flash_bwd.py).
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import flash_attn_hopper
from flash_attn_hopper import _build_info, manifest, ops, sdpa, support

import op_emulator
from helpers.grads import EMULATION_REL_NORM, assert_grads_close, check_grads, deterministic_algorithms, grads_of
from helpers.inputs import cpu_inputs
from helpers.kernels import compiled_config, needs_extension
from helpers.graphs import GraphRecorder
from op_emulator import emulate_bwd, emulate_fwd, emulated_bwd_op, emulated_kernels, emulated_op

pytestmark = needs_extension("the ops' autograd formulas are registered with the compiled extension only")

DTYPE = torch.float16  # the emulations compute in float32; fp16 inputs keep the comparisons sharp


@pytest.fixture
def kernels(monkeypatch):
    with emulated_kernels(monkeypatch) as recorders:  # (fwd, bwd)
        yield recorders


def random_qkv(b=2, sq=37, sk=53, hq=4, hk=2, d=64, seed=0, dtype=DTYPE):
    return cpu_inputs(b, sq, sk, hq, hk, d, seed, dtype)


def check_emulated_grads(grads, q, k, v, dout, what="", **kwargs):
    """FlashAttention's rule against autograd through tests/reference.py, and the emulation's relative error norm."""
    check_grads(grads, q, k, v, dout, max_rel_norm=EMULATION_REL_NORM, what=what, **kwargs)


# --------------------------------------------------------------------------
# The contract
# --------------------------------------------------------------------------


def test_schema_constants_agree():
    schema = torch._C.parse_schema(f"flash_attn_hopper::{ops.BWD_SCHEMA}")
    assert tuple(a.name for a in schema.arguments) == ops.BWD_SCHEMA_ARGS
    assert [str(a.type) for a in schema.arguments] == (
        ["Tensor"] * 6 + ["float", "bool", "int", "int", "bool", "bool", "float", "Optional[Tensor]"]
    )
    # The window/alignment/determinism/softcap/sink arguments default to fwd's defaults and to the fast backward.
    assert [a.default_value for a in schema.arguments[8:]] == [-1, -1, False, False, 0.0, None]
    assert [r.name for r in schema.returns] == ["dq", "dk", "dv", "dsink"]
    if ops.has_bwd_op():  # a build with the backward: the compiled op is the contract
        assert str(torch.ops.flash_attn_hopper.bwd.default._schema) == str(schema)


def test_deterministic_forward_op_has_fwds_schema():
    fwd = torch.ops.flash_attn_hopper.fwd.default._schema
    det = getattr(torch.ops.flash_attn_hopper, ops.DETERMINISTIC_FWD_NAME).default._schema
    assert [(a.name, str(a.type), a.default_value) for a in det.arguments] == [
        (a.name, str(a.type), a.default_value) for a in fwd.arguments
    ]
    assert [r.name for r in det.returns] == [r.name for r in fwd.returns]


def test_emulated_backward_is_autograd_through_the_emulated_forward():
    """The stand-in's maths (which the wiring tests below lean on) against torch's autograd."""
    q, k, v, dout = random_qkv(hq=6, hk=2, seed=1, dtype=torch.float32)
    for causal, left, right, top_left in [(False, -1, -1, False), (True, -1, -1, True), (False, 5, 3, False)]:
        args = (0.2, causal, left, right, top_left)
        out, lse = emulate_fwd(q, k, v, *args)
        _, ref = grads_of(lambda q, k, v: emulate_fwd(q, k, v, *args)[0], q, k, v, dout)
        # float32 against float32: no low-precision error to scale, the relative error norm only.
        got = emulate_bwd(dout, q, k, v, out, lse, *args)[:3]
        assert_grads_close(got, ref, max_rel_norm=EMULATION_REL_NORM, what=f"{args}")


# --------------------------------------------------------------------------
# flash_attn_func: what reaches the backward, and the gradients that come out
# --------------------------------------------------------------------------

CASES = [
    # sq, sk, hq, hk, causal, window_size
    (37, 53, 4, 4, False, (-1, -1)),
    (37, 53, 6, 2, True, (-1, -1)),  # bottom-right causal, GQA
    (53, 37, 4, 1, True, (-1, -1)),  # the first 16 queries see no key; MQA
    (64, 64, 4, 2, False, (8, 0)),  # sliding window
    (45, 70, 4, 2, False, (-1, 9)),
    (70, 45, 2, 2, True, (12, -1)),  # causal with a left window
    (1, 40, 4, 2, True, (-1, -1)),  # decoding-shaped
]


@pytest.mark.parametrize("sq, sk, hq, hk, causal, window", CASES)
def test_flash_attn_func_gradients(kernels, sq, sk, hq, hk, causal, window):
    _, bwd = kernels
    q, k, v, dout = random_qkv(sq=sq, sk=sk, hq=hq, hk=hk, seed=sq * sk + hq)
    out, grads = grads_of(  # unpacked (decode shapes would pack: test_decode_shapes_pack_gqa_as_rows)
        lambda q, k, v: flash_attn_hopper.flash_attn_func(q, k, v, causal=causal, window_size=window, pack_gqa=False),
        q, k, v, dout
    )
    check_emulated_grads(grads, q, k, v, dout, f"causal={causal} window={window}", causal=causal, window_size=window)
    assert [g.dtype for g in grads] == [DTYPE] * 3
    (call,) = bwd.calls
    assert call["softmax_scale"] == pytest.approx(64**-0.5)
    assert call["top_left"] is False and call["deterministic"] is False
    assert call["dout"].data_ptr() == dout.data_ptr(), "dout was copied on its way to the kernel"
    assert torch.equal(call["out"], out)
    assert call["softmax_lse"].shape == (2, hq, sq) and call["softmax_lse"].dtype == torch.float32



@pytest.mark.parametrize("sq, causal, window, packs", [
    (1, True, (-1, -1), True),  # decode: one query sees every key, causal or not
    (5, False, (-1, -1), True),  # no mask
    (5, True, (-1, -1), False),  # causal with several queries: the rows see different keys
    (1, False, (3, 0), False),  # a window
])
def test_decode_shapes_pack_gqa_as_rows(kernels, sq, causal, window, packs):
    """The query heads of a KV head reach the op as rows of one head where that is exact (pack_gqa=None:
    at decode; True: always); out, lse and the gradients match the unpacked call's reference."""
    fwd, bwd = kernels
    q, k, v, dout = random_qkv(sq=sq, sk=53, hq=8, hk=2, seed=sq + 7)
    out, grads = grads_of(
        lambda q, k, v: flash_attn_hopper.flash_attn_func(q, k, v, causal=causal, window_size=window), q, k, v, dout
    )
    check_emulated_grads(grads, q, k, v, dout, f"sq={sq} causal={causal}", causal=causal, window_size=window)
    (f,), (b,) = fwd.calls, bwd.calls
    default_packs = packs and sq == 1  # None packs at decode; True wherever exact
    assert f[0].shape == ((2, sq * 4, 2, 64) if default_packs else q.shape)
    assert f[4] is (causal and not default_packs) and b["causal"] is f[4]
    flash_attn_hopper.flash_attn_func(q, k, v, causal=causal, window_size=window, pack_gqa=True)
    assert fwd.calls[-1][0].shape == ((2, sq * 4, 2, 64) if packs else q.shape)
    _, lse = flash_attn_hopper.flash_attn_func(q, k, v, causal=causal, window_size=window, return_attn_probs=True)
    _, lse_unpacked = flash_attn_hopper.flash_attn_func(q, k, v, causal=causal, window_size=window, pack_gqa=False,
                                                        return_attn_probs=True)
    assert lse.shape == (2, 8, sq) and torch.allclose(lse, lse_unpacked, atol=1e-5)
    with pytest.raises(TypeError, match="pack_gqa must be None, True or False"):
        flash_attn_hopper.flash_attn_func(q, k, v, pack_gqa=1)

@pytest.mark.parametrize("d", [59, 111, 4])
def test_head_dims_not_a_multiple_of_8_run_zero_padded(kernels, d):
    """FA3's odd head dims: the kernels see copies zero-padded to the next multiple of 8 and the
    real head dim's default scale; the output and the gradients have the real head dim."""
    fwd, bwd = kernels
    q, k, v, dout = random_qkv(sq=37, sk=53, hq=4, hk=2, d=d, seed=d)
    out, grads = grads_of(lambda q, k, v: flash_attn_hopper.flash_attn_func(q, k, v, causal=True), q, k, v, dout)
    assert out.shape == q.shape and [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    check_emulated_grads(grads, q, k, v, dout, f"d={d}", causal=True)
    (f,), (b,) = fwd.calls, bwd.calls
    padded = -(-d // 8) * 8
    assert f[0].shape[-1] == padded and f[3] == pytest.approx(d**-0.5) and b["softmax_scale"] == pytest.approx(d**-0.5)
    assert torch.equal(f[0][..., d:], torch.zeros_like(f[0][..., d:]))



@pytest.mark.parametrize("d, dv, calls, width", [
    (64, 256, 1, 256), (59, 100, 1, 104), (128, 64, 1, 128),  # one call, q, k, v padded to one width
    (64, 512, 8, 64), (128, 300, 3, 128),  # past the widest kernel: a call per piece of q's head dim
    (192, 128, 1, None), (160, 120, 1, None), (192, 96, 1, None),  # the forward's own dv != d kernels
])
def test_value_head_dims_other_than_qs(kernels, d, dv, calls, width):
    """FA3's dv != d: the forward kernels take 192 / 128 (any q head dim that rounds to 192, v's up
    to 128) as it is, and so do the backward kernels (v, out and dout at v's head dim); other
    pairs see q, k, v padded to one width (the larger head dim rounded up to 8) and q's default
    scale, or past 256 (FA3's 64 / 512) one call per piece of v's head dim over the same q and k;
    out and dv have v's head dim, dq and dk q's; out, the LSE and every gradient against the
    emulation of the whole problem."""
    fwd, bwd = kernels
    q, k, _, _ = random_qkv(sq=37, sk=53, hq=4, hk=2, d=d, seed=d + dv)
    _, _, v, dout = random_qkv(sq=37, sk=53, hq=4, hk=2, d=dv, seed=d * dv)
    out, grads = grads_of(lambda q, k, v: flash_attn_hopper.flash_attn_func(q, k, v, causal=True), q, k, v, dout)
    assert out.shape == (*q.shape[:-1], dv) and [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    check_emulated_grads(grads, q, k, v, dout, f"d={d} dv={dv}", causal=True)
    assert len(fwd.calls) == calls and len(bwd.calls) == calls
    if width is None:  # kernels of their own: q, k, v as they are, both ways
        assert [t.shape[-1] for t in fwd.calls[0][:3]] == [d, d, dv]
        assert [bwd.calls[0][n].shape[-1] for n in ("q", "k", "v", "out", "dout")] == [d, d, dv, dv, dv]
    else:
        assert all([t.shape[-1] for t in f[:3]] == [width] * 3 for f in fwd.calls)
    assert fwd.calls[0][3] == pytest.approx(d**-0.5) and bwd.calls[0]["softmax_scale"] == pytest.approx(d**-0.5)
    _, lse = flash_attn_hopper.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    _, lse_ref = emulate_fwd(q, k, v[..., :d], d**-0.5, True)
    assert torch.allclose(lse, lse_ref)


def test_q_head_dims_past_the_widest_kernel_are_refused(kernels):
    with pytest.raises(ValueError):
        flash_attn_hopper.flash_attn_func(torch.zeros(1, 4, 2, 320), torch.zeros(1, 4, 2, 320), torch.zeros(1, 4, 2, 512))


def test_window_arguments_reach_the_backward_as_the_forward_got_them(kernels):
    fwd, bwd = kernels
    q, k, v, dout = random_qkv(sq=64, sk=80, seed=3)
    for window, causal in [((8, 0), False), ((-1, 0), False), ((3, 5), False), ((10, -1), True), ((500, 500), False)]:
        fwd.calls.clear()
        bwd.calls.clear()
        grads_of(lambda q, k, v: flash_attn_hopper.flash_attn_func(q, k, v, causal=causal, window_size=window),
                 q, k, v, dout)
        (f,), (b,) = fwd.calls, bwd.calls
        assert (b["causal"], b["window_size_left"], b["window_size_right"], b["top_left"]) == tuple(f[4:8]), window


@pytest.mark.parametrize(
    "wrong",
    [(False, -1, -1, False), (True, -1, -1, False), (False, 8, 0, True), (False, 0, 8, False), (False, 8, 0, False)],
)
def test_a_wrong_backward_argument_would_be_caught(wrong):
    """The gradient checks above can fail: the backward of another mask or scale gives other gradients."""
    q, k, v, dout = random_qkv(sq=40, sk=64, seed=4)
    right_args, scale = (False, 8, 0, False), 0.125
    out, lse = emulate_fwd(q, k, v, scale, *right_args)
    right = emulate_bwd(dout, q, k, v, out, lse, scale, *right_args)[:3]
    got = emulate_bwd(dout, q, k, v, out, lse, scale * (1.5 if wrong == right_args else 1.0), *wrong)[:3]
    assert max((g.float() - r.float()).abs().max().item() for g, r in zip(got, right)) > 0.05, wrong


def test_custom_scale_and_qkvpacked(kernels):
    _, bwd = kernels
    q, k, v, dout = random_qkv(sq=33, sk=33, hq=4, hk=4, seed=5)
    qkv = torch.stack((q, k, v), dim=2).requires_grad_()  # (b, s, 3, h, d)
    out = flash_attn_hopper.flash_attn_qkvpacked_func(qkv, softmax_scale=0.3, causal=True)
    (dqkv,) = torch.autograd.grad(out, qkv, dout)
    check_emulated_grads(dqkv.unbind(dim=2), q, k, v, dout, "qkvpacked", causal=True, softmax_scale=0.3)
    assert [call["softmax_scale"] for call in bwd.calls] == [0.3]


def test_non_contiguous_inputs_and_gradient(kernels):
    _, bwd = kernels
    q, k, v, dout = random_qkv(sq=40, sk=40, hq=4, hk=2, seed=6)
    packed = torch.cat((q, k, v), dim=2)  # (b, s, 4 + 2 + 2, d): q, k, v are strided views
    # A gradient whose last dimension is strided: the op must get one with stride 1 there.
    dout_strided = torch.stack((dout, dout), dim=-1)[..., 0]
    assert dout_strided.stride(-1) != 1
    packed.requires_grad_()
    qs, ks, vs = packed.split([4, 2, 2], dim=2)
    out = flash_attn_hopper.flash_attn_func(qs, ks, vs, causal=True)
    (dpacked,) = torch.autograd.grad(out, packed, dout_strided)
    check_emulated_grads(dpacked.split([4, 2, 2], dim=2), q, k, v, dout, "packed", causal=True)
    assert bwd.calls[0]["dout"].stride(-1) == 1
    assert bwd.calls[0]["q"].data_ptr() == packed.data_ptr(), "the saved q is not the caller's view"


def test_gradient_of_lse_alone_is_not_propagated(kernels):
    """FlashAttention's convention: lse is an auxiliary output; its gradient does not flow back."""
    q, k, v, _ = random_qkv(seed=7)
    q.requires_grad_()
    out, lse = flash_attn_hopper.flash_attn_func(q, k, v, return_attn_probs=True)
    (dq,) = torch.autograd.grad(lse.sum(), q)
    assert torch.equal(dq, torch.zeros_like(q))


class _AtenLog(TorchDispatchMode):
    """Every op dispatched while active, with the shapes and dtypes of what it returned."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        outs = result if isinstance(result, (tuple, list)) else (result,)
        self.calls.append((str(func), [(tuple(t.shape), t.dtype) for t in outs if isinstance(t, torch.Tensor)]))
        return result


def test_backward_gets_no_zero_filled_lse_gradient(kernels):
    """Autograd would allocate and zero-fill a gradient for the unused lse before every backward
    (a kernel and an allocation on the GPU); ops._setup_context turns that off."""
    q, k, v, dout = random_qkv(seed=17)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = flash_attn_hopper.flash_attn_func(q, k, v, causal=True)
    lse_spec = ((q.shape[0], q.shape[2], q.shape[1]), torch.float32)
    with _AtenLog() as log:
        torch.autograd.grad(out, (q, k, v), dout)
    names = [name for name, _ in log.calls]
    first_bwd = next(i for i, name in enumerate(names) if name.startswith("flash_attn_hopper.bwd"))
    before = log.calls[:first_bwd]
    # (detach: the saved tensors, lse among them, unpacked for the backward)
    assert not [c for c in before if lse_spec in c[1] and not c[0].startswith("aten.detach")], before


def test_gradient_of_out_and_lse_together(kernels):
    """Both outputs used: the lse's gradient is dropped, out's flows (FlashAttention's convention)."""
    q, k, v, dout = random_qkv(seed=18)
    out, grads = grads_of(lambda q, k, v: flash_attn_hopper.flash_attn_func(q, k, v), q, k, v, dout)
    q2, k2, v2 = (t.detach().requires_grad_() for t in (q, k, v))
    out2, lse2 = flash_attn_hopper.flash_attn_func(q2, k2, v2, return_attn_probs=True)
    both = torch.autograd.grad((out2 * dout).sum() + lse2.sum() * 3.0, (q2, k2, v2))
    for a, b in zip(both, grads):
        assert torch.equal(a, b)


# --------------------------------------------------------------------------
# deterministic
# --------------------------------------------------------------------------


def test_deterministic_reaches_the_backward(kernels):
    fwd, bwd = kernels
    q, k, v, dout = random_qkv(seed=8)
    results = {}
    for deterministic in (False, True):
        _, results[deterministic] = grads_of(
            lambda q, k, v: flash_attn_hopper.flash_attn_func(q, k, v, causal=True, deterministic=deterministic),
            q, k, v, dout,
        )
    assert [call["deterministic"] for call in bwd.calls] == [False, True]
    assert len(fwd.calls) == 2, "deterministic=True must run the same forward kernel"
    for a, b in zip(results[False], results[True]):
        assert torch.equal(a, b)
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        flash_attn_hopper.flash_attn_func(q, k, v, deterministic=1)


def test_torch_deterministic_switch_at_forward_time_is_honoured(kernels):
    _, bwd = kernels
    q, k, v, dout = random_qkv(seed=9)
    q.requires_grad_()
    with deterministic_algorithms(True):
        out = flash_attn_hopper.flash_attn_func(q, k, v)
    torch.autograd.grad(out, q, dout)
    with deterministic_algorithms(False):
        out = flash_attn_hopper.flash_attn_func(q, k, v)
    with deterministic_algorithms(True):  # at backward time only: the forward call decided
        torch.autograd.grad(out, q, dout)
    assert [call["deterministic"] for call in bwd.calls] == [True, False]


# --------------------------------------------------------------------------
# The SDPA drop-in: top-left causal must reach the backward
# --------------------------------------------------------------------------


@pytest.mark.parametrize("sq, sk", [(37, 53), (53, 37), (48, 48)])
def test_sdpa_drop_in_gradients_match_torch(kernels, monkeypatch, sq, sk):
    _, bwd = kernels
    monkeypatch.setattr(sdpa, "BACKWARD_READY", True)
    q, k, v, dout = (t.transpose(1, 2) for t in random_qkv(sq=sq, sk=sk, hq=6, hk=2, seed=sq + sk))
    _, grads = grads_of(
        lambda q, k, v: flash_attn_hopper.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        q, k, v, dout,
    )
    assert len(bwd.calls) == 1, "the drop-in did not take the fast path"
    assert bwd.calls[0]["top_left"] is True and bwd.calls[0]["causal"] is True

    def torch_sdpa(q, k, v, upcast):  # torch's own function as the reference
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    check_emulated_grads(grads, q, k, v, dout, "sdpa", attention=torch_sdpa)


# --------------------------------------------------------------------------
# torch.compile and the fake kernels
# --------------------------------------------------------------------------


def _bwd_node_args(node) -> dict:
    """The bwd call of a graph node by argument name, defaults filled in (FX leaves trailing defaults out)."""
    schema = torch._C.parse_schema(f"flash_attn_hopper::{ops.BWD_SCHEMA}")
    call = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    call.update(zip(ops.BWD_SCHEMA_ARGS, node.args), **node.kwargs)
    return call


def _op_nodes(gm, name):
    return [n for n in gm.graph.nodes if n.op == "call_function" and str(n.target).startswith(f"flash_attn_hopper.{name}")]


@pytest.mark.parametrize("deterministic", [False, True])
def test_compile_fullgraph_forward_and_backward(kernels, deterministic):
    _, bwd = kernels
    q, k, v, dout = random_qkv(sq=48, sk=64, hq=4, hk=2, seed=10)

    def block(q, k, v):
        out = flash_attn_hopper.flash_attn_func(q * 1.5, k, v, causal=True, window_size=(16, 0),
                                                deterministic=deterministic)
        return out * 2

    torch._dynamo.reset()
    recorder = GraphRecorder()
    compiled = torch.compile(block, fullgraph=True, backend=recorder.backend())
    _, grads = grads_of(compiled, q, k, v, dout)
    _, eager = grads_of(block, q, k, v, dout)
    torch._dynamo.reset()
    for a, b in zip(grads, eager):
        assert torch.equal(a, b)
    (fw_graph,), (bw_graph,) = recorder.forward, recorder.backward
    fwd_name = ops.DETERMINISTIC_FWD_NAME if deterministic else "fwd."
    assert len(_op_nodes(fw_graph, fwd_name)) == 1
    (node,) = _op_nodes(bw_graph, "bwd")
    args = _bwd_node_args(node)
    assert [args[name] for name in ops.BWD_SCHEMA_ARGS[6:]] == [64**-0.5, True, 16, 0, False, deterministic, 0.0, None]
    assert len(bwd.calls) == 2  # compiled and eager
    # Saved for the backward: O(seqlen) tensors only, nothing of seqlen_q x seqlen_k.
    sizes = [n.meta["val"].numel() for n in bw_graph.graph.nodes if n.op == "placeholder" and "val" in n.meta]
    assert max(sizes) <= max(t.numel() for t in (q, k, v)), sizes


@pytest.mark.parametrize("device", ["cuda", "meta"])
def test_bwd_fake_kernel_gives_contiguous_gradients_shaped_like_the_inputs(device):
    """What AOTAutograd traces the backward with: dq like q, dk/dv like k/v (GQA), contiguous, in the inputs' dtype."""
    with emulated_bwd_op(), (FakeTensorMode() if device == "cuda" else contextlib.nullcontext()):
        q = torch.empty(2, 6, 64, 128, dtype=torch.bfloat16, device=device).transpose(1, 2)  # SDPA's layout
        k = torch.empty(2, 80, 6, 128, dtype=torch.bfloat16, device=device)[:, :, 1:5:2]  # strided heads
        lse = torch.empty(2, 6, 64, device=device)
        dq, dk, dv, dsink = torch.ops.flash_attn_hopper.bwd(q, q, k, k, q, lse, 0.1, True, -1, -1, True, True)
        _, _, _, dsink6 = torch.ops.flash_attn_hopper.bwd(q, q, k, k, q, lse, 0.1, True, sink=lse[0, :, 0])
    assert dq.shape == (2, 64, 6, 128) and dk.shape == dv.shape == (2, 80, 2, 128)
    assert dsink.shape == (0,) and dsink6.shape == (6,) and dsink.dtype == dsink6.dtype == torch.float32
    assert dq.is_contiguous() and dk.is_contiguous() and dv.is_contiguous()
    assert dq.dtype == dk.dtype == dv.dtype == torch.bfloat16
    assert dq.device.type == device


def test_export_records_which_backward_the_forward_wants():
    class Attention(torch.nn.Module):
        def __init__(self, deterministic):
            super().__init__()
            self.deterministic = deterministic

        def forward(self, q, k, v):
            return flash_attn_hopper.flash_attn_func(q, k, v, causal=True, deterministic=self.deterministic)

    for deterministic, name in [(False, "flash_attn_hopper.fwd.default"),
                                (True, f"flash_attn_hopper.{ops.DETERMINISTIC_FWD_NAME}.default")]:
        with FakeTensorMode():
            hdim, dtype = compiled_config()
            args = tuple(torch.empty(1, 32, 2, hdim, dtype=dtype, device="cuda") for _ in range(3))
            exported = torch.export.export(Attention(deterministic), args)
        targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
        assert name in targets, targets


def test_opcheck_of_the_forward_ops_with_their_backward(kernels):
    q, k, v, _ = random_qkv(sq=20, sk=24, hq=4, hk=2, seed=11)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    for name in ("fwd", ops.DETERMINISTIC_FWD_NAME):
        op = getattr(torch.ops.flash_attn_hopper, name).default
        for args in [(q, k, v, 0.125, True), (q, k, v, 0.125, False, 5, 2, True)]:
            torch.library.opcheck(op, args)


def test_opcheck_of_the_bwd_op(kernels):
    q, k, v, dout = random_qkv(sq=20, sk=24, hq=4, hk=2, seed=12)
    out, lse = emulate_fwd(q, k, v, 0.125, True)
    torch.library.opcheck(torch.ops.flash_attn_hopper.bwd.default, (dout, q, k, v, out, lse, 0.125, True))
    torch.library.opcheck(
        torch.ops.flash_attn_hopper.bwd.default, (dout, q, k, v, out, lse, 0.125, False, 4, 4, True, True)
    )


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


def test_a_bwd_op_with_another_schema_is_refused_by_name(kernels_without_bwd):
    q, k, v, dout = random_qkv(seed=13)
    old_schema = ops.BWD_SCHEMA.split(", int window_size_left")[0] + ") -> (Tensor dq, Tensor dk, Tensor dv)"
    with emulated_bwd_op(schema=old_schema) as bwd:
        q.requires_grad_()
        out = flash_attn_hopper.flash_attn_func(q, k, v, causal=True)
        with pytest.raises(RuntimeError, match="out of step") as err:
            out.backward(dout)
    assert "window_size_left" in str(err.value) and bwd.calls == []


def test_without_a_bwd_op_gradients_raise_the_build_hint(kernels_without_bwd):
    if ops.has_bwd_op():
        pytest.skip("this build has the bwd op")
    q, k, v, dout = random_qkv(seed=14)
    q.requires_grad_()
    out = flash_attn_hopper.flash_attn_func(q, k, v, deterministic=True)
    with pytest.raises(RuntimeError, match="this build has no backward kernels") as err:
        out.backward(dout)
    assert "rebuild without FLASH_ATTN_HOPPER_DISABLE_BACKWARD=1" in str(err.value)


@pytest.fixture
def kernels_without_bwd(monkeypatch):
    """The forward emulation reachable through flash_attn_func, and no bwd kernel installed."""
    monkeypatch.setattr(support, "device_refusal", lambda q, k, v, names=None: None)
    monkeypatch.setattr(_build_info, "COMPILED", None)
    with emulated_op(monkeypatch) as fwd:
        yield fwd


def test_scale_is_the_forwards_when_defaulted(kernels):
    _, bwd = kernels
    q, k, v, dout = random_qkv(d=72, seed=15)
    grads_of(lambda q, k, v: flash_attn_hopper.flash_attn_func(q, k, v), q, k, v, dout)
    assert bwd.calls[0]["softmax_scale"] == pytest.approx(1 / math.sqrt(72))


# --------------------------------------------------------------------------
# python -m flash_attn_hopper's backward self-check and report
# --------------------------------------------------------------------------


def test_main_backward_self_check_passes_right_gradients(kernels, capsys):
    from flash_attn_hopper.__main__ import self_check_backward

    _, bwd = kernels
    assert self_check_backward([(64, "bf16"), (128, "fp16")], device="cpu")
    out = capsys.readouterr().out
    assert out.count("-> ok") == 12 and "FAILED" not in out
    assert len(bwd.calls) == 12


def test_main_backward_self_check_fails_wrong_gradients(kernels, monkeypatch, capsys):
    from flash_attn_hopper.__main__ import self_check_backward

    def slightly_wrong(*args, **kwargs):
        dq, dk, dv, dsink = emulate_bwd(*args, **kwargs)
        return dq, dk * 1.02, dv, dsink

    monkeypatch.setattr(op_emulator, "emulate_bwd", slightly_wrong)
    assert not self_check_backward([(64, "bf16")], device="cpu")
    out = capsys.readouterr().out
    assert "-> FAILED" in out


def test_build_info_reports_the_backward_of_the_build(monkeypatch):
    from flash_attn_hopper.__main__ import backward_summary

    fwd, bwd = manifest.Instantiation("fwd", 128, "bf16"), manifest.Instantiation("bwd", 128, "bf16")
    record = [{"direction": i.direction, "hdim": i.hdim, "dtype": i.dtype} for i in (fwd, bwd)]
    for compiled, has_op, expected in [
        (frozenset({fwd, bwd}), True, True),
        (None, True, True),  # no build record: the op decides
        (frozenset({fwd}), True, False),  # an op the recorded build did not compile: refuse
        (frozenset({fwd, bwd}), False, False),
        (frozenset({fwd}), False, False),
    ]:
        monkeypatch.setattr(_build_info, "COMPILED", compiled)
        monkeypatch.setattr(ops, "has_bwd_op", lambda: has_op)
        info = flash_attn_hopper.build_info()
        assert info["features"]["backward"] is expected and info["has_backward_op"] is has_op
        info["compiled"] = record[: 1 + (compiled is not None and bwd in compiled)]
        summary = backward_summary(info)
        if expected:
            assert summary.startswith("yes")
            assert ("hdim128 bf16" in summary) is (compiled is not None)
        elif has_op or (compiled is not None and bwd in compiled):
            assert summary.startswith("broken build")
        else:
            assert summary.startswith("not built")
            assert f"rebuild without {manifest.ENV_DISABLE_BACKWARD}=1" in summary
    assert manifest.FEATURES["backward"] is ("bwd" in manifest.AVAILABLE_DIRECTIONS), (
        "the manifest's own entry (whether this version's backward is verified), whatever the build"
    )
