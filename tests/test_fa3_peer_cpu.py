"""tools/gpu/fa3_peer.py: the FlashAttention-3 peer build's configuration (no GPU, no FA3 sources needed)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from conftest import REPO_ROOT

_spec = importlib.util.spec_from_file_location("fa3_peer", REPO_ROOT / "tools" / "gpu" / "fa3_peer.py")
peer = importlib.util.module_from_spec(_spec)
sys.modules["fa3_peer"] = peer
_spec.loader.exec_module(peer)


def test_every_compiled_out_feature_uses_the_macro_spelling_the_sources_test():
    # FA3's sources test FLASHATTENTION_DISABLE_* for every switch, the head-dim-difference ones
    # included (only its config keys spell those FLASH_ATTENTION_...): the first device build used
    # the config spelling for them and the library missed the hdim 64 x 512 kernels at load time.
    defines = peer._feature_defines()
    assert "-DFLASHATTENTION_DISABLE_HDIMDIFF64" in defines
    assert "-DFLASHATTENTION_DISABLE_HDIMDIFF192" in defines
    assert all(d.startswith("-DFLASHATTENTION_DISABLE_") for d in defines)
    # What the benchmark needs stays compiled in.
    for kept in ("BACKWARD", "HDIM64", "HDIM128", "HDIM256"):
        assert f"-DFLASHATTENTION_DISABLE_{kept}" not in defines
    assert "-DFLASHATTENTION_DISABLE_FP16" in defines and "-DFLASHATTENTION_DISABLE_VARLEN" in defines


def test_sources_are_the_bf16_kernels_of_the_benchmarked_head_dims():
    sources = peer._sources()
    assert sources[0] == "flash_api_stable.cpp" and sources[-1] == "flash_prepare_scheduler.cu"
    kernels = sources[1:-1]
    assert len(kernels) == 2 * len(peer.HDIMS) == 6
    assert all(k.startswith("instantiations/flash_") and k.endswith("_bf16_sm90.cu") for k in kernels)


def test_build_without_archives_says_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.setattr(peer, "FA3_ARCHIVE", tmp_path / "missing-fa3.tar.gz")
    try:
        peer.build(tmp_path / "out", jobs=1)
    except SystemExit as exc:
        assert "pack" in str(exc) and "missing-fa3.tar.gz" in str(exc)
    else:
        raise AssertionError("build() went on without the FA3 archive")


def test_peer_sources_are_ignored_by_git():
    ignored = subprocess.run(["git", "check-ignore", "-q", ".peers/fa3-hopper-0251105.tar.gz"], cwd=REPO_ROOT)
    assert ignored.returncode == 0


def test_enabled_features_are_compiled_in_with_their_own_files():
    defines = peer._feature_defines(frozenset({"SOFTCAP", "VARLEN"}))
    assert "-DFLASHATTENTION_DISABLE_SOFTCAP" not in defines and "-DFLASHATTENTION_DISABLE_VARLEN" not in defines
    assert "-DFLASHATTENTION_DISABLE_SPLIT" in defines  # the rest stays as the yardstick's build
    assert len(peer._sources(frozenset({"SOFTCAP"}))) == len(peer._sources()) + 2 * len(peer.HDIMS)
    assert "instantiations/flash_bwd_hdim128_bf16_softcap_sm90.cu" in peer._sources(frozenset({"SOFTCAP"}))
    try:
        peer._feature_defines(frozenset({"TELEPORT"}))
    except SystemExit as exc:
        assert "TELEPORT" in str(exc)
    else:
        raise AssertionError("an unknown FA3 switch was accepted")


def test_the_decode_peer_compiles_the_split_paged_and_packgqa_forward_files_of_its_head_dims():
    sources = peer._sources(frozenset({"SPLIT", "PAGEDKV", "PACKGQA", "VARLEN"}), hdims=(128,))
    assert "flash_fwd_combine.cu" in sources  # the split kernels' merge: without it the library does not load
    kernels = sorted(s.split("/")[1] for s in sources[1:-1] if s.startswith("instantiations/"))
    assert kernels == sorted([
        "flash_fwd_hdim128_bf16_sm90.cu", "flash_bwd_hdim128_bf16_sm90.cu",
        "flash_fwd_hdim128_bf16_paged_sm90.cu", "flash_fwd_hdim128_bf16_split_sm90.cu",
        "flash_fwd_hdim128_bf16_paged_split_sm90.cu", "flash_fwd_hdim128_bf16_packgqa_sm90.cu",
    ])
