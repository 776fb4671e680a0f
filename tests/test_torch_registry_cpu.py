"""torch's flash-attention registry route without a GPU: registration on import,
activation and restoration in the dispatcher, the fallback decisions, FlashAttention-2's
window and log-sum-exp conventions, and outputs laid out as aten's meta kernels promise
(checked under FakeTensorMode with CUDA fake tensors; the op runs as the float32
emulation of op_emulator.py where it must compute).
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn import attention

from flash_attn_hopper import ops, sdpa, torch_registry
from flash_attn_hopper.torch_registry import IMPL_NAME

from op_emulator import emulate_fwd, emulated_op

BF16 = torch.bfloat16
FORWARD_OPS = [name for name in torch_registry._FORWARD_OPS if hasattr(torch.ops.aten, name)]
BACKWARD_OPS = ["_flash_attention_backward", "_scaled_dot_product_flash_attention_backward"]


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
    for name in FORWARD_OPS:
        assert "torch_registry" not in cuda_kernel_source(name)


def test_activation_without_the_extension_raises_and_changes_nothing(monkeypatch, clean_registry):
    monkeypatch.setattr(ops, "extension_loaded", lambda: False)
    before = {name: cuda_kernel_source(name) for name in FORWARD_OPS}
    with pytest.raises(RuntimeError, match="cannot be activated.*extension is not available"):
        attention.activate_flash_attention_impl(IMPL_NAME)
    assert attention.current_flash_attention_impl() is None
    assert {name: cuda_kernel_source(name) for name in FORWARD_OPS} == before


def test_activation_overrides_the_forward_kernels_and_restore_puts_torch_back(monkeypatch, clean_registry):
    # Installing the overrides needs no GPU; what they call is only reached at call time.
    monkeypatch.setattr(ops, "extension_loaded", lambda: True)
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


def test_activation_falls_back_to_the_kernels_registered_before(monkeypatch, clean_registry):
    monkeypatch.setattr(ops, "extension_loaded", lambda: True)
    before = {name: cuda_kernel_source(name) for name in FORWARD_OPS}
    activation = torch_registry.register_fn()
    try:
        assert activation.op_names == sorted(FORWARD_OPS)
        assert {name: repr(kernel) for name, kernel in activation.originals.items()} == before
    finally:
        activation.remove()
    assert {name: cuda_kernel_source(name) for name in FORWARD_OPS} == before


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
    assert torch_registry._fa2_window(left, right, causal, seqlen_k) == expected


@pytest.mark.parametrize(
    "right, seqlen_q, seqlen_k, expected",
    [(0, 10, 10, False), (0, 11, 10, True), (-1, 30, 3, False), (3, 13, 10, False), (3, 14, 10, True)],
)
def test_blind_rows(right, seqlen_q, seqlen_k, expected):
    assert torch_registry._has_blind_rows(right, seqlen_q, seqlen_k) is expected


def test_rows_without_keys_get_fa2s_plus_infinity(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 9, 4, 64, generator=gen, dtype=BF16)
    k = torch.randn(2, 4, 2, 64, generator=gen, dtype=BF16)
    v = torch.randn(2, 4, 2, 64, generator=gen, dtype=BF16)
    with emulated_op(monkeypatch):
        out, lse = torch_registry._run_forward(q, k, v, None, True, None, None)
    blind = 9 - 4  # bottom-right causal: the first seqlen_q - seqlen_k rows see no key
    assert torch.equal(lse[:, :, :blind], torch.full_like(lse[:, :, :blind], float("inf")))
    assert torch.equal(out[:, :blind], torch.zeros_like(out[:, :blind]))
    expected_out, expected_lse = emulate_fwd(q, k, v, 64**-0.5, True)
    assert torch.equal(out, expected_out) and torch.equal(lse[:, :, blind:], expected_lse[:, :, blind:])


def test_window_quirk_reaches_the_op(monkeypatch):
    q, k, v = (torch.randn(1, s, 2, 64, dtype=BF16) for s in (10, 3, 3))
    with emulated_op(monkeypatch) as kernel:
        torch_registry._run_forward(q, k, v, 0.2, False, 1, None)
    assert kernel.calls[0][3:] == (0.2, False, 1, 3, False)


# --------------------------------------------------------------------------
# Refusals and the override kernels (fake CUDA tensors: no GPU needed)
# --------------------------------------------------------------------------


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(sdpa, "kernel_refusal", lambda device: None)
    with FakeTensorMode() as mode:
        yield mode


def fake(*shape, dtype=BF16):
    return torch.empty(*shape, device="cuda", dtype=dtype)


def test_sdpa_flash_refusals(fake_cuda):
    q, k = fake(2, 8, 100, 128), fake(2, 2, 130, 128)
    assert torch_registry.sdpa_flash_refusal(q, k, k) is None
    assert torch_registry.sdpa_flash_refusal(q, k, k, 0.0, True, False, scale=0.3) is None
    assert "dropout_p" in torch_registry.sdpa_flash_refusal(q, k, k, 0.1)
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
    assert "variable-length" in refusal(q, k, k, cu, cu, 100, 130, 0.0, True, False)
    assert "dropout_p" in refusal(q, k, k, None, None, 100, 130, 0.5, True, False)
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
