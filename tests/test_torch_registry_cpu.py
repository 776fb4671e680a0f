"""torch's flash-attention registry route without a GPU: registration on import,
activation and restoration in the dispatcher (the backward ops only in a build with the
bwd op), the fallback decisions, FlashAttention-2's window and log-sum-exp conventions,
and outputs and gradients laid out as aten's meta kernels promise (checked under
FakeTensorMode with CUDA fake tensors; the ops run as the float32 emulations of
op_emulator.py where they must compute).  The backward overrides are also run end to
end on CPU: installed as aten's CPU kernels, reached through autograd's formulas for
the forward ops, their gradients checked against autograd through the float32 reference,
so a wrong scale, mask, alignment or layout handed to the bwd op shows up as a wrong gradient.
"""

from __future__ import annotations

import contextlib
import logging
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn import attention

from flash_attn_hopper import _build_info, manifest, ops, support, torch_registry
from flash_attn_hopper.torch_registry import IMPL_NAME

from helpers.grads import EMULATION_REL_NORM, check_grads
from helpers.inputs import cpu_inputs, qkv
from op_emulator import emulate_fwd, emulated_bwd_op, emulated_op

BF16 = torch.bfloat16
FORWARD_OPS = [name for name in torch_registry._FORWARD_OPS if torch_registry.has_aten_op(name)]
BACKWARD_OPS = [name for name in torch_registry._BACKWARD_OPS if hasattr(torch.ops.aten, name)]


def cuda_kernel_source(op_name: str) -> str:
    """Where the CUDA kernel the dispatcher would run for aten::op_name was registered."""
    return repr(torch.library.get_kernel(f"aten::{op_name}", "CUDA"))


@pytest.fixture
def clean_registry():
    """Leave torch's registry as the test found it, even when the test fails midway."""
    yield
    if attention.current_flash_attention_impl() == IMPL_NAME:
        attention.restore_flash_attention_impl()


def test_registered_on_import_but_not_activated():
    assert torch_registry.REGISTRATION_ERROR is None
    assert IMPL_NAME in attention.list_flash_attention_impls()
    assert attention.current_flash_attention_impl() != IMPL_NAME
    for name in FORWARD_OPS + BACKWARD_OPS:
        assert "torch_registry" not in cuda_kernel_source(name)


def test_activation_without_the_extension_raises_and_changes_nothing(monkeypatch, clean_registry):
    monkeypatch.setattr(ops, "extension_loaded", lambda: False)
    before = {name: cuda_kernel_source(name) for name in FORWARD_OPS}
    with pytest.raises(RuntimeError, match="cannot be activated.*extension is not available"):
        attention.activate_flash_attention_impl(IMPL_NAME)
    assert attention.current_flash_attention_impl() is None
    assert {name: cuda_kernel_source(name) for name in FORWARD_OPS} == before


@pytest.fixture
def backward_build(monkeypatch):
    """A build with the bwd op, as far as the registry can tell; yields the bwd emulation's recorder.

    The real op (its CPU kernel the emulation) or, in a build without one, the
    stand-in of op_emulator.py; no build record, so every head dim and dtype
    counts as compiled, forward and backward.  ops.has_bwd_op is patched after
    the stand-in exists: without the extension it is False whatever torch.ops holds.
    """
    with emulated_bwd_op() as bwd:
        monkeypatch.setattr(ops, "has_bwd_op", lambda: True)
        monkeypatch.setattr(_build_info, "COMPILED", None)
        yield bwd


def test_activation_without_the_backward_op_overrides_only_the_forward(monkeypatch, clean_registry):
    # Installing the overrides needs no GPU; what they call is only reached at call time.
    monkeypatch.setattr(ops, "extension_loaded", lambda: True)
    monkeypatch.setattr(ops, "has_bwd_op", lambda: False)
    before = {name: cuda_kernel_source(name) for name in FORWARD_OPS + BACKWARD_OPS}
    attention.activate_flash_attention_impl(IMPL_NAME)
    assert attention.current_flash_attention_impl() == IMPL_NAME
    for name in FORWARD_OPS:
        assert "torch_registry.py" in cuda_kernel_source(name), name
    for name in BACKWARD_OPS:  # aten's own backward differentiates our forward
        assert cuda_kernel_source(name) == before[name]
    attention.restore_flash_attention_impl()
    assert attention.current_flash_attention_impl() is None
    assert {name: cuda_kernel_source(name) for name in FORWARD_OPS + BACKWARD_OPS} == before


