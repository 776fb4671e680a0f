#!/bin/bash
# Branch exp/fwd-max-free with its policy (max-free key blocks in non-causal kernels only), one
# call, about 5.5 minutes: build the forward at hdim 64/128/256 (no backward), run the forward
# GPU tests on it, and time max-free off (FLASH_FWD_DEV_MAX_FREE=0, main's kernels) against the
# policy, non-causal, as variants built beside the package. Prediction (from hdim 128's +2-7 %
# in the last call): hdim 64 +2-5 %, hdim 256 +0-2 % non-causal.
#   run: bash tools/device_plan_maxfree_final.sh      (carry .whl)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
export FLASH_ATTN_HOPPER_DISABLE_BACKWARD=1
v() { echo "python3 tools/variants.py --hdim $1 --rounds 3 --causal 0 --seqlens 512,2048,8192 --variant off$1:FLASH_FWD_DEV_MAX_FREE=0 --variant on$1"; }
export V64="$(v 64)" V128="$(v 128)" V256="$(v 256)"
export BG_CMD='($V64 --build-only & $V128 --build-only & $V256 --build-only; wait) > /tmp/vbuild.log 2>&1; touch /tmp/vbuild.done'
rm -f /tmp/vbuild.done
HDIMS=64,128,256 STEPS=cmd CMD_TIMEOUT=400 EXTRA_CMD='
  timeout 150 python3 -m pytest tests/test_flash_fwd.py -q -n 4 -p no:cacheprovider 2>&1 | grep -E "FAILED|ERROR|passed|failed" | tail -15
  for i in $(seq 120); do [ -f /tmp/vbuild.done ] && break; sleep 1; done; grep -E "^built|rror" /tmp/vbuild.log | head
  for V in "$V64" "$V128" "$V256"; do timeout 70 $V 2>&1 | grep -v "^ptxas\|bytes stack\|^ *$\|resource_tracker\|warnings.warn\|^built"; done' \
  bash tools/device_session.sh
