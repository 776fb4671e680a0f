#!/bin/bash
# Where FA3's backward gains per clock (twentieth session: sustained at the 690 W cap, hdim 128
# non-causal 8k, ours 552 TFLOP/s at 1720 MHz, FA3 580 at 1674: FA3 does 8 % more work per clock,
# ours draws less power per clock; tools/power_probe.py). One launch of each main backward kernel
# under ncu: the tensor pipe's active cycles, shared-memory wavefronts (loads / stores, bank
# conflicts), L1 and L2 throughput, L2 reduction sectors, instructions; ours and FA3 side by side
# at hdim 128 non-causal 8k and hdim 64 causal 8k (NCU_CASES="args|args" to choose). Metric names
# are checked against `ncu --query-metrics` first, so a missing one is left out, not fatal. Then
# tools/power_probe.py at hdim 64 causal and non-causal 8k (POWER_ARGS="args|args" to choose,
# POWER_ARGS= to skip). ~5 minutes cold.
#   run: bash tools/device_plan_bwd_pipes.sh        (carry .whl and .peers)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
source tools/fa3_env.sh
HDIMS=${HDIMS:-64,128} bash tools/device_run.sh bash -c '
  fa3_wait
  ncu --query-metrics --chip gh100 > /tmp/qm.txt 2>&1 || ncu --query-metrics > /tmp/qm.txt 2>&1
  want="sm__pipe_tensor_op_gmma_cycles_active sm__pipe_tensor_op_hmma_cycles_active sm__inst_executed_pipe_tensor_op_gmma
        l1tex__data_pipe_lsu_wavefronts_mem_shared l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld
        l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld
        l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st l1tex__data_bank_reads l1tex__data_bank_writes
        l1tex__throughput lts__throughput lts__t_sectors_op_red smsp__inst_executed sm__cycles_elapsed
        smsp__inst_executed_op_shared_ld smsp__inst_executed_op_shared_st"
  metrics=""
  for m in $want; do
    if grep -q "^$m " /tmp/qm.txt; then
      case $m in
        *pipe_tensor*cycles_active|l1tex__throughput|lts__throughput|l1tex__data_bank_reads|l1tex__data_bank_writes)
          metrics="$metrics,$m.avg.pct_of_peak_sustained_elapsed";;
        sm__cycles_elapsed) metrics="$metrics,$m.max";;
        *) metrics="$metrics,$m.sum";;
      esac
    else
      echo "metric $m: not on this ncu"
    fi
  done
  metrics=${metrics#,}
  IFS="|" read -ra cases <<< "${NCU_CASES:---hdim 128 --seqlen 8192|--hdim 64 --seqlen 8192 --causal}"
  for c in "${cases[@]}"; do
    for p in ours:flash_bwd_kernel fa3:FlashAttnBwdSm90; do
      prov=${p%%:*}; kern=${p#*:}
      timeout 150 ncu --clock-control none --kernel-name-base demangled -k regex:$kern -s 1 -c 1 \
        --metrics "$metrics" --section SpeedOfLight \
        python3 tools/profile_case.py --provider $prov $c --bwd --runs 2 > /tmp/ncu_pipes.txt 2>&1
      echo "== $prov ($c): ncu exit $?"
      grep -E "Duration|SM Frequency|^ +(sm|l1tex|lts|smsp)__|==ERR|==WARN" /tmp/ncu_pipes.txt | sed "s/  */ /g" | head -30
      cat /tmp/ncu_pipes.txt >> $OUT/ncu_pipes.txt
    done
  done
  if [ -n "${POWER_ARGS-x}" ]; then
    IFS="|" read -ra pcases <<< "${POWER_ARGS:---hdim 64 --seqlen 8192 --causal|--hdim 64 --seqlen 8192}"
    for c in "${pcases[@]}"; do timeout 90 python3 tools/power_probe.py $c; done > $OUT/power.log 2>&1
    cat $OUT/power.log
  fi
'
