#!/bin/bash
# Branch exp/bwd-split-steps: the causal backward's steps (RS path, head dims <= 128) in
# alternating masked / unmasked loops, so that the unmasked steps carry no mask code
# (FLASH_BWD_DEV_SPLIT_STEPS=1), against one loop testing each step at run time; causal, default
# mode, hdim 128 and 64, 3 rounds at 1k / 8k, after the variants' gradient checks (windows too).
# Prediction: +1-3 % (the forward's split gave +3-7 % at hdim 128 causal). About 3 minutes.
#   run: git checkout exp/bwd-split-steps && bash tools/device_plan_bwd_split_steps.sh      (carry .whl)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
V="python3 tools/variants.py --bwd --causal 1 --rounds 3 --seqlens 1024,8192"
A="--hdim 128 --variant b128 --variant s128:FLASH_BWD_DEV_SPLIT_STEPS=1"
B="--hdim 64 --variant b64 --variant s64:FLASH_BWD_DEV_SPLIT_STEPS=1"
HDIMS=128 STEPS=cmd CMD_TIMEOUT=300 \
  BG_CMD="$V $A --build-only & $V $B --build-only & wait; touch \$OUT/bg.done" \
  EXTRA_CMD="while [ ! -e \$OUT/bg.done ]; do sleep 2; done; grep -E 'built|rror' \$OUT/bg.log; $V $A; $V $B" \
  bash tools/device_session.sh
