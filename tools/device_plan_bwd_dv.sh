#!/bin/bash
# Backward at hdim 64: the dV GEMM issued after dS^T (the default non-causal, non-deterministic
# choice, tile_size.h bwd_dv_after_ds) against the old order forced by FLASH_BWD_DEV_DV_AFTER_DS=0,
# 3 rounds at 512 / 2k / 8k, deterministic too; per-kernel times at hdim 128; the backward tests
# at hdim 64 / 128 on the main build. About 5 minutes.
#   run: bash tools/device_plan_bwd_dv.sh      (carry .whl)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
V="python3 tools/variants.py --bwd --deterministic --rounds 3 --seqlens 512,2048,8192"
A="--hdim 64 --variant b64 --variant o64:FLASH_BWD_DEV_DV_AFTER_DS=0"
HDIMS=64,128 STEPS=cmd,bwdtest CMD_TIMEOUT=330 BWDTEST_TIMEOUT=200 \
  BG_CMD="$V $A --build-only; touch \$OUT/bg.done" \
  EXTRA_CMD="while [ ! -e \$OUT/bg.done ]; do sleep 2; done; grep -E 'built|rror' \$OUT/bg.log; \
             $V $A; python3 tools/kernel_breakdown.py --bwd --hdim 128 --seqlens 512,8192" \
  bash tools/device_session.sh
