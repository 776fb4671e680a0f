#!/bin/bash
# main: the non-causal hdim 256 backward persistent (FLASH_BWD_DEV_PERSISTENT=1; one CTA per SM
# striding over the key blocks, the next K/V loading under the dK/dV epilogue) against one CTA
# per key block, now that its Q and dO come through two pipelines. Before that change it gave
# +4.5 % at 512 and -1.5 % at 8k. Prediction: +2-4 % at 512-1k, within 1 % at 8k. Default mode
# only (deterministic is not persistent). 3 rounds, after the variants' gradient checks. ~3 min.
#   run: bash tools/device_plan_bwd_persistent_256.sh      (carry .whl)
HDIMS=256 CMD_TIMEOUT=300 bash tools/device_plan_variants.sh \
  "--bwd --causal 0 --rounds 3 --seqlens 512,1024,2048,8192" \
  "--hdim 256 --variant b256 --variant p256:FLASH_BWD_DEV_PERSISTENT=1"
