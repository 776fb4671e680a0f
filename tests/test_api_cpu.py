"""Argument validation and availability of the public API, on the CPU.

Structural checks run before the device check, so CPU tensors reach each
message; checks further down (extension, device capability, compiled set) use
fake CUDA tensors, which need no GPU.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import flash_attn_hopper
from flash_attn_hopper import _build_info, manifest, ops, support
from flash_attn_hopper import flash_attn_func, flash_attn_qkvpacked_func, flash_attn_varlen_func

from helpers import inputs, location
from helpers.kernels import compiled_config

BF16 = torch.bfloat16


def qkv(b=2, sq=16, sk=24, hq=4, hk=2, d=64, dtype=BF16, device="cpu"):
    """Unseeded: the values do not matter here, and device "cuda" makes fake tensors under FakeTensorMode."""
    return inputs.qkv(b, sq, sk, hq, hk, d, dtype=dtype, device=device, seed=None)


def raises(exc, *fragments):
    """pytest.raises that also checks every fragment appears in the message."""

    class _Check:
        def __enter__(self):
            self.ctx = pytest.raises(exc)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *args):
            suppressed = self.ctx.__exit__(*args)
            if not suppressed:
                return False
            message = str(self.info.value)
            for fragment in fragments:
                assert fragment in message, f"{fragment!r} not in {message!r}"
            return suppressed

    return _Check()


@pytest.fixture
def only_hdim128_bf16(monkeypatch):
    """Pretend the build compiled exactly (fwd, 128, bf16), like CI's."""
    monkeypatch.setattr(_build_info, "COMPILED", frozenset({manifest.Instantiation("fwd", 128, "bf16")}))


@pytest.fixture
def everything_compiled(monkeypatch):
    monkeypatch.setattr(_build_info, "COMPILED", frozenset(manifest.full_selection().instantiations()))


# --------------------------------------------------------------------------
# Structure
# --------------------------------------------------------------------------


def test_non_tensor_argument():
    q, k, v = qkv()
    with raises(TypeError, "v must be a torch.Tensor, got list"):
        flash_attn_func(q, k, [1, 2])


def test_rank():
    q, k, v = qkv()
    with raises(ValueError, "k must have 4 dimensions (batch, seqlen, nheads, headdim)", "(24, 2, 64)"):
        flash_attn_func(q, k[0], v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int8])
def test_dtype(dtype):
    q, k, v = qkv()
    with raises(ValueError, f"q has dtype {dtype}", "torch.float16 and torch.bfloat16"):
        flash_attn_func(q.to(dtype), k, v)


def test_mixed_dtypes():
    q, k, v = qkv()
    with raises(ValueError, "v has dtype torch.float16 but q has torch.bfloat16"):
        flash_attn_func(q, k, v.half())


def test_k_v_shape_mismatch():
    q, k, v = qkv()
    with raises(ValueError, "k and v must have the same shape", "(2, 24, 2, 64)", "(2, 23, 2, 64)"):
        flash_attn_func(q, k, v[:, :23])


def test_batch_mismatch():
    q, k, v = qkv()
    with raises(ValueError, "batch size mismatch: q has 2"):
        flash_attn_func(q, k[:1], v[:1])


def test_head_dim_mismatch():
    q, k, v = qkv()
    with raises(ValueError, "head dim mismatch: q has 64, k and v have 32"):
        flash_attn_func(q, k[..., :32], v[..., :32])


@pytest.mark.parametrize("d", [264, 260, 512])  # below 256 any head dim runs (zero-padded to a multiple of 8)
def test_unsupported_head_dims(d):
    q, k, v = qkv(d=d)
    with raises(ValueError, f"head dim {d} is not supported", "multiple of 8", "at most 256"):
        flash_attn_func(q, k, v)