def test_activation_with_the_backward_op_overrides_the_backward_too(monkeypatch, clean_registry, backward_build):
    monkeypatch.setattr(ops, "extension_loaded", lambda: True)
    assert len(BACKWARD_OPS) == 2, f"torch {torch.__version__} lacks an aten flash-attention backward op"
    before = {name: cuda_kernel_source(name) for name in FORWARD_OPS + BACKWARD_OPS}
    attention.activate_flash_attention_impl(IMPL_NAME)
    assert attention.current_flash_attention_impl() == IMPL_NAME
    for name in FORWARD_OPS + BACKWARD_OPS:
        assert "torch_registry.py" in cuda_kernel_source(name), name
    attention.restore_flash_attention_impl()
    assert {name: cuda_kernel_source(name) for name in FORWARD_OPS + BACKWARD_OPS} == before


def test_activation_falls_back_to_the_kernels_registered_before(monkeypatch, clean_registry):
    monkeypatch.setattr(ops, "extension_loaded", lambda: True)
    monkeypatch.setattr(ops, "has_bwd_op", lambda: False)
    before = {name: cuda_kernel_source(name) for name in FORWARD_OPS}
    activation = torch_registry.register_fn()
    try:
        assert activation.op_names == sorted(FORWARD_OPS)
        assert {name: repr(kernel) for name, kernel in activation.originals.items()} == before
        assert "no backward kernels" in activation.backward_refusal
    finally:
        activation.remove()
    assert {name: cuda_kernel_source(name) for name in FORWARD_OPS} == before


def test_activation_records_the_backward_ops_it_replaced(monkeypatch, clean_registry, backward_build):
    monkeypatch.setattr(ops, "extension_loaded", lambda: True)
    before = {name: cuda_kernel_source(name) for name in FORWARD_OPS + BACKWARD_OPS}
    activation = torch_registry.register_fn()
    try:
        assert activation.backward_refusal is None
        assert activation.op_names == sorted(FORWARD_OPS + BACKWARD_OPS)
        assert {name: repr(kernel) for name, kernel in activation.originals.items()} == before
    finally:
        activation.remove()
    assert {name: cuda_kernel_source(name) for name in FORWARD_OPS + BACKWARD_OPS} == before


def test_backward_override_refusal(monkeypatch, backward_build):
    assert torch_registry.backward_override_refusal() is None
    fwd, bwd = manifest.Instantiation("fwd", 128, "bf16"), manifest.Instantiation("bwd", 128, "bf16")
    monkeypatch.setattr(_build_info, "COMPILED", frozenset({fwd, bwd}))
    assert torch_registry.backward_override_refusal() is None
    monkeypatch.setattr(_build_info, "COMPILED", frozenset({fwd}))
    assert "broken build" in torch_registry.backward_override_refusal()
    monkeypatch.setattr(ops, "has_bwd_op", lambda: False)
    assert torch_registry.backward_override_refusal() == manifest.direction_unavailable_message("bwd")


def test_backward_override_refusal_of_a_bwd_op_with_other_arguments(monkeypatch):
    old_schema = (
        "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, float softmax_scale, "
        "bool causal, int window_size_left=-1, int window_size_right=-1) -> (Tensor dq, Tensor dk, Tensor dv)"
    )
    with emulated_bwd_op(schema=old_schema):  # skips in a build with the real op
        monkeypatch.setattr(ops, "has_bwd_op", lambda: True)
        monkeypatch.setattr(_build_info, "COMPILED", None)
        assert "out of step" in torch_registry.backward_override_refusal()


# --------------------------------------------------------------------------
# FlashAttention-2's conventions
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "left, right, causal, seqlen_k, expected",
    [
        (None, None, False, 50, (-1, -1)),
        (None, None, True, 50, (-1, 0)),
        (-7, -3, False, 50, (-1, -1)),  # any negative size is unbounded
        (10, 4, False, 50, (10, 4)),
        (50, 4, False, 50, (-1, 4)),  # a size >= seqlen_k is unbounded
        (10, 50, False, 50, (10, 50)),  # right >= seqlen_k: unbounded, then bounded at seqlen_k (left given)
        (10, None, False, 50, (10, 50)),  # only a left side: the right one stops at seqlen_k
        (10, 7, True, 50, (10, 0)),  # causal wins on the right
        (None, 7, False, 50, (-1, 7)),
    ],
)
def test_fa2_window(left, right, causal, seqlen_k, expected):
    assert support.fa2_window(left, right, causal, seqlen_k) == expected


