#!/bin/bash
# Every head dim in fp16 and bf16 (the standard plan builds bf16 64 / 128 / 256), forward and
# backward kernel tests on one build of all twenty kernels (build ~115-145 s on 16 cores). For
# changes that reach the head dims or the dtype the standard plan leaves out (the thirteenth
# session's step walk ran there only). FULL=1 runs the full sweeps (FLASH_ATTN_HOPPER_FULL_TESTS:
# 3157 tests in 50 s on 2026-11-30); the quick sweeps take ~30 s.
#   run: bash tools/device_plan_bwd_dtypes.sh      (carry .whl)
#        FULL=1 bash tools/device_plan_bwd_dtypes.sh
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
[ "${FULL:-0}" = 1 ] && export FLASH_ATTN_HOPPER_FULL_TESTS=1
export EXTRA_CMD="timeout ${TEST_TIMEOUT:-300} python3 -m pytest tests/test_flash_bwd.py tests/test_flash_fwd.py -q -rs -n 8 \
  -p no:cacheprovider > \$OUT/kerneltests.log 2>&1; echo \"kerneltests exit \$?\"; grep -E 'FAILED|SKIPPED|passed|failed' \$OUT/kerneltests.log | sort | uniq -c | sort -rn | head -20"
HDIMS=64,96,128,192,256 DTYPES=fp16,bf16 STEPS=cmd CMD_TIMEOUT=310 bash tools/device_session.sh