def test_gqa_divisibility():
    q, k, v = qkv(hq=6, hk=4)
    with raises(ValueError, "nheads_q (6) must be a multiple of nheads_kv (4)"):
        flash_attn_func(q, k, v)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_last_dim_must_be_contiguous(which):
    tensors = dict(zip("qkv", qkv()))
    t = tensors[which]
    tensors[which] = t.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, stride(-1) != 1
    assert tensors[which].stride(-1) != 1
    with raises(ValueError, f"{which}'s last dimension must be contiguous", f"{which}.contiguous()"):
        flash_attn_func(tensors["q"], tensors["k"], tensors["v"])


def test_scale_and_causal_types():
    q, k, v = qkv()
    with raises(TypeError, "softmax_scale must be a Python float"):
        flash_attn_func(q, k, v, softmax_scale=torch.tensor(0.1))
    with raises(ValueError, "softmax_scale must be finite"):
        flash_attn_func(q, k, v, softmax_scale=float("nan"))
    for scale in (0.0, -0.125):
        with raises(ValueError, "softmax_scale must be positive"):
            flash_attn_func(q, k, v, softmax_scale=scale)
    with raises(TypeError, "causal must be a bool"):
        flash_attn_func(q, k, v, causal="yes")


# --------------------------------------------------------------------------
# Features without kernels: refused before any launch
# --------------------------------------------------------------------------


@pytest.mark.parametrize("window", [(3, 3), (0, -1), (5, 0)])
def test_local_window_passes_the_feature_checks(window, everything_compiled):
    # Local windows have kernels: the call gets as far as the device check.
    q, k, v = qkv()
    with raises(ValueError, "are on cpu"):
        flash_attn_func(q, k, v, window_size=window)


@pytest.mark.parametrize("window", [(3, 3), (0, -1)])
def test_local_window_refused_when_the_manifest_has_no_kernels(window, monkeypatch):
    monkeypatch.setitem(manifest.FEATURES, "local_window", False)
    q, k, v = qkv()
    with raises(RuntimeError, "sliding-window (local) attention", "local_window", "window_size=(-1, -1)"):
        flash_attn_func(q, k, v, window_size=window)


def test_window_normalisation():
    # Windows that reach every key are no window; (-1, 0) is causal.
    assert support.fa3_window((-1, -1), False, 16, 24) == (-1, -1)
    assert support.fa3_window((23, 15), False, 16, 24) == (-1, -1)
    assert support.fa3_window((22, 15), False, 16, 24) == (22, -1)
    assert support.fa3_window((-1, 0), False, 16, 24) == (-1, 0)
    assert support.fa3_window((-1, -1), True, 16, 24) == (-1, 0)
    assert support.fa3_window((100, 3), True, 16, 24) == (-1, 0)
    with raises(ValueError, "window_size must be a pair of ints"):
        support.fa3_window(5, False, 16, 24)
    with raises(ValueError, "window_size entries must be >= -1"):
        support.fa3_window((-2, 0), False, 16, 24)


def test_wide_window_is_accepted_as_no_window(everything_compiled):
    # Passes every feature check and stops only at the device check.
    q, k, v = qkv()
    with raises(ValueError, "are on cpu"):
        flash_attn_func(q, k, v, window_size=(1000, 1000))


def test_other_unsupported_features_refused():  # (attention_chunk: tests/test_chunked_cpu.py)
    q, k, v = qkv()
    with raises(RuntimeError, "not available in this version", "sm_margin=4"):
        flash_attn_func(q, k, v, sm_margin=4)


def test_descales_with_16_bit_inputs_are_refused():  # (FP8 itself: tests/test_fp8_cpu.py)
    q, k, v = qkv()
    with raises(ValueError, "q_descale applies to FP8 (float8_e4m3fn) inputs only"):
        flash_attn_func(q, k, v, q_descale=torch.ones(1))


