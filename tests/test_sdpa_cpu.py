"""The SDPA drop-in without a GPU: routing decisions and their reasons, the exact
fallback to torch, the mapping of torch's semantics onto the op (through a float32
emulation of the op's contract, see op_emulator.py), torch.compile tracing with no
graph break, torch.export, and patch_sdpa().
"""

from __future__ import annotations

import math
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import flash_attn_hopper
from flash_attn_hopper import _build_info, manifest, ops, sdpa, support

from helpers import inputs
from helpers.kernels import needs_extension
from op_emulator import emulate_fwd, emulated_op

BF16 = torch.bfloat16


def qkv(b=2, hq=4, hk=2, sq=37, sk=53, e=64, ev=None, dtype=BF16, seed=0, requires_grad=False):
    """CPU q, k, v in SDPA's (batch, heads, seqlen, head_dim), arguments in that order too."""
    return inputs.qkv(
        b, sq, sk, hq, hk, e, dv=ev, dtype=dtype, device="cpu", seed=seed, heads_first=True, requires_grad=requires_grad
    )


def torch_reference(q, k, v, **kwargs):
    """torch's own SDPA on float32 copies: the semantics the drop-in must reproduce."""
    return sdpa.TORCH_SDPA(q.float(), k.float(), v.float(), **kwargs)


def assert_bf16_close(out, ref):
    # The emulation computes in float32 and rounds once to bf16: half an ulp of 2^1. (FlashAttention's
    # rule would allow up to 9e-2 on the cases below: a fixed bound is the sharper check of an emulation.)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=1e-2)


# --------------------------------------------------------------------------
# Fallback decisions and reasons
# --------------------------------------------------------------------------


@pytest.fixture
def hopper_here(monkeypatch):
    """Pretend the device can run the kernel and the build has every kernel, so every other rule decides."""
    monkeypatch.setattr(support, "device_refusal", lambda q, k, v, names: None)
    monkeypatch.setattr(_build_info, "COMPILED", None)


