"""tools/check/fa3_upstream.py: FA3's test files with our functions standing in (run on the GPU);
here its parts that need none: the plain-torch rotary reference, the unpacked folder, the summary."""

from __future__ import annotations

import importlib.util
import io
import sys
import tarfile
from pathlib import Path

import pytest
import torch

import flash_attn_hopper

REPO_ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("fa3_upstream", REPO_ROOT / "tools" / "check" / "fa3_upstream.py")
fa3_upstream = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fa3_upstream)
_spec = importlib.util.spec_from_file_location("rotary_ref", REPO_ROOT / "tools" / "check" / "rotary_ref.py")
rotary_ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rotary_ref)


def rotate_by_hand(x, cos, sin, offsets, interleaved):
    """Each pair of each token turned by its position's angle, one at a time."""
    out = x.clone().float()
    half = cos.shape[1]
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            p = int(offsets[b]) + t
            if p >= cos.shape[0]:
                continue
            for i in range(half):
                i0, i1 = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
                x0, x1 = x[b, t, :, i0].float(), x[b, t, :, i1].float()
                out[b, t, :, i0] = x0 * cos[p, i] - x1 * sin[p, i]
                out[b, t, :, i1] = x0 * sin[p, i] + x1 * cos[p, i]
    return out.to(x.dtype)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [8, 16])
def test_rotary_reference_turns_each_pair_by_its_position(interleaved, rotary_dim):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 16)
    angle = torch.rand(9, rotary_dim // 2) * 6.28
    cos, sin = angle.cos(), angle.sin()
    offsets = torch.tensor([0, 6])  # the second runs past the 9-position table: those tokens stay
    got = rotary_ref.apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=offsets)
    torch.testing.assert_close(got, rotate_by_hand(x, cos, sin, offsets, interleaved), rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1, 3:], x[1, 3:])
    assert torch.equal(got[..., rotary_dim:], x[..., rotary_dim:])
    same = rotary_ref.apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=2)
    torch.testing.assert_close(same, rotate_by_hand(x, cos, sin, torch.tensor([2, 2]), interleaved), rtol=1e-5,
                               atol=1e-5)


def test_rotary_reference_on_packed_rows_rotates_each_sequence_from_its_offset():
    torch.manual_seed(1)
    x = torch.randn(7, 2, 8)
    angle = torch.rand(16, 4)
    cu = torch.tensor([0, 3, 7])
    offsets = torch.tensor([1, 5])
    got = rotary_ref.apply_rotary_emb(x, angle.cos(), angle.sin(), seqlen_offsets=offsets, cu_seqlens=cu, max_seqlen=4)
    for b in range(2):
        seq = x[None, int(cu[b]):int(cu[b + 1])]
        want = rotate_by_hand(seq, angle.cos(), angle.sin(), offsets[b:b + 1], False)[0]
        torch.testing.assert_close(got[int(cu[b]):int(cu[b + 1])], want, rtol=1e-5, atol=1e-5)


def test_the_unpacked_folder_imports_ours_under_fa3s_names(tmp_path):
    archive = tmp_path / "fa3-hopper-test.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in {"test_one.py": "x = 1\n", "test_util.py": "", "padding.py": ""}.items():
            data = text.encode()
            info = tarfile.TarInfo(f"hopper/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    scratch = tmp_path / "scratch"
    fa3_upstream.unpack(archive, ["test_one.py"], scratch)
    for name in ("test_one.py", "test_util.py", "padding.py", "flash_attn_interface.py", "flash_attn/layers/rotary.py"):
        assert (scratch / name).is_file(), name
    sys.path.insert(0, str(scratch))
    try:
        for module in ("flash_attn_interface", "flash_attn", "flash_attn.layers", "flash_attn.layers.rotary"):
            sys.modules.pop(module, None)
        import flash_attn_interface
        from flash_attn.layers.rotary import apply_rotary_emb

        for name in ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_combine", "flash_attn_with_kvcache",
                     "get_scheduler_metadata"):
            assert getattr(flash_attn_interface, name) is getattr(flash_attn_hopper, name)
        assert apply_rotary_emb.__module__ == "flash_attn.layers.rotary"
    finally:
        sys.path.remove(str(scratch))
        for module in ("flash_attn_interface", "flash_attn", "flash_attn.layers", "flash_attn.layers.rotary"):
            sys.modules.pop(module, None)
    with pytest.raises(KeyError):
        fa3_upstream.unpack(archive, ["test_missing.py"], tmp_path / "other")


def test_the_summary_counts_each_function_and_groups_failures_by_message(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="test_flash_attn" name="test_a[1-True]"/>'
        '<testcase classname="test_flash_attn" name="test_a[2-True]"><failure message="ValueError: qv is not supported">'
        'trace</failure></testcase>'
        '<testcase classname="test_flash_attn" name="test_a[3-True]"><failure message="ValueError: qv is not supported">'
        'trace</failure></testcase>'
        '<testcase classname="test_flash_attn" name="test_b[x]"><skipped message="no"/></testcase>'
        '<testcase classname="test_flash_attn" name="test_b[y]"><error message="RuntimeError: boom"/></testcase>'
        '</testsuite></testsuites>')
    table, failed = fa3_upstream.summarize(junit)
    assert failed == 3
    assert "| test_a | 1 | 2 | 0 |" in table
    assert "| test_b | 0 | 1 | 1 |" in table
    assert "- test_a, 2x: ValueError: qv is not supported" in table
    assert "[2-True]" in table and "- test_b, 1x: RuntimeError: boom" in table


def test_the_sample_keeps_at_most_n_cases_per_function_in_file_order():
    ids = [f"t.py::test_a[{i}]" for i in range(10)] + ["t.py::test_b[0]", "t.py::test_b[1]"]
    chosen = fa3_upstream.sample_ids(ids, 3, seed=4)
    assert [c for c in chosen if "test_b" in c] == ["t.py::test_b[0]", "t.py::test_b[1]"]
    picked_a = [c for c in chosen if "test_a" in c]
    assert len(picked_a) == 3 and picked_a == sorted(picked_a, key=ids.index)
    assert chosen == fa3_upstream.sample_ids(ids, 3, seed=4)
    assert fa3_upstream.sample_ids(ids, 3, seed=5) != chosen  # another seed, another draw