def test_varlen_on_cpu_is_refused_never_faked():
    # Valid arguments on a device without kernels: refused by the device check, nothing computed
    # (the argument checks themselves are tests/test_varlen_cpu.py's).
    hdim, dtype = compiled_config()  # a compiled pair: the refusal is the device's, not the build's
    q = torch.randn(10, 4, hdim, dtype=dtype)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with raises(ValueError, "on cpu", "flash_attn_hopper runs on NVIDIA Hopper"):
        flash_attn_varlen_func(q, q, q, cu, cu, 6, 6)


# --------------------------------------------------------------------------
# Packed qkv
# --------------------------------------------------------------------------


def test_qkvpacked_layout_errors():
    with raises(ValueError, "(batch, seqlen, 3, nheads, headdim)", "(2, 8, 4, 2, 64)"):
        flash_attn_qkvpacked_func(torch.randn(2, 8, 4, 2, 64, dtype=BF16))
    with raises(ValueError, "needs num_heads_q"):
        flash_attn_qkvpacked_func(torch.randn(2, 8, 8, 64, dtype=BF16))
    with raises(ValueError, "qkv has 8 heads, which is not num_heads_q (3) + 2 * nheads_kv"):
        flash_attn_qkvpacked_func(torch.randn(2, 8, 8, 64, dtype=BF16), num_heads_q=3)
    with raises(ValueError, "num_heads_q=2 but qkv"):
        flash_attn_qkvpacked_func(torch.randn(2, 8, 3, 4, 64, dtype=BF16), num_heads_q=2)
    with raises(ValueError, "got shape (8, 64)"):
        flash_attn_qkvpacked_func(torch.randn(8, 64, dtype=BF16))


def test_qkvpacked_reaches_the_device_check_with_valid_layouts(everything_compiled):
    with raises(ValueError, "are on cpu"):
        flash_attn_qkvpacked_func(torch.randn(2, 8, 3, 4, 64, dtype=BF16))
    with raises(ValueError, "are on cpu"):
        flash_attn_qkvpacked_func(torch.randn(2, 8, 8, 64, dtype=BF16), num_heads_q=4)


# --------------------------------------------------------------------------
# Compiled set, device and extension
# --------------------------------------------------------------------------


def test_not_compiled_in_names_the_knob(only_hdim128_bf16):
    q, k, v = qkv(d=128, dtype=torch.float16)
    with raises(RuntimeError, "built without forward kernels for head dim 128 in fp16", "FLASH_ATTN_HOPPER_DTYPES=fp16,bf16",
                manifest.BUILD_COMMAND):
        flash_attn_func(q, k, v)
    q, k, v = qkv(d=72)
    with raises(RuntimeError, "head dim 72 (runs on the hdim-96 kernels)", "FLASH_ATTN_HOPPER_HDIMS=96,128"):
        flash_attn_func(q, k, v)
    q, k, v = qkv(d=120)  # rounds up to the compiled 128: passes, stops at the device
    with raises(ValueError, "are on cpu"):
        flash_attn_func(q, k, v)


def test_cpu_tensors_are_refused(everything_compiled):
    q, k, v = qkv()
    with raises(ValueError, "q, k and v are on cpu", "Hopper (sm_90)", ".cuda()"):
        flash_attn_func(q, k, v)


def test_missing_extension_names_reason_and_build_command(everything_compiled, monkeypatch):
    monkeypatch.setattr(ops, "_C", None)
    monkeypatch.setattr(ops, "LOAD_ERROR", "the CUDA extension flash_attn_hopper._C is not built")
    assert not flash_attn_hopper.is_available()
    assert flash_attn_hopper.unavailable_reason() == "the CUDA extension flash_attn_hopper._C is not built"
    with FakeTensorMode():
        q, k, v = qkv(device="cuda")
        with raises(RuntimeError, "flash_attn_hopper is not available: the CUDA extension", manifest.BUILD_COMMAND):
            flash_attn_func(q, k, v)