class _Logged(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


def _nested(t):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "nested tensors are a prototype"
        return torch.nested.nested_tensor([t[0], t[1]])


_CASES = {
    # name: (make inputs -> (args, kwargs), a word the reason must contain)
    "attn_mask": (lambda q, k, v: ((q, k, v), dict(attn_mask=torch.ones(37, 53, dtype=torch.bool))), "attn_mask"),
    "dropout": (lambda q, k, v: ((q, k, v), dict(dropout_p=0.1)), "dropout_p=0.1"),
    "float32": (lambda q, k, v: ((q.float(), k.float(), v.float()), {}), "torch.float32"),
    "mixed_dtypes": (lambda q, k, v: ((q, k.half(), v.half()), {}), "different dtypes"),
    "head_dim_not_multiple_of_8": (lambda q, k, v: (qkv(e=36), {}), "head dim 36"),
    "head_dim_over_256": (lambda q, k, v: (qkv(e=264), {}), "head dim 264"),
    "value_head_dim_differs": (lambda q, k, v: (qkv(ev=32), {}), "value's head dim (32)"),
    "three_dims": (lambda q, k, v: ((q[0], k[0], v[0]), {}), "4 dimensions"),
    "five_dims": (lambda q, k, v: ((q[None], k[None], v[None]), {}), "4 dimensions"),
    "heads_differ_without_gqa": (lambda q, k, v: ((q, k, v), dict(enable_gqa=False)), "enable_gqa=True"),
    "heads_not_a_multiple": (lambda q, k, v: (qkv(hq=5, hk=2), {}), "must be a multiple"),
    "batch_broadcast": (lambda q, k, v: ((q, k[:1], v[:1]), {}), "batch sizes"),
    "empty_query": (lambda q, k, v: ((q[:, :, :0], k, v), {}), "empty"),
    "empty_keys": (lambda q, k, v: ((q, k[:, :, :0], v[:, :, :0]), {}), "empty"),
    "batch_over_grid_limit": (lambda q, k, v: (qkv(b=65536, hq=1, hk=1, sq=1, sk=2, e=8), {}), "batch 65536"),
    "last_dim_strided": (lambda q, k, v: ((q[..., ::2], k[..., ::2], v[..., ::2]), {}), "contiguous"),
    "infinite_scale": (lambda q, k, v: ((q, k, v), dict(scale=math.inf)), "not finite"),
    "zero_scale": (lambda q, k, v: ((q, k, v), dict(scale=0.0)), "not positive"),
    "negative_scale": (lambda q, k, v: ((q, k, v), dict(scale=-0.125)), "not positive"),
    "nested": (lambda q, k, v: ((_nested(q), _nested(k), _nested(v)), {}), "nested"),
    "torch_function_subclass": (lambda q, k, v: ((q.as_subclass(_Logged), k, v), {}), "__torch_function__"),
}


def _case(name):
    """(args, kwargs) of a call that must fall back, and a word its reason must contain."""
    make, word = _CASES[name]
    args, kwargs = make(*qkv())
    return args, {"enable_gqa": True, **kwargs}, word


FALLBACK_CASES = list(_CASES)


@pytest.mark.parametrize("name", FALLBACK_CASES)
def test_fallback_reasons(hopper_here, name):
    args, kwargs, word = _case(name)
    reason = sdpa.sdpa_fallback_reason(*args, **kwargs)
    assert reason is not None and word in reason, reason


def test_supported_calls_have_no_fallback_reason(hopper_here):
    q, k, v = qkv()
    assert sdpa.sdpa_fallback_reason(q, k, v, enable_gqa=True) is None
    assert sdpa.sdpa_fallback_reason(q, k, v, is_causal=True, scale=0.5, enable_gqa=True) is None
    q, k, v = qkv(hq=3, hk=3, e=72, dtype=torch.float16)
    assert sdpa.sdpa_fallback_reason(q, k, v) is None
    assert sdpa.sdpa_fallback_reason(q, k, v, enable_gqa=True) is None  # enable_gqa with equal heads


def test_inputs_requiring_grad_fall_back_until_the_backward_kernel_exists(hopper_here, monkeypatch):
    monkeypatch.setattr(sdpa, "BACKWARD_READY", False)
    q, k, v = qkv()
    q.requires_grad_()
    reason = sdpa.sdpa_fallback_reason(q, k, v, enable_gqa=True)
    assert reason is not None and "requires grad" in reason and "no backward kernel" in reason
    assert f"rebuild without {manifest.ENV_DISABLE_BACKWARD}=1" in reason
    with torch.no_grad():
        assert sdpa.sdpa_fallback_reason(q, k, v, enable_gqa=True) is None
    with torch.inference_mode():
        assert sdpa.sdpa_fallback_reason(q, k, v, enable_gqa=True) is None
    monkeypatch.setattr(sdpa, "BACKWARD_READY", True)
    assert sdpa.sdpa_fallback_reason(q, k, v, enable_gqa=True) is None


def test_backward_ready_is_the_bwd_op():
    assert sdpa.BACKWARD_READY is ops.has_bwd_op()


def test_autocast_to_another_dtype_falls_back(hopper_here):
    q, k, v = qkv()
    previous = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    try:
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", torch.float16)
        reason = sdpa.sdpa_fallback_reason(q, k, v, enable_gqa=True)
        assert reason is not None and "autocast" in reason and "torch.float16" in reason
        torch.set_autocast_dtype("cuda", BF16)
        assert sdpa.sdpa_fallback_reason(q, k, v, enable_gqa=True) is None
    finally:
        torch.set_autocast_enabled("cuda", previous[0])
        torch.set_autocast_dtype("cuda", previous[1])


def test_head_dim_missing_from_the_build_falls_back_naming_the_knob(hopper_here, monkeypatch):
    built = frozenset({manifest.Instantiation("fwd", 128, "bf16")})
    monkeypatch.setattr(_build_info, "COMPILED", built)
    q, k, v = qkv(e=64)
    reason = sdpa.sdpa_fallback_reason(q, k, v, enable_gqa=True)
    assert reason is not None and manifest.ENV_HDIMS in reason and "64" in reason
    assert sdpa.sdpa_fallback_reason(*qkv(e=120), enable_gqa=True) is None  # 120 runs on the hdim-128 kernel
    reason = sdpa.sdpa_fallback_reason(*qkv(e=128, dtype=torch.float16), enable_gqa=True)
    assert reason is not None and manifest.ENV_DTYPES in reason


def test_device_refusal_names_the_device_problem(monkeypatch):
    names = ("query", "key", "value")
    with FakeTensorMode():
        cuda = torch.empty(1, device="cuda")
    if not ops.extension_loaded():
        assert "extension" in str(support.device_refusal(cuda, cuda, cuda, names))
    monkeypatch.setattr(ops, "extension_loaded", lambda: True)
    cpu = torch.empty(1)
    assert "cpu" in str(support.device_refusal(cpu, cpu, cpu, names))

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Some GPU")
    monkeypatch.setattr(support, "_device_capability", lambda index: (8, 0))
    reason = str(support.device_refusal(cuda, cuda, cuda, names))
    assert "sm_80" in reason and "sm_90" in reason and "Some GPU" in reason
    monkeypatch.setattr(support, "_device_capability", lambda index: (9, 0))
    assert support.device_refusal(cuda, cuda, cuda, names) is None


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq, sk", [(37, 53), (53, 37), (1, 9)])
def test_cpu_tensors_run_torch_unchanged(monkeypatch, causal, sq, sk):
    monkeypatch.setattr(_build_info, "COMPILED", None)  # so the device, not the build's head dims, decides
    q, k, v = qkv(sq=sq, sk=sk)
    reason = sdpa.sdpa_fallback_reason(q, k, v, is_causal=causal, enable_gqa=True)
    assert reason is not None and ("cpu" in reason or "extension" in reason), reason
    out = flash_attn_hopper.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True, scale=0.3)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True, scale=0.3))


