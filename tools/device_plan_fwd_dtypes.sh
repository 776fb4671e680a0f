#!/bin/bash
# Forward only, every head dim in fp16 and bf16: the forward kernel tests and the host-program
# tests on one build (FLASH_ATTN_HOPPER_DISABLE_BACKWARD=1: ten forward translation units).
# For forward changes that reach head dims or dtypes the standard plan (64/128/256 bf16) leaves
# out. About 4 minutes.
#   run: bash tools/device_plan_fwd_dtypes.sh      (carry .whl)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
export FLASH_ATTN_HOPPER_DISABLE_BACKWARD=1
export EXTRA_CMD="timeout ${TEST_TIMEOUT:-210} python3 -m pytest tests/test_flash_fwd.py tests/test_host_programs.py -q -rs -n 8 \
  -p no:cacheprovider > \$OUT/fwdtests.log 2>&1; echo \"fwdtests exit \$?\"; grep -E 'FAILED|SKIPPED|passed|failed' \$OUT/fwdtests.log | sort | uniq -c | sort -rn | head -20"
HDIMS=64,96,128,192,256 DTYPES=fp16,bf16 STEPS=cmd CMD_TIMEOUT=230 bash tools/device_session.sh
