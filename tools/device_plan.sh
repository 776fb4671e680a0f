#!/bin/bash
# The standard GPU call: the main build (hdim 64/128/256 bf16, forward + backward), the full
# test suite with DEBUG logs of the registry overrides, and the benchmark grid, forward and
# backward, against cuDNN, torch's FA2 and our deterministic mode, all in one run, each point
# measured in 3 rounds with the providers' order rotated (median reported). About 7-8 minutes
# (one round took ~70 s of the 2026-11-30 16:02 call). STEPS=cmd,pytest,benchbwd
# EXTRA_CMD="python3 tools/kernel_breakdown.py --bwd" adds a
# per-kernel time breakdown next to cuDNN's.
#   run: bash tools/device_plan.sh      (carry .whl)
# FA3=1 (carry .peers too): FlashAttention-3 built beside ours (tools/fa3_peer.py) and timed in
# the grid as the fa3 provider (its build finishes during the tests).
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
if [ "${FA3:-0}" = 1 ]; then
  source tools/fa3_env.sh
  export BENCH_WAIT_FILE=$FA3_DONE  # the benchmark runs before the tests: wait for FA3
  PROVIDERS=${PROVIDERS:-flash_attn_hopper,sdpa-cudnn,fa3,sdpa-flash,flash_attn_hopper-det}
fi
HDIMS=64,128,256 STEPS=${STEPS:-pytest,benchbwd} TEST_TIMEOUT=${TEST_TIMEOUT:-240} BENCH_TIMEOUT=${BENCH_TIMEOUT:-300} \
  BENCH_ARGS="${BENCH_ARGS:---rounds 3}" \
  PROVIDERS=${PROVIDERS:-flash_attn_hopper,sdpa-cudnn,sdpa-flash,flash_attn_hopper-det} \
  PYTEST_ARGS="${PYTEST_ARGS:---log-level=DEBUG}" bash tools/device_session.sh
