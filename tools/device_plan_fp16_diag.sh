#!/bin/bash
# fp16 + bf16 at head dims 96 / 128 / 192 (tools/device_plan_fp16_hdims.sh: bwd_check, the registry
# tests in one process, the forward and backward kernel tests), after tools/exception_diag.py:
# which C++ argument errors of the raw ops raise and which end the process (the
# negative-scale check in fill_common did, in a pytest worker, 2026-11-30 13:10). About 4 minutes.
#   run: bash tools/device_plan_fp16_diag.sh      (carry .whl)
set -o pipefail
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
export EXTRA_CMD="timeout 120 python3 tools/exception_diag.py 2>&1 | tee \$OUT/exception_diag.log | tail -60;
  timeout 150 python3 tools/bwd_check.py --hdims 96,128,192 --dtypes fp16,bf16 > \$OUT/bwd_check.log 2>&1; echo \"bwd_check exit \$?\"; grep -v '^ok' \$OUT/bwd_check.log | tail -20; grep -c '^ok' \$OUT/bwd_check.log;
  timeout 200 python3 -m pytest tests/test_flash_bwd.py tests/test_flash_fwd.py -q -n 8 -p no:cacheprovider > \$OUT/kerneltests.log 2>&1; echo \"kerneltests exit \$?\"; grep -E 'FAILED|passed|failed' \$OUT/kerneltests.log | tail -8"
HDIMS=96,128,192 DTYPES=fp16,bf16 STEPS=cmd CMD_TIMEOUT=480 bash tools/device_session.sh
