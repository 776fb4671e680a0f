#!/bin/bash
# Branch exp/bwd-split-qdo: the SS backward (head dims > 128) with Q and dO in two pipelines and
# the GEMMs ordered dK, dV, dQ, so that the next step's Q and dO load under this step's last GEMMs
# (FLASH_BWD_DEV_SPLIT_QDO=1), against one Q/dO pipeline released after every GEMM, hdim 256
# (one stage: every load waits for the whole step today), both modes, causal and not, 3 rounds at
# 512 / 2k / 8k, after the variants' gradient checks. Prediction: +5-15 % at hdim 256. ~4 min.
#   run: git checkout exp/bwd-split-qdo && bash tools/device_plan_bwd_split_qdo.sh      (carry .whl)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
V="python3 tools/variants.py --bwd --deterministic --rounds 3 --seqlens 512,2048,8192 --hdim 256"
A="--variant b256 --variant q256:FLASH_BWD_DEV_SPLIT_QDO=1"
HDIMS=256 STEPS=cmd CMD_TIMEOUT=400 \
  BG_CMD="$V $A --build-only; touch \$OUT/bg.done" \
  EXTRA_CMD="while [ ! -e \$OUT/bg.done ]; do sleep 2; done; grep -E 'built|rror' \$OUT/bg.log; $V $A" \
  bash tools/device_session.sh
