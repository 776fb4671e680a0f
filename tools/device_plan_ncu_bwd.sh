#!/bin/bash
# Why the causal backward trails the non-causal one (grid 2026-11-30 10:55, hdim 128 8k: causal
# 0.91x cuDNN, non-causal 0.97x; FA3's yardstick is as fast causal as non-causal): ncu on one
# launch of the hdim 128 backward main kernel at 8k, non-causal (persistent) and causal (one CTA
# per key block), with the source counters, saved as reports and printed per SASS instruction
# (tools/ncu_source_top.py). Compare the two: the stall mix, SM throughput, and where the causal
# kernel's extra samples sit (masked steps, the per-tile prologue/epilogue, the tail).
# About 4 minutes; 7 files come back (keep it under 8).
#   run: bash tools/device_plan_ncu_bwd.sh      (carry .whl); reports in $OUT/ncu*.ncu-rep
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
SECTIONS="--section SpeedOfLight --section WarpStateStats --section Occupancy --section SourceCounters --import-source yes"
NCU="timeout 150 ncu --clock-control none -k regex:flash_bwd_kernel -s 2 -c 1 $SECTIONS"
one() {  # $1 = extra profile_case flags, $2 = tag
  echo "$NCU -o \$OUT/ncu$2 python3 tools/profile_case.py --hdim 128 --seqlen 8192 --bwd $1 > /dev/null 2>&1; echo $2 \$?; \
        ncu --import \$OUT/ncu$2.ncu-rep --page details 2>&1 | \
          grep -E 'Duration|Compute \\(SM\\) Throughput|Memory Throughput|Warp Cycles Per Issued|Achieved Occupancy'; \
        ncu --import \$OUT/ncu$2.ncu-rep --page source --csv --print-source sass > \$OUT/src$2.csv 2>&1; \
        python3 tools/ncu_source_top.py \$OUT/src$2.csv --top 25;"
}
HDIMS=128 STEPS=cmd CMD_TIMEOUT=330 EXTRA_CMD="$(one '' nc) $(one --causal causal)" bash tools/device_session.sh
