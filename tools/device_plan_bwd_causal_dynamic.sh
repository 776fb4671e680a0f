#!/bin/bash
# Branch exp/bwd-causal-dynamic: the causal backward persistent (one CTA per SM), tiles drawn
# from an atomic counter longest first in L2-sized sections of (KV head, batch) pairs, the next
# tile's K/V loading under this tile's dK/dV epilogue (FLASH_BWD_DEV_CAUSAL_PERSISTENT=1,
# default mode, hdim <= 128), against one CTA per key block. Every kernel of the branch also
# has the dQ reducer's new handshake (a staging buffer signalled free at the start of the step
# that fills it, not after the step before): the gradient checks run in both modes first.
# Prediction: causal +3-8 % at 512-1k, +1-2 % at 8k (the non-causal persistent kernel gave
# +5-8 % / +1 %, and causal tiles are half as long on average). A hang (a handshake mistake)
# ends at the timeout: 330 s. About 4 minutes.
#   run: git checkout exp/bwd-causal-dynamic && bash tools/device_plan_bwd_causal_dynamic.sh      (carry .whl)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
V="python3 tools/variants.py --bwd --deterministic --causal 1 --rounds 3 --seqlens 512,1024,2048,8192"
A="--hdim 128 --variant b128 --variant y128:FLASH_BWD_DEV_CAUSAL_PERSISTENT=1"
B="--hdim 64 --variant b64 --variant y64:FLASH_BWD_DEV_CAUSAL_PERSISTENT=1"
HDIMS=128 STEPS=cmd CMD_TIMEOUT=330 \
  BG_CMD="$V $A --build-only & $V $B --build-only & wait; touch \$OUT/bg.done" \
  EXTRA_CMD="while [ ! -e \$OUT/bg.done ]; do sleep 2; done; grep -E 'built|rror' \$OUT/bg.log; $V $A; $V $B" \
  bash tools/device_session.sh
