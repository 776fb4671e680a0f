#!/bin/bash
# The raw ops' softmax_scale check at its new place (check_scale, before any allocation), not yet
# run on the GPU: tools/exception_diag.py (each case in its own process) and the GPU tests that
# pass a scale. About 2.5 minutes (one head dim).
#   run: bash tools/device_plan_scale_check.sh      (carry .whl)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
HDIMS=128 STEPS=cmd CMD_TIMEOUT=150 \
  EXTRA_CMD="timeout 90 python3 tools/exception_diag.py; \
    timeout 60 python3 -m pytest tests/test_flash_fwd.py tests/test_flash_bwd.py -q -p no:cacheprovider -k scale 2>&1 | tail -4" \
  bash tools/device_session.sh
