#!/bin/bash
# Backward at every head dim in fp16 and bf16 (the standard plan builds bf16 64 / 128 / 256):
# the backward kernel tests (test_flash_bwd.py: sweep, deterministic repeats, windows, layouts)
# on one build of all twenty kernels. For backward changes that reach the head dims or the dtype
# the standard plan leaves out (the thirteenth session's step walk ran there only). ~8 minutes.
#   run: bash tools/device_plan_bwd_dtypes.sh      (carry .whl)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
export EXTRA_CMD="timeout ${TEST_TIMEOUT:-260} python3 -m pytest tests/test_flash_bwd.py -q -rs -n 8 \
  -p no:cacheprovider > \$OUT/bwdtests.log 2>&1; echo \"bwdtests exit \$?\"; grep -E 'FAILED|SKIPPED|passed|failed' \$OUT/bwdtests.log | sort | uniq -c | sort -rn | head -20"
HDIMS=64,96,128,192,256 DTYPES=fp16,bf16 STEPS=cmd CMD_TIMEOUT=270 bash tools/device_session.sh