@pytest.mark.parametrize("name", FALLBACK_CASES)
def test_fallbacks_return_exactly_what_torch_returns(monkeypatch, name):
    args, kwargs, _ = _case(name)
    with emulated_op(monkeypatch) as kernel:
        try:
            torch.manual_seed(0)
            expected = sdpa.TORCH_SDPA(*args, **kwargs)
        except RuntimeError as err:  # torch rejects it: so must the drop-in, with torch's error
            with pytest.raises(RuntimeError, match=re.escape(str(err).splitlines()[0])):
                flash_attn_hopper.scaled_dot_product_attention(*args, **kwargs)
        else:
            torch.manual_seed(0)
            out = flash_attn_hopper.scaled_dot_product_attention(*args, **kwargs)
            pairs = zip(out.unbind(), expected.unbind()) if out.is_nested else [(out, expected)]
            for a, b in pairs:  # bitwise, NaN where torch gives NaN (an infinite scale does)
                torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        assert kernel.calls == []


# --------------------------------------------------------------------------
# The fast path, on the emulated op: torch's semantics must come out
# --------------------------------------------------------------------------

FAST_CASES = [
    # b, hq, hk, sq, sk, e, causal, scale
    (2, 4, 4, 64, 64, 64, False, None),
    (2, 4, 4, 64, 64, 64, True, None),
    (1, 6, 2, 37, 53, 72, True, None),  # top-left causal, L < S
    (1, 6, 2, 53, 37, 72, True, None),  # top-left causal, L > S: every row still sees key 0
    (2, 8, 1, 1, 40, 128, True, None),  # decoding-shaped, MQA
    (2, 4, 2, 29, 29, 128, False, 0.3),  # custom scale
    (1, 2, 2, 17, 90, 256, True, 0.05),
]


