#!/bin/bash
# hdim 128 causal backward, two questions in one call (about 4 minutes):
# 1. Which harness is right? The grids (benchmark_attn.py: autograd, providers in a fixed order,
#    one do_bench of 100 ms) put the causal backward at 0.91-0.94x cuDNN at 4k-16k; variants.py
#    (the raw op, 3 rounds of 300 ms in rotated order) put the same kernel at 1.00-1.02x at 8k.
#    Here: kernel_breakdown (per-kernel times, ours next to cuDNN's, autograd for both), then
#    benchmark_attn with 300 ms repetitions, then variants -- the same points in each.
# 2. The split masked / unmasked step loops at hdim 128 in the persistent causal kernel (s128:
#    FLASH_BWD_DEV_SPLIT_STEPS=1), left out of main because they spill there: 24 and 47 spill
#    instructions in the masked and unmasked step loops (11 64-bit reloads of loop-invariant
#    values per step), against none in the one loop; but the unmasked loop is 504 SASS
#    instructions against the one loop's 633. Prediction: within 1 % either way (the reloads
#    hit L1; the saved instructions are not on the critical path of a GEMM-bound step).
#   run: bash tools/device_plan_bwd_causal128.sh      (carry .whl)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
V="python3 tools/variants.py --bwd --causal 1 --rounds 3 --seqlens 2048,8192,16384 --hdim 128 --variant b128 --variant s128:FLASH_BWD_DEV_SPLIT_STEPS=1"
HDIMS=128 STEPS=cmd CMD_TIMEOUT=400 \
  BG_CMD="$V --build-only; touch \$OUT/bg.done" \
  EXTRA_CMD="python3 tools/kernel_breakdown.py --hdim 128 --seqlens 8192,16384 --causal --bwd; \
    python3 benchmarks/benchmark_attn.py --providers flash_attn_hopper,sdpa-cudnn --hdims 128 --causal yes \
      --seqlens 2048,8192,16384 --bwd --rep 300 --no-check --out-dir /tmp/bench_causal128 | grep -E '^\\| 128'; \
    while [ ! -e \$OUT/bg.done ]; do sleep 2; done; grep -E 'built|rror' \$OUT/bg.log; $V" \
  bash tools/device_session.sh
