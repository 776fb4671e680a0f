#!/bin/bash
# Where the forward's per-tile time goes at short sequences: ncu on one launch of the hdim 128
# non-causal forward at 1k keys (persistent 128x128 with its own O) and at 8k (persistent
# 128x176), with the source counters, saved as reports and printed per SASS instruction
# (tools/ncu_source_top.py: the instructions with the most warp-stall samples). The summary
# sections of the same run (2026-11-30): SM throughput 62 % at 1k against 77 % at 8k, the same
# stall mix. About 4 minutes; 7 files come back (keep it under 8).
#   run: bash tools/device_plan_ncu_fwd.sh      (carry .whl); reports in $OUT/ncu*.ncu-rep
#   other problems: NCU_HDIM=64 NCU_CAUSAL=--causal NCU_SEQLENS="512 8192" bash tools/device_plan_ncu_fwd.sh
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
HD=${NCU_HDIM:-128}
SECTIONS="--section SpeedOfLight --section WarpStateStats --section SourceCounters --import-source yes"
NCU="timeout 150 ncu --clock-control none -k regex:flash_fwd_kernel -s 2 -c 1 $SECTIONS"
one() {  # $1 = seqlen, $2 = tag
  echo "$NCU -o \$OUT/ncu$2 python3 tools/profile_case.py --hdim $HD ${NCU_CAUSAL:-} --seqlen $1 > /dev/null 2>&1; echo $2 \$?; \
        ncu --import \$OUT/ncu$2.ncu-rep --page source --csv --print-source sass > \$OUT/src$2.csv 2>&1; \
        ncu --import \$OUT/ncu$2.ncu-rep --page details | grep -E 'Duration|Throughput|Warp Cycles|Eligible|Issued|SM Frequency|Stall' ; \
        python3 tools/ncu_source_top.py \$OUT/src$2.csv --top 30;"
}
read -r S1 S2 <<< "${NCU_SEQLENS:-1024 8192}"
HDIMS=$HD STEPS=cmd CMD_TIMEOUT=330 EXTRA_CMD="$(one $S1 a$S1) $(one $S2 b$S2)" bash tools/device_session.sh