@pytest.mark.parametrize("b, hq, hk, sq, sk, e, causal, scale", FAST_CASES)
def test_fast_path_computes_torch_semantics(monkeypatch, b, hq, hk, sq, sk, e, causal, scale):
    q, k, v = qkv(b, hq, hk, sq, sk, e, seed=sq * sk)
    with emulated_op(monkeypatch) as kernel:
        out = flash_attn_hopper.scaled_dot_product_attention(
            q, k, v, is_causal=causal, scale=scale, enable_gqa=hq != hk
        )
    assert len(kernel.calls) == 1, "the fast path did not run"
    ref = torch_reference(q, k, v, is_causal=causal, scale=scale, enable_gqa=hq != hk)
    assert out.shape == ref.shape and out.dtype == q.dtype
    assert_bf16_close(out, ref)
    qa, ka, va, softmax_scale, op_causal, left, right, top_left = kernel.calls[0]
    assert softmax_scale == (1.0 / math.sqrt(e) if scale is None else scale)
    assert (op_causal, left, right, top_left) == (causal, -1, -1, True)
    # The op sees transposed views of the caller's tensors: no copies.
    for arg, t in ((qa, q), (ka, k), (va, v)):
        assert arg.data_ptr() == t.data_ptr() and arg.stride() == t.transpose(1, 2).stride()
    assert out.transpose(1, 2).is_contiguous()


def test_bottom_right_alignment_would_be_caught(monkeypatch):
    """The semantics test above can fail: with the op's default alignment the answer differs."""
    q, k, v = qkv(1, 2, 2, 53, 37, 64, seed=1)
    ref = torch_reference(q, k, v, is_causal=True)
    bottom_right, _ = emulate_fwd(*(t.transpose(1, 2) for t in (q, k, v)), 64**-0.5, True)
    assert (bottom_right.transpose(1, 2).float() - ref).abs().max() > 0.1


@pytest.mark.parametrize("layout", ["bshd_memory", "packed_qkv"])
def test_fast_path_on_strided_layouts(monkeypatch, layout):
    b, s, h, e = 2, 45, 4, 64
    # bshd_memory is what models make: x.view(b, s, h, e).transpose(1, 2)
    layout = "packed" if layout == "packed_qkv" else layout
    q, k, v = inputs.qkv(b, s, s, h, h, e, dtype=BF16, device="cpu", heads_first=True, layout=layout)
    with emulated_op(monkeypatch) as kernel:
        out = flash_attn_hopper.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert len(kernel.calls) == 1
    assert all(arg.data_ptr() == t.data_ptr() for arg, t in zip(kernel.calls[0][:3], (q, k, v)))
    assert_bf16_close(out, torch_reference(q, k, v, is_causal=True))


def test_grad_inputs_take_torch_path_and_get_torch_gradients(monkeypatch):
    q, k, v = qkv(sq=20, sk=20, requires_grad=True)
    with emulated_op(monkeypatch) as kernel:
        monkeypatch.setattr(sdpa, "BACKWARD_READY", False)
        out = flash_attn_hopper.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out.float().sum().backward()
        with torch.no_grad():
            flash_attn_hopper.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert len(kernel.calls) == 1, "only the no_grad call may reach the kernel"
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).float().sum().backward()
    assert all(torch.equal(g, t.grad) for g, t in zip(grads, (q, k, v)))


# --------------------------------------------------------------------------
# torch.compile and torch.export
# --------------------------------------------------------------------------


class Attention(torch.nn.Module):
    def __init__(self, causal: bool, patched: bool = False):
        super().__init__()
        self.causal = causal
        self.patched = patched

    def forward(self, q, k, v):
        fn = F.scaled_dot_product_attention if self.patched else flash_attn_hopper.scaled_dot_product_attention
        return fn(q * 2, k, v, is_causal=self.causal, enable_gqa=True) + 1


