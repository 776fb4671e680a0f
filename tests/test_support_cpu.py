"""flash_attn_hopper.support.check: the one answer the FA3 API, the SDPA drop-in and the
registry override act on (raise, or fall back), on the CPU."""

from __future__ import annotations

import pytest
import torch

import flash_attn_hopper
from flash_attn_hopper import _build_info, manifest, sdpa, support, torch_registry

BF16 = torch.bfloat16


@pytest.fixture
def any_device(monkeypatch):
    """Every device accepted and every kernel compiled: the other rules decide."""
    monkeypatch.setattr(support, "device_refusal", lambda q, k, v, names=None: None)
    monkeypatch.setattr(_build_info, "COMPILED", frozenset(manifest.full_selection().instantiations()))


def bshd(b=2, sq=37, sk=53, hq=6, hk=2, d=72, dtype=BF16):
    return (torch.randn(b, sq, hq, d).to(dtype), torch.randn(b, sk, hk, d).to(dtype), torch.randn(b, sk, hk, d).to(dtype))


def test_problem_describes_the_call(any_device):
    q, k, v = bshd()
    problem = support.check(q, k, v, causal=False, window_size=(8, 0), softmax_scale=0.5)
    assert isinstance(problem, support.Problem)
    assert (problem.batch, problem.seqlen_q, problem.seqlen_k, problem.heads_q, problem.heads_kv) == (2, 37, 53, 6, 2)
    assert (problem.head_dim, problem.kernel_head_dim, problem.dtype, problem.gqa_ratio) == (72, 96, "bf16", 3)
    assert problem.kernel() == manifest.Instantiation("fwd", 96, "bf16")
    assert problem.kernel("bwd") == manifest.Instantiation("bwd", 96, "bf16")
    assert (problem.causal, problem.window, problem.softmax_scale) == (False, (8, 0), 0.5)
    # (-1, 0) is plain causal under FlashAttention-3's rules; (-1, -1) no mask at all.
    assert support.check(q, k, v, window_size=(-1, 0)).causal is True
    assert support.check(q, k, v, window_size=(-1, 0)).window is None
    assert support.check(q, k, v).window is None and support.check(q, k, v).causal is False


def test_layouts_read_the_same_problem_in_place(any_device):
    q, k, v = bshd()
    ours = support.check(q, k, v)
    theirs = support.check(*(t.transpose(1, 2) for t in (q, k, v)), layout="bhsd", names=("query", "key", "value"))
    assert ours == theirs


def test_refusal_text_and_exception():
    refusal = support.Refusal("x is wrong", "pass y")
    assert str(refusal) == "x is wrong; pass y"
    assert str(support.Refusal("x is wrong", "Pass y.")) == "x is wrong. Pass y."
    err = support.Refusal("no", error=TypeError).exception()
    assert isinstance(err, TypeError) and str(err) == "no"


@pytest.mark.parametrize(
    "make, fragment, error",
    [
        (lambda: bshd(d=264), "head dim 264 is not supported", ValueError),  # (36 runs padded in the FA3 API)
        (lambda: bshd(hq=5, hk=2), "must be a multiple of nheads_kv (2)", ValueError),
        (lambda: tuple(t.float() for t in bshd()), "has dtype torch.float32", ValueError),
        (lambda: (bshd()[0], bshd()[1][:1], bshd()[2][:1]), "batch size mismatch", ValueError),
    ],
)
def test_one_answer_for_every_entry_point(any_device, make, fragment, error):
    """The FA3 API raises what the SDPA drop-in and the registry fall back with."""
    q, k, v = make()
    refusal = support.check(q, k, v)
    assert isinstance(refusal, support.Refusal) and fragment in str(refusal) and refusal.error is error
    with pytest.raises(error, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        flash_attn_hopper.flash_attn_func(q, k, v)
    assert fragment in torch_registry.flash_attention_forward_refusal(q, k, v, None, None, 0, 0, 0.0, False, False)
    assert fragment in sdpa.sdpa_fallback_reason(*(t.transpose(1, 2) for t in (q, k, v)), enable_gqa=True)


def test_empty_inputs_are_a_problem_only_where_torch_has_other_conventions(any_device):
    q, k, v = bshd(sk=0)
    assert isinstance(support.check(q, k, v), support.Problem)  # the op returns zeros and -inf
    assert "empty" in str(support.check(q, k, v, allow_empty=False))


def test_not_compiled_refusal_names_the_knob(monkeypatch):
    monkeypatch.setattr(_build_info, "COMPILED", frozenset({manifest.Instantiation("fwd", 128, "bf16")}))
    assert support.not_compiled_refusal("fwd", 120, "bf16") is None
    refusal = support.not_compiled_refusal("fwd", 64, "bf16")
    assert refusal.error is RuntimeError and manifest.ENV_HDIMS in str(refusal)
    assert "no backward kernels" in str(support.not_compiled_refusal("bwd", 128, "bf16"))
    monkeypatch.setattr(_build_info, "COMPILED", None)  # no build record: only the C++ dispatch decides
    assert support.not_compiled_refusal("fwd", 64, "fp16") is None