def test_non_hopper_gpu_is_refused(everything_compiled, monkeypatch):
    if not ops.extension_loaded():
        pytest.skip(f"the capability check comes after the extension check, and {ops.LOAD_ERROR}")
    monkeypatch.setattr(support, "_device_capability", lambda index: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA A100-SXM4-80GB")
    with FakeTensorMode():
        q, k, v = qkv(device="cuda")
        with raises(RuntimeError, "is an sm_80 GPU (NVIDIA A100-SXM4-80GB)", "sm_90a only"):
            flash_attn_func(q, k, v)


# --------------------------------------------------------------------------
# Import anywhere
# --------------------------------------------------------------------------

_BLOCKED_EXTENSION = """
import sys
sys.modules["flash_attn_hopper._C"] = None   # as if the extension had never been built
import flash_attn_hopper, torch
flash_attn_hopper._build_info.COMPILED = None   # and no build record either
assert not flash_attn_hopper.is_available()
print("REASON:", flash_attn_hopper.unavailable_reason())
info = flash_attn_hopper.build_info()
assert info["extension_loaded"] is False and info["available"] is False
from torch._subclasses.fake_tensor import FakeTensorMode
with FakeTensorMode():
    q = torch.empty(1, 8, 2, 64, dtype=torch.bfloat16, device="cuda")
    try:
        flash_attn_hopper.flash_attn_func(q, q, q)
    except RuntimeError as err:
        print("ERROR:", err)
"""


def test_import_without_extension_works_and_calls_explain(tmp_path):
    proc = location.run_python(["-c", _BLOCKED_EXTENSION], timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "REASON: the CUDA extension flash_attn_hopper._C is not built" in proc.stdout
    assert "ERROR: flash_attn_hopper is not available" in proc.stdout
    assert manifest.BUILD_COMMAND in proc.stdout


def test_main_module_exits_zero_without_a_gpu(tmp_path):
    if flash_attn_hopper.is_available():
        pytest.skip("this machine can run the kernels; the GPU path of __main__ is exercised by hand")
    proc = location.run_python(["-m", "flash_attn_hopper"], timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"flash_attn_hopper {flash_attn_hopper.__version__}" in proc.stdout
    assert "cannot run here" in proc.stdout and flash_attn_hopper.unavailable_reason() in proc.stdout
    assert "  backward:   " in proc.stdout
    assert "experimental" not in proc.stdout.lower()


def test_build_info_shape():
    info = flash_attn_hopper.build_info()
    for key in ("version", "available", "unavailable_reason", "extension_loaded", "has_backward_op", "features"):
        assert key in info
    assert info["available"] == flash_attn_hopper.is_available()
    assert info["available"] == (info["unavailable_reason"] is None)
    assert info["supported_head_dims"] == list(manifest.HEAD_DIMS)
    # varlen: in the manifest, and in this build when the extension defines the varlen op.
    assert manifest.FEATURES["varlen"] is True
    assert info["features"]["varlen"] is ops.has_varlen_fwd_op() and info["features"]["causal"] is True
    info["features"]["causal"] = False  # a copy: callers cannot change the package's state
    assert flash_attn_hopper.build_info()["features"]["causal"] is True


def test_batch_over_the_grid_limit():
    q, k, v = qkv(b=65536, sq=1, sk=1, hq=1, hk=1, d=8)
    with raises(ValueError, "batch 65536 is over the kernels' limit of 65535", "split it"):
        flash_attn_func(q, k, v)


def test_sequences_over_the_index_limit():
    q, k, v = qkv(b=1, sq=1, sk=1, hq=1, hk=1, d=8)
    k, v = (t.expand(1, 2**29, 1, 8) for t in (k, v))  # zero-stride: no memory
    with raises(ValueError, "seqlen_q + seqlen_k = 536870913", "2**29 - 1"):
        flash_attn_func(q, k, v)


def test_zero_kv_heads():
    q, k, v = qkv(hq=4, hk=0)
    with raises(ValueError, "k and v must have at least one head"):
        flash_attn_func(q, k, v)