@pytest.mark.parametrize(
    "right, seqlen_q, seqlen_k, expected",
    [(0, 10, 10, False), (0, 11, 10, True), (-1, 30, 3, False), (3, 13, 10, False), (3, 14, 10, True)],
)
def test_blind_rows(right, seqlen_q, seqlen_k, expected):
    assert torch_registry._has_blind_rows(right, seqlen_q, seqlen_k) is expected


def test_rows_without_keys_get_fa2s_plus_infinity(monkeypatch):
    q, k, v = qkv(2, 9, 4, 4, 2, 64, dtype=BF16, device="cpu", seed=0)
    with emulated_op(monkeypatch):
        out, lse = torch_registry._run_forward(q, k, v, None, True, None, None)
    blind = 9 - 4  # bottom-right causal: the first seqlen_q - seqlen_k rows see no key
    assert torch.equal(lse[:, :, :blind], torch.full_like(lse[:, :, :blind], float("inf")))
    assert torch.equal(out[:, :blind], torch.zeros_like(out[:, :blind]))
    expected_out, expected_lse = emulate_fwd(q, k, v, 64**-0.5, True)
    assert torch.equal(out, expected_out) and torch.equal(lse[:, :, blind:], expected_lse[:, :, blind:])


def test_window_quirk_reaches_the_op(monkeypatch):
    q, k, v = qkv(1, 10, 3, 2, 2, 64, dtype=BF16, device="cpu")
    with emulated_op(monkeypatch) as kernel:
        torch_registry._run_forward(q, k, v, 0.2, False, 1, None)
    assert kernel.calls[0][3:] == (0.2, False, 1, 3, False)


# --------------------------------------------------------------------------
# Refusals and the override kernels (fake CUDA tensors: no GPU needed)
# --------------------------------------------------------------------------


@pytest.fixture
def fake_cuda(monkeypatch):
    """Fake CUDA tensors, any device accepted; no build record, so every head dim and dtype counts
    as compiled (the tests below are about the arguments, and a build of other head dims than
    their 128 must not refuse them for that)."""
    monkeypatch.setattr(support, "device_refusal", lambda q, k, v, names=None: None)
    monkeypatch.setattr(_build_info, "COMPILED", None)
    with FakeTensorMode() as mode:
        yield mode


def fake(*shape, dtype=BF16):
    return torch.empty(*shape, device="cuda", dtype=dtype)


def test_sdpa_flash_refusals(fake_cuda):
    q, k = fake(2, 8, 100, 128), fake(2, 2, 130, 128)
    assert torch_registry.sdpa_flash_refusal(q, k, k) is None
    assert torch_registry.sdpa_flash_refusal(q, k, k, 0.0, True, False, scale=0.3) is None
    assert "dropout_p" in torch_registry.sdpa_flash_refusal(q, k, k, 0.1)
    for scale in (0.0, -0.3, math.nan):
        assert "positive finite" in torch_registry.sdpa_flash_refusal(q, k, k, scale=scale)
    assert "return_debug_mask" in torch_registry.sdpa_flash_refusal(q, k, k, 0.0, False, True)
    assert "head dim 33" in torch_registry.sdpa_flash_refusal(fake(2, 8, 100, 33), fake(2, 2, 130, 33), fake(2, 2, 130, 33))
    assert "float32" in torch_registry.sdpa_flash_refusal(*(fake(2, 8, 100, 64, dtype=torch.float32),) * 3)


def test_flash_attention_forward_refusals(fake_cuda):
    q, k = fake(2, 100, 8, 128), fake(2, 130, 2, 128)
    base = (q, k, k, None, None, 100, 130, 0.0, True, False)
    refusal = torch_registry.flash_attention_forward_refusal
    assert refusal(*base) is None
    assert refusal(*base, scale=0.2, window_size_left=5, window_size_right=0, num_splits=4) is None
    cu = torch.zeros(3, dtype=torch.int32, device="cuda")
    # Variable-length calls take the varlen route (tests/test_varlen_integrations_cpu.py): (total, heads, head_dim) tensors.
    assert "query must have 3 dimensions" in refusal(q, k, k, cu, cu, 100, 130, 0.0, True, False)
    assert "only one of cum_seq_q and cum_seq_k" in refusal(q, k, k, cu, None, 100, 130, 0.0, True, False)
    assert "dropout_p" in refusal(q, k, k, None, None, 100, 130, 0.5, True, False)
    assert "positive finite" in refusal(*base, scale=-0.2)
    assert "return_debug_mask" in refusal(q, k, k, None, None, 100, 130, 0.0, True, True)
    assert "seqused_k" in refusal(*base, seqused_k=cu)
    assert "alibi_slopes" in refusal(*base, alibi_slopes=fake(8, dtype=torch.float32))
    assert "block_table" in refusal(*base, block_table=cu)
    assert "some_future_argument" in refusal(*base, some_future_argument=1)
    assert refusal(*base, some_future_argument=None) is None


