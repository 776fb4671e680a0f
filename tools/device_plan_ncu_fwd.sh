#!/bin/bash
# Where the forward's per-tile time goes at short sequences: ncu on one launch of the hdim 128
# non-causal forward at 1k keys (persistent 128x128 with its own O) and at 8k (persistent
# 128x176), warp stall reasons and the source lines they sit on. FA3 reaches 1.05x cuDNN at 1k
# with a 128x176 tile where ours gives 0.92 (128x128) / 0.88 (128x176). About 4 minutes.
#   run: bash tools/device_plan_ncu_fwd.sh      (carry .whl); reports in $OUT/ncu*.txt
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters"
NCU="timeout 150 ncu --clock-control none -k regex:flash_fwd_kernel -s 2 -c 1 $SECTIONS --print-details all"
HDIMS=128 STEPS=cmd CMD_TIMEOUT=320 \
  EXTRA_CMD="$NCU python3 tools/profile_case.py --hdim 128 --seqlen 1024 > \$OUT/ncu1k.txt 2>&1; echo 1k \$?; \
             $NCU python3 tools/profile_case.py --hdim 128 --seqlen 8192 > \$OUT/ncu8k.txt 2>&1; echo 8k \$?; \
             grep -hE 'Duration|Stall|Issue Slots|Eligible|Warp Cycles' \$OUT/ncu1k.txt \$OUT/ncu8k.txt | head -60" \
  bash tools/device_session.sh
