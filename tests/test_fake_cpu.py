"""The registered op without a GPU: its schema, the fake kernel under FakeTensorMode,
torch.compile(fullgraph=True) tracing with no graph break, and the autograd formula.

These run against the real compiled extension (CI builds it on a GPU-less
machine); they skip, saying so, only where the extension was not built.
"""

from __future__ import annotations

import operator

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import flash_attn_hopper
from flash_attn_hopper import manifest, ops

from helpers.kernels import compiled_config, needs_extension

pytestmark = needs_extension()

#: A (head dim, dtype) this build compiled, for calls that pass the compiled-set check.
HDIM, DTYPE = compiled_config()


def _fake(*shape, dtype=DTYPE, device="cuda", requires_grad=False):
    return torch.empty(*shape, dtype=dtype, device=device, requires_grad=requires_grad)


def test_schema_is_the_contract():
    schema = torch.ops.flash_attn_hopper.fwd.default._schema
    assert [a.name for a in schema.arguments[:5]] == ["q", "k", "v", "softmax_scale", "causal"]
    assert [str(a.type) for a in schema.arguments[:5]] == ["Tensor", "Tensor", "Tensor", "float", "bool"]
    # Later arguments (the local window, softcap, sink) must default to plain attention, so the 5-argument call stays valid.
    assert [a.name for a in schema.arguments[5:]] == [
        "window_size_left", "window_size_right", "top_left", "softcap", "sink", "num_splits"
    ]
    assert [a.default_value for a in schema.arguments[5:]] == [-1, -1, False, 0.0, None, 1]
    assert [r.name for r in schema.returns] == ["out", "softmax_lse"]
    assert not schema.is_mutable


def test_local_window_reaches_the_op():
    if not manifest.FEATURES["local_window"]:
        pytest.skip("this version has no local-window kernels (manifest feature 'local_window' is off)")
    torch._dynamo.reset()
    recorder = _GraphRecorder()
    with FakeTensorMode():
        q, k = _fake(2, 64, 4, HDIM), _fake(2, 80, 2, HDIM)
        fn = torch.compile(lambda q, k: flash_attn_hopper.flash_attn_func(q, k, k, window_size=(8, 0)),
                           fullgraph=True, backend=recorder)
        assert fn(q, k).shape == (2, 64, 4, HDIM)
    (call,) = recorder.op_calls()
    assert call.args[4:] == (False, 8, 0)


@pytest.mark.parametrize(
    "b, sq, sk, hq, hk, d, dtype",
    [
        (2, 113, 203, 6, 2, 128, torch.bfloat16),
        (1, 1, 1, 1, 1, 64, torch.float16),
        (3, 799, 3, 12, 2, 72, torch.bfloat16),
        (0, 16, 16, 4, 4, 256, torch.float16),
        (2, 0, 16, 4, 4, 96, torch.bfloat16),
        (2, 16, 0, 4, 4, 192, torch.bfloat16),
    ],
)
def test_fake_kernel_shapes(b, sq, sk, hq, hk, d, dtype):
    with FakeTensorMode():
        q = _fake(b, sq, hq, d, dtype=dtype)
        k = _fake(b, sk, hk, d, dtype=dtype)
        v = _fake(b, sk, hk, d, dtype=dtype)
        out, lse = torch.ops.flash_attn_hopper.fwd(q, k, v, d**-0.5, True)
    assert isinstance(out, FakeTensor) and isinstance(lse, FakeTensor)
    assert out.shape == (b, sq, hq, d) and out.dtype == dtype and out.device.type == "cuda"
    assert out.is_contiguous()
    assert lse.shape == (b, hq, sq) and lse.dtype == torch.float32 and lse.device.type == "cuda"


def test_fake_kernel_on_strided_inputs_gives_contiguous_output():
    with FakeTensorMode():
        qkv = _fake(2, 64, 3, 4, HDIM)
        q, k, v = qkv.unbind(dim=2)
        assert not q.is_contiguous()
        out, lse = torch.ops.flash_attn_hopper.fwd(q, k, v, 0.1, False)
    assert out.shape == (2, 64, 4, HDIM) and out.is_contiguous()


def test_meta_tensors_use_the_fake_kernel():
    q = torch.empty(2, 10, 4, 64, dtype=torch.float16, device="meta")
    k = torch.empty(2, 30, 2, 64, dtype=torch.float16, device="meta")
    out, lse = torch.ops.flash_attn_hopper.fwd(q, k, k, 0.125, False)
    assert out.shape == (2, 10, 4, 64) and lse.shape == (2, 4, 10) and lse.dtype == torch.float32