LAYOUTS = {
    "bhsd_contiguous": lambda b, h, s, e: fake(b, h, s, e),
    "bshd_memory": lambda b, h, s, e: fake(b, s, h, e).transpose(1, 2),
    "packed_qkv": lambda b, h, s, e: fake(b, s, 3, h, e)[:, :, 0].transpose(1, 2),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_override_outputs_match_the_meta_kernel(monkeypatch, fake_cuda, layout, causal):
    with emulated_op(monkeypatch):
        q = LAYOUTS[layout](2, 8, 100, 128)
        k = LAYOUTS[layout](2, 2, 130, 128)
        ours = torch_registry._sdpa_flash_forward(q, k, k, 0.0, causal, scale=0.1)
        meta = torch.ops.aten._scaled_dot_product_flash_attention(q, k, k, 0.0, causal, scale=0.1)
    assert len(ours) == len(meta) == 9
    for a, b in zip(ours, meta):
        if isinstance(b, torch.Tensor):
            assert (a.shape, a.dtype) == (b.shape, b.dtype)
            if a.numel() > 1:
                assert a.stride() == b.stride()
        else:
            assert a == b


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_flash_attention_forward_override_outputs_match_the_meta_kernel(monkeypatch, fake_cuda, layout):
    with emulated_op(monkeypatch):
        q = LAYOUTS[layout](2, 8, 100, 128).transpose(1, 2)
        k = LAYOUTS[layout](2, 2, 130, 128).transpose(1, 2)
        args = (q, k, k, None, None, 100, 130, 0.0, True, False)
        ours = torch_registry._flash_attention_forward(*args, window_size_left=3)
        meta = torch.ops.aten._flash_attention_forward(*args, window_size_left=3)
    for a, b in zip(ours, meta):
        assert (a.shape, a.dtype) == (b.shape, b.dtype)
        if a.numel() > 1:
            assert a.stride() == b.stride()


class RecordingKernel:
    def __init__(self):
        self.calls = []

    def call_boxed(self, keyset, *args, **kwargs):
        self.calls.append((keyset, args, kwargs))
        return "torch's kernel ran"


def test_override_sends_refused_calls_to_the_original_unchanged(monkeypatch, fake_cuda):
    original = RecordingKernel()
    kernel = torch_registry._override("_scaled_dot_product_flash_attention", original)
    q, k = fake(2, 8, 100, 128), fake(2, 2, 130, 128)
    keyset = object()
    assert kernel(keyset, q, k, k, 0.25, True, scale=0.5) == "torch's kernel ran"
    assert original.calls == [(keyset, (q, k, k, 0.25, True), {"scale": 0.5})]
    with emulated_op(monkeypatch):
        result = kernel(keyset, q, k, k, 0.0, True, scale=0.5)
    assert len(original.calls) == 1, "a call our kernel covers reached torch's kernel"
    assert len(result) == 9 and result[0].shape == q.shape and result[1].shape == (2, 8, 100)


def test_override_logs_which_kernel_served_each_call_at_debug_level(monkeypatch, fake_cuda, caplog):
    original = RecordingKernel()
    kernel = torch_registry._override("_scaled_dot_product_flash_attention", original)
    q, k = fake(2, 8, 100, 128), fake(2, 2, 130, 128)
    with caplog.at_level(logging.INFO, logger=torch_registry.__name__):
        kernel(object(), q, k, k, 0.25, True, scale=0.5)
    assert caplog.records == [], "logged below DEBUG"
    with caplog.at_level(logging.DEBUG, logger=torch_registry.__name__):
        kernel(object(), q, k, k, 0.25, True, scale=0.5)
        with emulated_op(monkeypatch):
            kernel(object(), q, k, k, 0.0, True, scale=0.5)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "aten::_scaled_dot_product_flash_attention" in messages[0]
    assert "torch's kernel (dropout_p=0.25" in messages[0], messages[0]
    assert messages[1].endswith(": ours"), messages[1]
    assert str((2, 8, 100, 128)) in messages[1]


def test_inplace_override_writes_into_out(monkeypatch):
    if "_flash_attention_forward_no_dropout_inplace" not in FORWARD_OPS:
        pytest.skip(f"torch {torch.__version__} has no aten::_flash_attention_forward_no_dropout_inplace")
    q, k = torch.randn(1, 20, 2, 64, dtype=BF16), torch.randn(1, 30, 2, 64, dtype=BF16)
    out = torch.full_like(q, float("nan"))
    original = RecordingKernel()
    kernel = torch_registry._override("_flash_attention_forward_no_dropout_inplace", original)
    with emulated_op(monkeypatch):
        lse = kernel(None, out, q, k, k, None, None, 20, 30, 0.0, True, False)
    expected_out, expected_lse = emulate_fwd(q, k, k, 64**-0.5, True)
    assert torch.equal(out, expected_out) and torch.equal(lse, expected_lse)
    assert original.calls == []
    wrong_out = torch.empty(1, 20, 2, 64, dtype=torch.float16)
    assert kernel(None, wrong_out, q, k, k, None, None, 20, 30, 0.0, True, False) == "torch's kernel ran"


# --------------------------------------------------------------------------
# The backward overrides
# --------------------------------------------------------------------------


def backward_args(q, k, v, *, lse=None, sdpa_layout=False):
    """Positional arguments of aten's flash backward ops for q, k, v, as autograd passes them.

    cum_seq_q / cum_seq_k are None (undefined in C++ for a dense batch);
    logsumexp (batch, heads, seqlen_q) float32.
    """
    seq_dim, head_dim = (2, 1) if sdpa_layout else (1, 2)
    batch, seqlen_q, heads_q = q.size(0), q.size(seq_dim), q.size(head_dim)
    if lse is None:
        lse = torch.zeros(batch, heads_q, seqlen_q, device=q.device)
    seed = torch.zeros((2,), dtype=torch.uint64, device=q.device)
    offset = torch.zeros((), dtype=torch.uint64, device=q.device)
    grad_out, out = torch.empty_like(q), torch.empty_like(q)
    return (grad_out, q, k, v, out, lse, None, None, seqlen_q, k.size(seq_dim), 0.0, True, seed, offset)


def with_arg(args, index, value):
    return args[:index] + (value,) + args[index + 1 :]


GRAD_OUT, QUERY, OUT, LSE, CUM_SEQ_Q, CUM_SEQ_K, DROPOUT_P = 0, 1, 4, 5, 6, 7, 10


def test_flash_attention_backward_refusals(monkeypatch, fake_cuda, backward_build):
    q, k = fake(2, 100, 8, 128), fake(2, 130, 2, 128)
    base = backward_args(q, k, k)
    refusal = torch_registry.flash_attention_backward_refusal
    assert refusal(*base) is None
    assert refusal(*base, scale=0.2, window_size_left=5, window_size_right=0) is None
    assert refusal(*with_arg(base, DROPOUT_P, 0.0), scale=None, window_size_left=None) is None
    cu = torch.zeros(3, dtype=torch.int32, device="cuda")
    # Variable-length calls take the varlen route (tests/test_varlen_integrations_cpu.py).
    assert "only one of cum_seq_q and cum_seq_k" in refusal(*with_arg(base, CUM_SEQ_Q, cu))
    assert "only one of cum_seq_q and cum_seq_k" in refusal(*with_arg(base, CUM_SEQ_K, cu))
    if not ops.has_varlen_bwd_op():
        assert "no varlen_bwd op" in refusal(*with_arg(with_arg(base, CUM_SEQ_Q, cu), CUM_SEQ_K, cu))
    assert "dropout_p=0.1" in refusal(*with_arg(base, DROPOUT_P, 0.1))
    assert "positive finite" in refusal(*base, scale=0.0)
    assert "some_future_argument" in refusal(*base, some_future_argument=1)
    assert refusal(*base, some_future_argument=None) is None
    assert "grad_out is undefined" in refusal(*with_arg(base, GRAD_OUT, None))
    assert "out, logsumexp are undefined" in refusal(*with_arg(with_arg(base, OUT, None), LSE, None))
    assert "head dim 33" in refusal(*backward_args(fake(2, 100, 8, 33), fake(2, 130, 2, 33), fake(2, 130, 2, 33)))
    q32, k32 = fake(2, 100, 8, 128, dtype=torch.float32), fake(2, 130, 2, 128, dtype=torch.float32)
    assert "float32" in refusal(*backward_args(q32, k32, k32))
    assert "multiple" in refusal(*backward_args(q, fake(2, 130, 3, 128), fake(2, 130, 3, 128)))
    assert "query's shape" in refusal(*with_arg(base, GRAD_OUT, fake(2, 100, 8, 64)))
    assert "query's shape" in refusal(*with_arg(base, OUT, fake(2, 99, 8, 128)))
    assert "query's dtype" in refusal(*with_arg(base, OUT, fake(2, 100, 8, 128, dtype=torch.float16)))
    assert "logsumexp" in refusal(*with_arg(base, LSE, fake(2, 8, 100, dtype=BF16)))
    assert "logsumexp" in refusal(*with_arg(base, LSE, fake(2, 100, 8, dtype=torch.float32)))  # (b, s, h)
    assert "device" in refusal(*with_arg(base, LSE, torch.zeros(2, 8, 100)))
    # A build whose record lists no backward kernel for this head dim and dtype.
    record = {manifest.Instantiation(d, h, "bf16") for d in ("fwd", "bwd") for h in (64, 128)}
    monkeypatch.setattr(_build_info, "COMPILED", frozenset(record - {manifest.Instantiation("bwd", 128, "bf16")}))
    assert "without backward kernels for head dim 128" in refusal(*base)
    assert refusal(*backward_args(fake(2, 100, 8, 64), fake(2, 130, 2, 64), fake(2, 130, 2, 64))) is None
    monkeypatch.setattr(ops, "has_bwd_op", lambda: False)
    assert "no backward op" in refusal(*backward_args(fake(2, 100, 8, 64), fake(2, 130, 2, 64), fake(2, 130, 2, 64)))


def test_sdpa_flash_backward_refusals(monkeypatch, fake_cuda, backward_build):
    q, k = fake(2, 8, 100, 128), fake(2, 2, 130, 128)  # (batch, heads, seqlen, head_dim)
    base = backward_args(q, k, k, sdpa_layout=True)
    refusal = torch_registry.sdpa_flash_backward_refusal
    assert base[LSE].shape == (2, 8, 100)
    assert refusal(*base) is None
    assert refusal(*base, scale=0.3) is None
    assert "positive finite" in refusal(*base, scale=-0.3)
    cu = torch.zeros(3, dtype=torch.int32, device="cuda")
    assert "variable-length" in refusal(*with_arg(base, CUM_SEQ_Q, cu))
    assert "dropout_p=0.5" in refusal(*with_arg(base, DROPOUT_P, 0.5))
    assert "some_future_argument" in refusal(*base, some_future_argument=True)
    assert refusal(*base, some_future_argument=None) is None
    assert "grad_out is undefined" in refusal(*with_arg(base, GRAD_OUT, None))
    assert "4 dimensions" in refusal(*with_arg(base, QUERY, fake(8, 100, 128)))
    odd = backward_args(fake(2, 8, 100, 33), fake(2, 2, 130, 33), fake(2, 2, 130, 33), sdpa_layout=True)
    assert "head dim 33" in refusal(*odd)
    # The query's heads and seqlen are read in SDPA's order: logsumexp (batch, heads, L) fits, (batch, L, heads) not.
    assert "logsumexp" in refusal(*with_arg(base, LSE, fake(2, 100, 8, dtype=torch.float32)))
    monkeypatch.setattr(ops, "has_bwd_op", lambda: False)
    assert "no backward op" in refusal(*base)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sdpa_backward_override_gradients_match_the_meta_kernel(fake_cuda, backward_build, layout):
    q = LAYOUTS[layout](2, 8, 100, 128)
    k, v = LAYOUTS[layout](2, 2, 130, 128), LAYOUTS[layout](2, 2, 130, 128)
    args = backward_args(q, k, v, sdpa_layout=True)
    ours = torch_registry._sdpa_flash_backward(*args, scale=0.1)
    meta = torch.ops.aten._scaled_dot_product_flash_attention_backward(*args, scale=0.1)
    assert len(ours) == len(meta) == 3
    for a, b, like in zip(ours, meta, (q, k, v)):
        assert (a.shape, a.dtype, a.stride()) == (b.shape, b.dtype, b.stride())
        assert a.stride() == torch.empty_like(like).stride()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_flash_attention_backward_override_gradients_match_the_meta_kernel(fake_cuda, backward_build, layout):
    q = LAYOUTS[layout](2, 8, 100, 128).transpose(1, 2)  # (batch, seqlen, heads, head_dim), any memory order
    k, v = LAYOUTS[layout](2, 2, 130, 128).transpose(1, 2), LAYOUTS[layout](2, 2, 130, 128).transpose(1, 2)
    args = backward_args(q, k, v)
    ours = torch_registry._flash_attention_backward(*args, window_size_left=3)
    meta = torch.ops.aten._flash_attention_backward(*args, window_size_left=3)
    for a, b in zip(ours, meta):
        assert (a.shape, a.dtype, a.stride()) == (b.shape, b.dtype, b.stride())


@pytest.mark.parametrize("op_name", ["_scaled_dot_product_flash_attention_backward", "_flash_attention_backward"])
def test_backward_override_sends_refused_calls_to_the_original_unchanged(op_name, fake_cuda, backward_build):
    original = RecordingKernel()
    kernel = torch_registry._override(op_name, original)
    sdpa_layout = op_name.startswith("_scaled")
    q = fake(2, 8, 100, 128) if sdpa_layout else fake(2, 100, 8, 128)
    k = fake(2, 2, 130, 128) if sdpa_layout else fake(2, 130, 2, 128)
    args = backward_args(q, k, k, sdpa_layout=sdpa_layout)
    keyset = object()
    refused = with_arg(args, DROPOUT_P, 0.25)
    assert kernel(keyset, *refused, scale=0.5) == "torch's kernel ran"
    assert original.calls == [(keyset, refused, {"scale": 0.5})]
    grads = kernel(keyset, *args, scale=0.5)
    assert len(original.calls) == 1, "a call our kernel covers reached torch's kernel"
    assert [g.shape for g in grads] == [q.shape, k.shape, k.shape]  # the bwd op's fake kernel ran


def test_grad_out_is_handed_over_readable_and_uncopied_when_it_can_be(backward_build):
    q, k = torch.randn(2, 20, 4, 64, dtype=BF16), torch.randn(2, 30, 2, 64, dtype=BF16)
    args = backward_args(q, k, k)
    strided = torch.randn(2, 4, 20, 64, dtype=BF16).transpose(1, 2)  # unit last stride: read in place
    broadcast = torch.randn(1, 20, 4, 64, dtype=BF16).expand(2, 20, 4, 64)  # as autograd makes for out.mean(0)
    column = torch.randn(2, 20, 4, 64, 2, dtype=BF16)[..., 0]  # last stride 2
    torch_registry._flash_attention_backward(*with_arg(args, GRAD_OUT, strided))
    torch_registry._flash_attention_backward(*with_arg(args, GRAD_OUT, broadcast))
    torch_registry._flash_attention_backward(*with_arg(args, GRAD_OUT, column))
    handed = [call["dout"] for call in backward_build.calls]
    assert handed[0].data_ptr() == strided.data_ptr() and handed[0].stride() == strided.stride()
    for given, got in zip((broadcast, column), handed[1:]):
        assert got.is_contiguous() and torch.equal(got, given)


# --------------------------------------------------------------------------
# The backward overrides end to end: installed as aten's CPU kernels, reached through autograd
# --------------------------------------------------------------------------


@contextlib.contextmanager
def overrides_as_cpu_kernels(*op_names):
    """Install the overrides of ``op_names`` as aten's CPU kernels (aten has none for these ops).

    Each falls back to a RecordingKernel; yields {op name: that kernel}.
    With the emulations (emulated_op, backward_build) the whole route --
    the forward op, autograd's formula, the backward op -- runs on CPU tensors.
    """
    originals = {name: RecordingKernel() for name in op_names}
    library = torch.library.Library("aten", "IMPL")
    try:
        for name in op_names:
            library.impl(name, torch_registry._override(name, originals[name]), "CPU", with_keyset=True)
        yield originals
    finally:
        library._destroy()


@pytest.mark.parametrize("layout", ["bshd_memory", "bhsd_contiguous"])
@pytest.mark.parametrize(
    "seqlen_q, seqlen_k, causal", [(37, 37, False), (37, 37, True), (29, 53, False), (53, 29, False)]
)
@pytest.mark.parametrize("gqa", [1, 4])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_sdpa_autograd_reaches_our_backward(
    monkeypatch, backward_build, layout, seqlen_q, seqlen_k, causal, gqa, scale
):
    names = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward")
    q, k, v, dout = cpu_inputs(2, seqlen_q, seqlen_k, 4, 4 // gqa, 64, seed=seqlen_q + gqa)
    # (batch, heads, seqlen, head_dim) leaves: transposed views of BSHD memory, or contiguous.
    if layout == "bshd_memory":
        leaves = [t.transpose(1, 2).requires_grad_() for t in (q, k, v)]
    else:
        leaves = [t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v)]
    with emulated_op(monkeypatch), overrides_as_cpu_kernels(*names) as originals:
        out = torch.ops.aten._scaled_dot_product_flash_attention(*leaves, 0.0, causal, scale=scale)[0]
        grads = torch.autograd.grad(out, leaves, dout.transpose(1, 2))
    assert all(not kernel.calls for kernel in originals.values()), "a call our kernels cover reached torch's"
    (call,) = backward_build.calls
    expected_scale = 64**-0.5 if scale is None else scale
    assert call["softmax_scale"] == expected_scale and call["causal"] is causal
    assert (call["window_size_left"], call["window_size_right"]) == ((-1, 0) if causal else (-1, -1))
    assert call["top_left"] is False and call["deterministic"] is False
    for grad, leaf in zip(grads, leaves):  # what aten's meta kernel promises: empty_like(input)
        assert grad.stride() == torch.empty_like(leaf).stride()
    check_grads([g.transpose(1, 2) for g in grads], q, k, v, dout, max_rel_norm=EMULATION_REL_NORM,
                causal=causal, softmax_scale=expected_scale)


WINDOW_CASES = [
    # seqlen_q, seqlen_k, is_causal, window_size_left, window_size_right, the window FlashAttention-2 applies
    (40, 25, True, None, None, (-1, 0)),  # bottom-right: the first 15 rows see no key (lse +inf)
    (25, 40, True, None, None, (-1, 0)),
    (25, 40, False, 6, 3, (6, 3)),
    (45, 20, False, 5, None, (5, 20)),  # only a left side: the right one stops at seqlen_k; 5 rows see no key
    (30, 30, True, 4, 9, (4, 0)),
    (30, 30, False, -3, 100, (-1, -1)),
]


@pytest.mark.parametrize("seqlen_q, seqlen_k, causal, left, right, window", WINDOW_CASES)
def test_flash_attention_autograd_reaches_our_backward(
    monkeypatch, backward_build, seqlen_q, seqlen_k, causal, left, right, window
):
    names = ("_flash_attention_forward", "_flash_attention_backward")
    q, k, v, dout = cpu_inputs(2, seqlen_q, seqlen_k, 6, 2, 64, seed=seqlen_q * seqlen_k)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    windows = dict(window_size_left=left, window_size_right=right)
    with emulated_op(monkeypatch), overrides_as_cpu_kernels(*names) as originals:
        out = torch.ops.aten._flash_attention_forward(
            *leaves, None, None, seqlen_q, seqlen_k, 0.0, causal, False, scale=0.2, **windows
        )[0]
        grads = torch.autograd.grad(out, leaves, dout)
    assert all(not kernel.calls for kernel in originals.values()), "a call our kernels cover reached torch's"
    (call,) = backward_build.calls
    assert (call["window_size_left"], call["window_size_right"]) == window
    assert call["softmax_scale"] == 0.2 and call["causal"] is causal and call["top_left"] is False
    if window[1] >= 0 and seqlen_k - seqlen_q + window[1] < 0:  # rows without keys got FA2's +inf
        assert torch.isposinf(call["softmax_lse"]).any()
    check_grads(grads, q, k, v, dout, max_rel_norm=EMULATION_REL_NORM, causal=causal, window_size=window,
                softmax_scale=0.2)


@pytest.mark.parametrize("warn_only", [False, True])
def test_deterministic_mode_reaches_the_bwd_op(monkeypatch, backward_build, warn_only):
    q, k, v, dout = cpu_inputs(1, 16, 16, 2, 2, 64)
    lse = torch.zeros(1, 2, 16)
    args = with_arg(backward_args(q, k, v, lse=lse), GRAD_OUT, dout)
    was = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    try:
        torch_registry._flash_attention_backward(*args)
    finally:
        torch.use_deterministic_algorithms(was, warn_only=was_warn_only)
    torch_registry._flash_attention_backward(*args)
    assert [call["deterministic"] for call in backward_build.calls] == [True, False]


def test_softmax_scale_of_an_unpadded_head_dim_is_kept(backward_build):
    # SDPA pads head dim 70 to 72 and passes 1/sqrt(70): the given scale wins over the op's head dim.
    q, k, v, _ = cpu_inputs(1, 8, 8, 2, 2, 72)
    args = backward_args(q, k, v)
    torch_registry._flash_attention_backward(*args, scale=1 / math.sqrt(70))
    torch_registry._flash_attention_backward(*args)
    assert [call["softmax_scale"] for call in backward_build.calls] == [1 / math.sqrt(70), 1 / math.sqrt(72)]
