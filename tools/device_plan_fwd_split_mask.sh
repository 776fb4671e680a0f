#!/bin/bash
# Branch exp/fwd-split-mask: the forward's key-block loop split in three (masked end blocks,
# unmasked inner blocks, masked blocks past the left window edge; FLASH_FWD_DEV_SPLIT_MASK=1)
# against the single loop, hdim 256 causal and not at 512 / 1k / 2k / 8k, hdim 64 / 128 causal at
# 512 / 2k / 8k, 3 rounds,
# after the variants' forward checks (no window cases there: if it is adopted, the full suite
# must run). Prediction: hdim 256 causal +2-4 % from 2k (its inner loop has 6 spill instructions
# per iteration instead of 14), at 512 within 2 % (more of its blocks are masked, and the masked
# loops spill more); the others within 2 %. About 5 minutes.
#   run: git checkout exp/fwd-split-mask && bash tools/device_plan_fwd_split_mask.sh      (carry .whl)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
V="python3 tools/variants.py --rounds 3 --seqlens 512,1024,2048,8192"
# hdim 64 / 128: causal only (non-causal, only the partial last block is masked: nothing to see)
A="--hdim 64 --causal 1 --seqlens 512,2048,8192 --variant b64 --variant s64:FLASH_FWD_DEV_SPLIT_MASK=1"
B="--hdim 128 --causal 1 --seqlens 512,2048,8192 --variant b128 --variant s128:FLASH_FWD_DEV_SPLIT_MASK=1"
C="--hdim 256 --variant b256 --variant s256:FLASH_FWD_DEV_SPLIT_MASK=1"
HDIMS=128 STEPS=cmd CMD_TIMEOUT=480 \
  BG_CMD="$V $A --build-only & $V $B --build-only & $V $C --build-only & wait; touch \$OUT/bg.done" \
  EXTRA_CMD="while [ ! -e \$OUT/bg.done ]; do sleep 2; done; grep -E 'built|rror' \$OUT/bg.log; $V $C; $V $B; $V $A" \
  bash tools/device_session.sh
