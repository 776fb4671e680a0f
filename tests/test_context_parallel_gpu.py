"""Context parallelism (torch's ring attention, torch.distributed.tensor.experimental.context_parallel)
over our kernels through torch's registry: examples/context_parallel.py --check under torchrun,
as a ring of one rank on one GPU (the same path: sharding, the ring loop, the LSE merge, the
backward with the merged output and LSE) and across two GPUs. The check compares the output and
every weight's gradient with the layer on one GPU without CP and a float32 reference by
FlashAttention's rule, and fails if any block ran torch's FlashAttention-2 instead of our kernels.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from flash_attn_hopper import torch_registry

from helpers.kernels import needs_extension, skip_unless_compiled
from helpers.location import run_python

pytestmark = [pytest.mark.gpu, needs_extension()]

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "context_parallel.py"


def _run(ranks: int, *args: str) -> subprocess.CompletedProcess:
    if torch_registry.activation_refusal() is not None:
        pytest.skip(f"torch's flash-attention registry: {torch_registry.activation_refusal()}")
    if torch_registry.backward_override_refusal() is not None:
        pytest.skip(f"the CP backward would run torch's kernels: {torch_registry.backward_override_refusal()}")
    skip_unless_compiled(128, torch.bfloat16, ("fwd", "bwd"))
    # torchrun in a folder outside the checkout, the tests' flash_attn_hopper first on the ranks' path.
    return run_python(["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", str(EXAMPLE),
                       "--check", *args], timeout=600)


def _assert_ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0 and "context parallel check: all ok" in result.stdout, (
        f"exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")


def test_ring_of_one_rank():
    _assert_ok(_run(1, "--seqlen", "4096"))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="context parallelism across ranks needs two GPUs "
                    "(the device tool's nvidia-h200-x2 / nvidia-h100-x2 kinds)")
def test_two_ranks():
    _assert_ok(_run(2, "--seqlen", "8192"))
