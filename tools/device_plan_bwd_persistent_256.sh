#!/bin/bash
# main: the non-causal hdim 256 backward persistent (FLASH_BWD_DEV_PERSISTENT=1; one CTA per SM
# striding over the key blocks, the next K/V loading under the dK/dV epilogue) against one CTA
# per key block, now that its Q and dO come through two pipelines. Before that change it gave
# +4.5 % at 512 and -1.5 % at 8k. Prediction: +2-4 % at 512-1k, within 1 % at 8k. Default mode
# only (deterministic is not persistent). 3 rounds, after the variants' gradient checks. ~3 min.
#   run: bash tools/device_plan_bwd_persistent_256.sh      (carry .whl)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
V="python3 tools/variants.py --bwd --causal 0 --rounds 3 --seqlens 512,1024,2048,8192 --hdim 256"
A="--variant b256 --variant p256:FLASH_BWD_DEV_PERSISTENT=1"
HDIMS=256 STEPS=cmd CMD_TIMEOUT=300 \
  BG_CMD="$V $A --build-only; touch \$OUT/bg.done" \
  EXTRA_CMD="while [ ! -e \$OUT/bg.done ]; do sleep 2; done; grep -E 'built|rror' \$OUT/bg.log; $V $A" \
  bash tools/device_session.sh
