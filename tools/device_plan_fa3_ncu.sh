#!/bin/bash
# Where FA3's backward gains on ours (same run, 2026-11-30 23:05: FA3 578 against our 518 TFLOP/s
# at hdim 128 non-causal 8k, 551 / 498 causal; hdim 64 causal 8k 496 / 396): per-kernel times
# (tools/kernel_breakdown.py: pre/post kernels, fills, the main kernel) for ours, cuDNN and FA3,
# then ncu on one launch of each main backward kernel at hdim 128 non-causal 8k: duration, SM /
# tensor / shared-memory throughput, instructions, stall reasons, registers and shared memory.
# FA3 built beside ours as in tools/device_plan_fa3.sh. ~5 minutes cold.
#   run: bash tools/device_plan_fa3_ncu.sh        (carry .whl and .peers)
# NCU_SOURCE=1: instead, ncu's source counters of each main kernel (hdim 128 non-causal 8k and
# hdim 64 causal 8k; NCU_CASES="args|args" to choose), the stall samples per SASS line and per
# opcode (tools/ncu_source_top.py) in $OUT/src_<provider>_<case>.txt. ~6 minutes cold.
# POWER_ARGS="args|args": first, tools/power_probe.py with each argument list (sustained TFLOP/s,
# SM clock and power of ours, cuDNN and FA3; ~30 s each).
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
source tools/fa3_env.sh
HDIMS=${HDIMS:-64,128} bash tools/device_run.sh bash -c '
  fa3_wait
  if [ -n "$POWER_ARGS" ]; then  # tools/power_probe.py runs, e.g. "--hdim 128 --seqlen 8192|... --fwd"
    IFS="|" read -ra pcases <<< "$POWER_ARGS"
    for c in "${pcases[@]}"; do timeout 90 python3 tools/power_probe.py $c; done > $OUT/power.log 2>&1
    cat $OUT/power.log
  fi
  [ -z "$SKIP_BREAKDOWN$NCU_SOURCE" ] && ( timeout 60 python3 tools/kernel_breakdown.py --bwd --hdim 128 --seqlens 8192
    timeout 60 python3 tools/kernel_breakdown.py --bwd --hdim 128 --seqlens 8192 --causal
    timeout 60 python3 tools/kernel_breakdown.py --bwd --hdim 64 --seqlens 8192 --causal ) > $OUT/breakdown.log 2>&1
  [ -f $OUT/breakdown.log ] && grep -E "^hdim|in all|^ +[0-9.]+ us" $OUT/breakdown.log | cut -c1-150
  if [ -n "$NCU_SOURCE" ]; then
    IFS="|" read -ra cases <<< "${NCU_CASES:---hdim 128 --seqlen 8192|--hdim 64 --seqlen 8192 --causal}"
    i=0
    for c in "${cases[@]}"; do
      i=$((i + 1))
      for p in ours:flash_bwd_kernel fa3:FlashAttnBwdSm90; do
        prov=${p%%:*}; kern=${p#*:}
        timeout 150 ncu --clock-control none --kernel-name-base demangled -k regex:$kern -s 1 -c 1 \
          --section SpeedOfLight --section WarpStateStats --section SourceCounters --import-source no \
          -o /tmp/ncu_${prov}_$i -f python3 tools/profile_case.py --provider $prov $c --bwd --runs 2 > /tmp/ncu_${prov}_$i.log 2>&1
        echo "== $prov case $i ($c): ncu exit $?"
        ncu --import /tmp/ncu_${prov}_$i.ncu-rep --page details 2>&1 | grep -E "Duration|Compute \(SM\) Throughput|Warp Cycles Per Issued" | head -3
        ncu --import /tmp/ncu_${prov}_$i.ncu-rep --page source --csv --print-source sass > /tmp/src_${prov}_$i.csv 2>&1
        python3 tools/ncu_source_top.py /tmp/src_${prov}_$i.csv --top 40 > $OUT/src_${prov}_$i.txt 2>&1
        head -30 $OUT/src_${prov}_$i.txt
      done
    done
    exit 0
  fi
  SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section InstructionStats --section LaunchStats --section Occupancy"
  for p in ${NCU_PROVIDERS:-ours:flash_bwd_kernel fa3:FlashAttnBwdSm90}; do
    prov=${p%%:*}; kern=${p#*:}
    timeout 150 ncu --clock-control none --kernel-name-base demangled -k regex:$kern -s 1 -c 1 $SECTIONS \
      python3 tools/profile_case.py --provider $prov --hdim 128 --seqlen 8192 --bwd --runs 2 > $OUT/ncu_$prov.txt 2>&1
    echo "== ncu $prov exit $?"
    grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Hit|Executed Ipc A|Issue Slots Busy|Executed Instructions  |Warp Cycles Per Issued|Eligible Warps|No Eligible|Registers Per|Shared Memory Configuration Size|Dynamic Shared Memory Per|Block Size|Grid Size|Waves Per SM|Achieved Occupancy|Stall|Pipe Utilization|L2 Hit|Mem Busy|Max Bandwidth|==ERR|==WARN" $OUT/ncu_$prov.txt | head -45
  done
'
