#!/bin/bash
# compute-sanitizer over every kernel class of the standard build (bf16, hdim 64 / 128 / 256):
# memcheck on all of tools/sanitize_check.py's cases (forward + backward, deterministic, GQA, odd
# sizes, short / long keys), synccheck and racecheck on the quick subset; only our kernels are
# instrumented (--kernel-name kns=flash), every tensor its own allocation. Logs under $OUT.
#   run: bash tools/device_plan_sanitize.sh      (carry .whl; ~6-8 min, timeout 560)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
export EXTRA_CMD='export PYTORCH_NO_CUDA_MEMORY_CACHING=1
cs() { local tool=$1 secs=$2; shift 2
  timeout $secs compute-sanitizer --tool $tool --kernel-name kns=flash --error-exitcode 9 --print-limit 10 \
    python3 tools/sanitize_check.py "$@" > $OUT/$tool.log 2>&1
  echo "$tool exit $?"; grep -E "FAIL|all ok|SOME|ERROR SUMMARY|rror|nrecognized" $OUT/$tool.log | head -12; }
cs memcheck ${MEMCHECK_SECS:-200}
cs synccheck ${SYNCCHECK_SECS:-80} --quick
cs racecheck ${RACECHECK_SECS:-120} --quick'
HDIMS=64,128,256 DTYPES=bf16 STEPS=cmd CMD_TIMEOUT=${CMD_TIMEOUT:-420} bash tools/device_session.sh
