#!/bin/bash
# FlashAttention-3 in the same run: the grid (forward + backward, hdim 64 / 128 / 256, causal and
# not, 3 rounds) for flash_attn_hopper, cuDNN and FA3, FA3 built on the machine from the archives
# of tools/fa3_peer.py (FA3 0251105, the commit shared/BENCHMARKS.md measured, with its pinned
# CUTLASS) beside our own build. Why: the issues' absolute bars (700 / 570 TFLOP/s at hdim 128
# non-causal 8k) are FA3's yardstick numbers from another run, and this GPU's cuDNN reads 12-16 %
# under its yardstick numbers; FA3 measured here says what this machine gives the peer.
# ~7-8 minutes cold (the FA3 build ~3 min beside ours, the grid ~4-5 min).
#   run: bash tools/device_plan_fa3.sh        (carry .whl and .peers)
#   PROVIDERS=... HDIMS_BENCH=128 BENCH_ARGS="--seqlens 8192 --causal no" to narrow it
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
source tools/fa3_env.sh
export PROVIDERS=${PROVIDERS:-flash_attn_hopper,sdpa-cudnn,fa3}
export HDIMS_BENCH=${HDIMS_BENCH:-64,128,256} BENCH_ARGS=${BENCH_ARGS:---rounds 3}
HDIMS=64,128,256 bash tools/device_run.sh bash -c '
  fa3_wait
  python3 tools/fa3_peer.py check 2>&1 | tail -4
  timeout ${BENCH_TIMEOUT:-330} python3 benchmarks/benchmark_attn.py --providers $PROVIDERS --hdims $HDIMS_BENCH \
      --bwd $BENCH_ARGS --no-check --out-dir $OUT/bench > $OUT/bench.log 2>&1
  echo "bench exit $?"; tail -60 $OUT/bench.log
'
