"""The feature manifest: knob parsing, head-dim rounding and the 'not compiled in' messages."""

from __future__ import annotations

import pytest

from flash_attn_hopper import manifest as m


def test_default_selection_is_everything_available():
    sel = m.selection_from_env({})
    assert sel.hdims == (64, 96, 128, 192, 256)
    assert sel.dtypes == ("fp16", "bf16", "fp8")
    assert sel.directions == m.AVAILABLE_DIRECTIONS
    # Every head dim and 16-bit dtype per direction, but qv: hdim 64 only; FP8: its own direction,
    # hdims 64 / 128 / 256.
    assert len(sel.instantiations()) == 5 * 2 * (len(m.AVAILABLE_DIRECTIONS) - 2) + 1 * 2 + 3


@pytest.mark.parametrize(
    "value, expected",
    [("128", (128,)), (" 256, 64 ,128", (64, 128, 256)), ("all", m.HEAD_DIMS), ("", m.HEAD_DIMS), ("64;96", (64, 96))],
)
def test_parse_hdims(value, expected):
    assert m.parse_hdims(value) == expected


@pytest.mark.parametrize(
    "value, must_mention",
    [
        ("72", ["FLASH_ATTN_HOPPER_HDIMS", "hdim-96", "64,96,128,192,256"]),
        ("512", ["FLASH_ATTN_HOPPER_HDIMS", "not supported"]),
        ("abc", ["FLASH_ATTN_HOPPER_HDIMS", "not an integer"]),
        (",", ["selects no head dim"]),
    ],
)
def test_parse_hdims_rejects_with_a_fix(value, must_mention):
    with pytest.raises(ValueError) as err:
        m.parse_hdims(value)
    for text in must_mention:
        assert text in str(err.value)


def test_parse_dtypes():
    assert m.parse_dtypes("bf16") == ("bf16",)
    assert m.parse_dtypes("bfloat16, FP16") == ("fp16", "bf16")  # manifest order, aliases, any case
    assert m.parse_dtypes(None) == ("fp16", "bf16", "fp8")
    assert m.parse_dtypes("fp8,bf16") == ("bf16", "fp8")
    with pytest.raises(ValueError, match="FLASH_ATTN_HOPPER_DTYPES.*unknown dtype 'fp32'"):
        m.parse_dtypes("fp32")


def test_disable_backward_knob():
    on = m.selection_from_env({"FLASH_ATTN_HOPPER_DISABLE_BACKWARD": "1"})
    off = m.selection_from_env({"FLASH_ATTN_HOPPER_DISABLE_BACKWARD": "0"})
    assert on.directions == ("fwd", "paged", "qv", "fp8")
    assert off.directions == m.AVAILABLE_DIRECTIONS
    with pytest.raises(ValueError, match="FLASH_ATTN_HOPPER_DISABLE_BACKWARD"):
        m.selection_from_env({"FLASH_ATTN_HOPPER_DISABLE_BACKWARD": "maybe"})


def test_knobs_combine():
    sel = m.selection_from_env({"FLASH_ATTN_HOPPER_HDIMS": "128", "FLASH_ATTN_HOPPER_DTYPES": "bf16"})
    assert sel.instantiations() == [m.Instantiation(d, 128, "bf16") for d in m.AVAILABLE_DIRECTIONS
                                    if d not in ("qv", "fp8")]
    assert sel.instantiations()[0].filename == "flash_fwd_hdim128_bf16_sm90.cu"
    assert sel.instantiations()[0].cutlass_type == "cutlass::bfloat16_t"


def _expected_round(d: int) -> int:
    # The rule in the kernel contract, written out independently of the manifest.
    if d <= 64:
        return 64
    if d <= 96:
        return 96
    if d <= 128:
        return 128
    if d <= 192:
        return 192
    return 256


@pytest.mark.parametrize("d", range(8, 257, 8))
def test_round_up_headdim(d):
    assert m.round_up_headdim(d) == _expected_round(d)


@pytest.mark.parametrize("d", [0, -8, 4, 12, 100, 257, 264, 512])
def test_round_up_headdim_rejects(d):
    assert m.round_up_headdim(d) is None


def test_not_compiled_message_names_knobs_and_command():
    compiled = [m.Instantiation("fwd", 128, "bf16")]
    assert m.not_compiled_message("fwd", 128, "bf16", compiled) is None
    assert m.not_compiled_message("fwd", 120, "bf16", compiled) is None  # rounds up to 128
    msg = m.not_compiled_message("fwd", 72, "fp16", compiled)
    assert "head dim 72 (runs on the hdim-96 kernels)" in msg
    assert "FLASH_ATTN_HOPPER_HDIMS=96,128" in msg
    assert "FLASH_ATTN_HOPPER_DTYPES=fp16,bf16" in msg
    assert m.BUILD_COMMAND in msg
    msg = m.not_compiled_message("fwd", 128, "fp16", compiled)
    assert "FLASH_ATTN_HOPPER_HDIMS=128 " in msg and "FLASH_ATTN_HOPPER_DTYPES=fp16,bf16" in msg
    assert "not supported" in m.not_compiled_message("fwd", 300, "bf16", compiled)


