#!/bin/bash
# hdim 64 causal below 4k keys (the dynamic persistent 128x128 kernel with its own O and two Q
# buffers): 2 K/V stages (main) against 3 and 4 (FLASH_FWD_DEV_FORCE_STAGES; 144 / 176 KB of
# shared memory). The ncu of the fifteenth session: at 512 a tile waits for its K (try-wait) and
# its first S; with 2 stages the next tile's first K/V can only load once this tile's last block
# has released a stage. Prediction: s3 +1-3 % at 512, +0-1 % at 1k / 2k; s4 no more than s3.
# (An earlier measurement, before the Q double buffer, of 3 / 4 stages at hdim 64: -7 to +1 % /
# no gain.) ~3 minutes.
# Ran 2026-11-30 (fifteenth session), x cuDNN at 512 / 1k / 2k: s2 0.978 / 0.989 / 1.010, s3
# 0.986 / 0.972 / 0.985, s4 0.985 / 0.992 / 1.025: within the spread (1-2 %); prediction wrong
# (no +1-3 % at 512). Not adopted.
#   run: bash tools/device_plan_fwd_stages64.sh      (carry .whl)
bash tools/device_variants_only.sh \
  "@150 --hdim 64 --rounds 3 --causal 1 --seqlens 512,1024,2048 --variant s2 --variant s3:FLASH_FWD_DEV_FORCE_STAGES=3 --variant s4:FLASH_FWD_DEV_FORCE_STAGES=4"