@pytest.mark.parametrize("causal", [False, True])
def test_compile_fullgraph_traces_the_routing_without_graph_breaks(monkeypatch, causal):
    q, k, v = qkv(sq=40, sk=24)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with emulated_op(monkeypatch) as kernel:
        torch._dynamo.reset()
        eager = Attention(causal)(q, k, v)
        compiled = torch.compile(Attention(causal), fullgraph=True, backend=backend)(q, k, v)
        torch._dynamo.reset()
    assert len(graphs) == 1
    assert torch.equal(compiled, eager)
    assert len(kernel.calls) == 2, "the compiled module did not take the fast path"
    if ops.extension_loaded():
        targets = {str(node.target) for node in graphs[0].graph.nodes if node.op == "call_function"}
        assert "flash_attn_hopper.fwd.default" in targets or "flash_attn_hopper.fwd" in targets, targets


@needs_extension("export needs the compiled op")
def test_export_keeps_the_op_in_the_graph(monkeypatch):
    q, k, v = qkv(sq=40, sk=24)
    with emulated_op(monkeypatch):
        exported = torch.export.export(Attention(True), (q, k, v))
        targets = {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}
        assert "flash_attn_hopper.fwd.default" in targets, targets
        assert torch.equal(exported.module()(q, k, v), Attention(True)(q, k, v))


# --------------------------------------------------------------------------
# patch_sdpa
# --------------------------------------------------------------------------


def test_patch_sdpa_context_manager_routes_and_restores(monkeypatch):
    original = F.scaled_dot_product_attention
    q, k, v = qkv()
    with emulated_op(monkeypatch) as kernel:
        with flash_attn_hopper.patch_sdpa() as patch:
            assert patch.active and F.scaled_dot_product_attention is flash_attn_hopper.scaled_dot_product_attention
            out = Attention(True, patched=True)(q, k, v)
        assert not patch.active and F.scaled_dot_product_attention is original
        Attention(True, patched=True)(q, k, v)
    assert len(kernel.calls) == 1
    assert_bf16_close(out, torch_reference(q * 2, k, v, is_causal=True, enable_gqa=True) + 1)


def test_patch_sdpa_restores_after_an_exception_and_as_a_switch():
    original = F.scaled_dot_product_attention
    with pytest.raises(KeyError):
        with flash_attn_hopper.patch_sdpa():
            raise KeyError("inside")
    assert F.scaled_dot_product_attention is original
    switch = flash_attn_hopper.patch_sdpa()
    try:
        assert F.scaled_dot_product_attention is flash_attn_hopper.scaled_dot_product_attention
    finally:
        switch.restore()
    switch.restore()  # idempotent
    assert F.scaled_dot_product_attention is original


def test_patch_sdpa_nests_and_leaves_other_patches_alone(monkeypatch):
    original = F.scaled_dot_product_attention
    # monkeypatch undoes in reverse order: recording torch's function first makes the last undo
    # put it back (the other library's undo below re-installs what it found: our function).
    monkeypatch.setattr(F, "scaled_dot_product_attention", original)
    outer = flash_attn_hopper.patch_sdpa()
    with flash_attn_hopper.patch_sdpa():
        assert F.scaled_dot_product_attention is flash_attn_hopper.scaled_dot_product_attention
    assert F.scaled_dot_product_attention is flash_attn_hopper.scaled_dot_product_attention  # outer still on
    outer.restore()
    assert F.scaled_dot_product_attention is original

    def someone_elses(*args, **kwargs):
        return original(*args, **kwargs)

    patch = flash_attn_hopper.patch_sdpa()
    monkeypatch.setattr(F, "scaled_dot_product_attention", someone_elses)
    patch.restore()
    assert F.scaled_dot_product_attention is someone_elses


def test_fallback_does_not_recurse_into_a_patched_function():
    q, k, v = qkv()
    with flash_attn_hopper.patch_sdpa():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))


def test_sequences_over_the_index_limit_fall_back(hopper_here):
    # Zero-stride views: 2**29 keys without the memory.
    q, k, v = qkv(b=1, hq=1, hk=1, sq=1, sk=1, e=8)
    k, v = (t.expand(1, 1, 2**29, 8) for t in (k, v))
    reason = sdpa.sdpa_fallback_reason(q, k, v)
    assert reason is not None and "2**29 - 1" in reason, reason
