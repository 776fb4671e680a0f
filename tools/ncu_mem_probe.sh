#!/bin/bash
# Memory-side view of one forward launch, ours against cuDNN (Nsight Compute, one metric pass per
# launch, caches flushed before each as do_bench does): duration, DRAM bytes and throughput, L2
# bytes, SM clock, tensor-pipe activity. Needs the package built (tools/device_session.sh, cmd).
#   PROBE_HDIM=64 PROBE_CASES="ours:--causal:512 cudnn:--causal:512" bash tools/ncu_mem_probe.sh
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
M=$M,lts__t_bytes.sum,sm__cycles_elapsed.avg.per_second,sm__throughput.avg.pct_of_peak_sustained_elapsed
M=$M,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed
HD=${PROBE_HDIM:-64}
for c in ${PROBE_CASES:-ours:--causal:512 cudnn:--causal:512 ours:--causal:1024 cudnn:--causal:1024 ours::512 cudnn::512}; do
  IFS=: read -r prov causal seqlen <<< "$c"
  if [ "$prov" = ours ]; then k="regex:flash_fwd_kernel"; else k="regex:sdpa|fprop|flash|fmha|cudnn"; fi
  echo "== $prov hdim $HD $causal seqlen $seqlen"
  timeout 100 ncu --clock-control none -k "$k" -s 2 -c 1 --metrics "$M" \
    python3 tools/profile_case.py --provider "$prov" --hdim "$HD" $causal --seqlen "$seqlen" --runs 4 2>&1 \
    | grep -vE "^==PROF== (Connected|Disconnected|Profiling)|^ours|^cudnn" | sed 's/^ *//' | cut -c1-150
done
