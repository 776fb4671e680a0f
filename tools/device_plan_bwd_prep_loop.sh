#!/bin/bash
# Branch exp/bwd-prep-loop: the backward preprocess (D = rowsum(dO * O), LSE2) as resident CTAs
# striding over the row units with the next unit's loads in flight (FLASH_BWD_DEV_PREP_LOOP=1),
# and the same kernel also zeroing the float32 dQ accumulator instead of the binding's fill
# (pz: + FLASH_BWD_DEV_PREP_ZERO=1), against one CTA per unit (55-69 us for 16k tokens x 2048,
# half of HBM bandwidth; + the 29 us fill; cuDNN's kernel for both: ~70 us). The whole backward
# is timed (the preprocess and fill are ~15 % of it at 512, ~5 % at 8k), both modes, non-causal
# and causal, 3 rounds at 512 / 2k / 8k, after the variants' gradient checks. Prediction: pl
# +2-4 % at 512, +1 % at 8k; pz +3-6 % at 512. About 4 minutes.
#   run: git checkout exp/bwd-prep-loop && bash tools/device_plan_bwd_prep_loop.sh      (carry .whl)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
V="python3 tools/variants.py --bwd --deterministic --rounds 3 --seqlens 512,2048,8192 --hdim 128"
A="--variant b128 --variant pl128:FLASH_BWD_DEV_PREP_LOOP=1 --variant pz128:FLASH_BWD_DEV_PREP_LOOP=1,FLASH_BWD_DEV_PREP_ZERO=1"
HDIMS=128 STEPS=cmd CMD_TIMEOUT=330 \
  BG_CMD="$V $A --build-only; touch \$OUT/bg.done" \
  EXTRA_CMD="while [ ! -e \$OUT/bg.done ]; do sleep 2; done; grep -E 'built|rror' \$OUT/bg.log; $V $A" \
  bash tools/device_session.sh
