#!/bin/bash
# compute-sanitizer over every kernel class of the standard build (bf16, hdim 64 / 128 / 256):
# memcheck on all of tools/sanitize_check.py's cases (forward + backward, deterministic, GQA, odd
# sizes, short / long keys), synccheck and racecheck on the quick subset; only our kernels are
# instrumented (--kernel-name kns=flash), every tensor its own allocation. Logs under $OUT.
#   run: bash tools/device_plan_sanitize.sh      (carry .whl; ~6-8 min, timeout 560)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
export EXTRA_CMD='export PYTORCH_NO_CUDA_MEMORY_CACHING=1
cs() { local tool=$1 secs=$2 log=$3; shift 3
  timeout $secs compute-sanitizer --tool $tool --kernel-name kns=flash --error-exitcode 9 --print-limit 10 \
    python3 tools/sanitize_check.py "$@" > $OUT/$log.log 2>&1
  echo "$log exit $?"; grep -E "FAIL|all ok|SOME|probe|ERROR SUMMARY|rror|nrecognized" $OUT/$log.log | head -12; }
# The planted overrun (a Triton kernel named flash_probe_...) must be reported, exit 9: else the
# filter instruments nothing and the zeros below mean nothing.
cs memcheck 60 probe --probe
cs memcheck ${MEMCHECK_SECS:-200} memcheck
cs synccheck ${SYNCCHECK_SECS:-80} synccheck --quick
cs racecheck ${RACECHECK_SECS:-120} racecheck --quick'
HDIMS=64,128,256 DTYPES=bf16 STEPS=cmd CMD_TIMEOUT=${CMD_TIMEOUT:-420} bash tools/device_session.sh