def test_backward_direction_state_is_consistent():
    assert set(m.AVAILABLE_DIRECTIONS) <= set(m.DIRECTIONS)
    assert m.FEATURES["backward"] == ("bwd" in m.AVAILABLE_DIRECTIONS)
    msg = m.not_compiled_message("bwd", 128, "bf16", [m.Instantiation("fwd", 128, "bf16")])
    assert "this build has no backward kernels" in msg
    assert msg == m.direction_unavailable_message("bwd")
    # a default direction: only the disable knob leaves it out
    assert "rebuild without FLASH_ATTN_HOPPER_DISABLE_BACKWARD=1" in msg


def test_backward_knobs():
    """The backward is built by default, for the forward's head dims and dtypes; the disable knob leaves it out."""
    assert "bwd" in m.AVAILABLE_DIRECTIONS
    knobs = {"FLASH_ATTN_HOPPER_HDIMS": "64,256", "FLASH_ATTN_HOPPER_DTYPES": "bf16"}
    on = m.selection_from_env(knobs)
    assert on.directions == ("fwd", "bwd", "paged", "qv", "fp8")
    assert on.instantiations() == [
        m.Instantiation("fwd", 64, "bf16"),
        m.Instantiation("fwd", 256, "bf16"),
        m.Instantiation("bwd", 64, "bf16"),
        m.Instantiation("bwd", 256, "bf16"),
        m.Instantiation("paged", 64, "bf16"),
        m.Instantiation("paged", 256, "bf16"),
        m.Instantiation("qv", 64, "bf16"),  # the qv kernels: hdim 64 only
    ]
    assert on.instantiations()[2].filename == "flash_bwd_hdim64_bf16_sm90.cu"
    assert m.selection_from_env({"FLASH_ATTN_HOPPER_DISABLE_BACKWARD": "0"}).directions == m.AVAILABLE_DIRECTIONS
    assert m.selection_from_env(dict(knobs, FLASH_ATTN_HOPPER_DISABLE_BACKWARD="yes")).directions == ("fwd", "paged", "qv", "fp8")
    with pytest.raises(ValueError, match="FLASH_ATTN_HOPPER_DISABLE_BACKWARD='2'"):
        m.selection_from_env({"FLASH_ATTN_HOPPER_DISABLE_BACKWARD": "2"})


def _selection_of_hint(message: str) -> m.Selection:
    """Build the selection the 'Rebuild with: K=V ... pip install ...' line of a message asks for."""
    command = message.split("Rebuild with: ")[1]
    assert command.endswith(m.BUILD_COMMAND)
    env = dict(part.split("=", 1) for part in command[: -len(m.BUILD_COMMAND)].split())
    return m.selection_from_env(env)


def test_messages_of_a_build_with_the_backward():
    compiled = [m.Instantiation("fwd", 128, "bf16"), m.Instantiation("bwd", 128, "bf16")]
    assert m.not_compiled_message("bwd", 128, "bf16", compiled) is None
    assert m.not_compiled_message("bwd", 104, "bf16", compiled) is None  # rounds up to 128
    msg = m.not_compiled_message("bwd", 64, "bf16", compiled)
    assert "without backward kernels for head dim 64 in bf16" in msg
    rebuilt = _selection_of_hint(msg).instantiations()
    assert m.Instantiation("bwd", 64, "bf16") in rebuilt and m.Instantiation("bwd", 128, "bf16") in rebuilt
    # A forward hint on that build keeps its backward...
    rebuilt = _selection_of_hint(m.not_compiled_message("fwd", 96, "fp16", compiled)).instantiations()
    assert m.Instantiation("fwd", 96, "fp16") in rebuilt and m.Instantiation("bwd", 128, "bf16") in rebuilt
    # ...and on a forward-only build asks for none.
    msg = m.not_compiled_message("fwd", 96, "fp16", compiled[:1])
    assert not [i for i in _selection_of_hint(msg).instantiations() if i.direction == "bwd"]
    # Only a hint for a build without the backward names a backward knob.
    for backward in (False, True):
        hint = m.rebuild_hint([128], ["bf16"], backward)
        assert (m.ENV_DISABLE_BACKWARD in hint) is (not backward and "bwd" in m.AVAILABLE_DIRECTIONS)


def test_dtype_names_match_torch():
    torch = pytest.importorskip("torch")
    for name, info in m.DTYPES.items():
        assert m.dtype_name(str(getattr(torch, info.torch_name)).removeprefix("torch.")) == name
    assert m.dtype_name("float32") is None


def test_value_head_dims_agree_with_the_policy():
    """manifest.VALUE_HEAD_DIMS is what csrc/kernel/common/policy.h's fwd_value_head_dim compiles."""
    import re
    from pathlib import Path

    policy = (Path(__file__).resolve().parents[1] / "csrc" / "kernel" / "common" / "policy.h").read_text()
    body = policy[policy.index("constexpr int fwd_value_head_dim()"):]
    pairs = re.findall(r"kHeadDim == (\d+) \? (\d+) : 0", body[: body.index("}")])
    assert {int(d): int(dv) for d, dv in pairs} == dict(m.VALUE_HEAD_DIMS)
    assert m.own_value_kernels(192, 128) and m.own_value_kernels(160, 64)
    assert not m.own_value_kernels(192, 192) and not m.own_value_kernels(192, 136) and not m.own_value_kernels(128, 64)
    assert not m.own_value_kernels(190, 128)  # q's head dim not a multiple of 8: padded instead
