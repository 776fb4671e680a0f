#!/bin/bash
# Branch exp/bwd-persistent: the non-causal backward with one CTA per SM striding over the tiles
# (FLASH_BWD_DEV_PERSISTENT=1: the next tile's K/V and Q/dO load while this tile's dK/dV epilogue
# runs) against one CTA per tile, both modes, hdim 64 / 128 / 256, 3 rounds at 512 / 1k / 2k / 8k,
# after the variants' gradient checks. Prediction: +3-6 % at 512-1k, within 1 % at 8k. About 6 min.
#   run: git checkout exp/bwd-persistent && bash tools/device_plan_bwd_persistent.sh      (carry .whl)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
V="python3 tools/variants.py --bwd --deterministic --causal 0 --rounds 3 --seqlens 512,1024,2048,8192"
A="--hdim 64 --variant b64 --variant p64:FLASH_BWD_DEV_PERSISTENT=1"
B="--hdim 128 --variant b128 --variant p128:FLASH_BWD_DEV_PERSISTENT=1"
C="--hdim 256 --variant b256 --variant p256:FLASH_BWD_DEV_PERSISTENT=1"
HDIMS=128 STEPS=cmd CMD_TIMEOUT=480 \
  BG_CMD="$V $A --build-only & $V $B --build-only & $V $C --build-only & wait; touch \$OUT/bg.done" \
  EXTRA_CMD="while [ ! -e \$OUT/bg.done ]; do sleep 2; done; grep -E 'built|rror' \$OUT/bg.log; $V $A; $V $B; $V $C" \
  bash tools/device_session.sh