def test_public_api_under_fake_mode():
    with FakeTensorMode():
        q, k, v = _fake(2, 100, 6, HDIM), _fake(2, 150, 2, HDIM), _fake(2, 150, 2, HDIM)
        out = flash_attn_hopper.flash_attn_func(q, k, v, causal=True)
        out2, lse = flash_attn_hopper.flash_attn_func(q, k, v, return_attn_probs=True)
        packed = flash_attn_hopper.flash_attn_qkvpacked_func(_fake(2, 50, 3, 4, HDIM))
        gqa_packed, gqa_lse = flash_attn_hopper.flash_attn_qkvpacked_func(
            _fake(2, 50, 8 + 2 * 2, HDIM), num_heads_q=8, return_attn_probs=True
        )
    assert out.shape == out2.shape == (2, 100, 6, HDIM) and out.dtype == DTYPE
    assert lse.shape == (2, 6, 100) and lse.dtype == torch.float32
    assert packed.shape == (2, 50, 4, HDIM)
    assert gqa_packed.shape == (2, 50, 8, HDIM) and gqa_lse.shape == (2, 8, 50)


class _GraphRecorder:
    """A torch.compile backend that keeps each captured FX graph and runs it eagerly."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    def op_calls(self):
        return [
            node
            for gm in self.graphs
            for node in gm.graph.nodes
            if node.op == "call_function" and "flash_attn_hopper" in str(node.target)
        ]


class _TinyAttentionBlock(torch.nn.Module):
    def __init__(self, dim, heads=4, kv_heads=2, **factory):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim, bias=False, **factory)
        self.proj = torch.nn.Linear(dim, dim, bias=False, **factory)

    def forward(self, x):
        b, s, _ = x.shape
        qkv = self.qkv(x).view(b, s, self.heads + 2 * self.kv_heads, self.head_dim)
        out = flash_attn_hopper.flash_attn_qkvpacked_func(qkv, causal=True, num_heads_q=self.heads)
        return self.proj(out.reshape(b, s, -1)) + x


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_traces_without_graph_break(dynamic):
    torch._dynamo.reset()
    recorder = _GraphRecorder()

    def attention(q, k, v):
        out, lse = flash_attn_hopper.flash_attn_func(q, k, v, window_size=(-1, 0), return_attn_probs=True)
        return out * 2, lse.exp()

    with FakeTensorMode():
        q, k, v = _fake(2, 64, 4, HDIM), _fake(2, 80, 2, HDIM), _fake(2, 80, 2, HDIM)
        compiled = torch.compile(attention, fullgraph=True, backend=recorder, dynamic=dynamic)
        out, lse = compiled(q, k, v)
    assert out.shape == (2, 64, 4, HDIM) and lse.shape == (2, 4, 64)
    assert len(recorder.graphs) == 1, "fullgraph=True must give exactly one graph"
    calls = recorder.op_calls()
    assert len(calls) == 1
    assert calls[0].args[4] is True, "window_size=(-1, 0) must reach the kernel as causal=True"
    scale = calls[0].args[3]
    if isinstance(scale, torch.fx.Node):  # dynamic shapes: the graph computes head_dim ** -0.5
        assert dynamic and scale.target is operator.pow
    else:
        assert scale == pytest.approx(HDIM**-0.5)


def test_compile_small_model_with_aot_autograd_in_inference():
    torch._dynamo.reset()
    with FakeTensorMode():
        model = _TinyAttentionBlock(4 * HDIM, device="cuda", dtype=DTYPE)
        x = _fake(2, 32, 4 * HDIM)
        with torch.no_grad():
            y = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    assert y.shape == (2, 32, 4 * HDIM) and y.dtype == DTYPE


def test_export_records_the_op():
    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return flash_attn_hopper.flash_attn_func(q, k, v, causal=True)

    with FakeTensorMode():
        args = (_fake(1, 32, 2, HDIM), _fake(1, 32, 2, HDIM), _fake(1, 32, 2, HDIM))
        exported = torch.export.export(Attention(), args)
    targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert "flash_attn_hopper.fwd.default" in targets


def test_backward_without_bwd_op_raises_a_clear_error():
    if ops.has_bwd_op():
        pytest.skip("this build registers a bwd op; its gradients are checked by the GPU tests")
    # Meta tensors run the fake kernel and the autograd engine without a GPU.
    q = torch.empty(2, 16, 4, 64, dtype=torch.bfloat16, device="meta", requires_grad=True)
    k = torch.empty(2, 16, 2, 64, dtype=torch.bfloat16, device="meta", requires_grad=True)
    out, lse = torch.ops.flash_attn_hopper.fwd(q, k, k, 0.125, True)
    assert out.requires_grad and out.grad_fn is not None
    with pytest.raises(RuntimeError, match="this build has no backward kernels") as err:
        out.sum().backward()
    assert "torch.no_grad()" in str(err.value)
