#!/bin/bash
# The backward's dQ split over the keys (FLASH_BWD_DEV_DQ_KEYS; flash_bwd_kernel.h, kDqKeys;
# hdim 128, RS path): each consumer warpgroup multiplies its own keys' dS by its own K rows (a
# 64 x 128 partial in two head-dim halves), warpgroup 0 stages its partial, warpgroup 1 adds its
# own in place and hands the sum to the reducer, so the warpgroups no longer meet every step.
# k1: one signal per partial; k2: one per head-dim half; k3: k1 with 3 Q/dO stages (a drift of
# up to a step holds a stage longer). Local build: no spills in the consumers' step loops, the
# step's HGMMA count unchanged (32), ~80 more instructions per step (warpgroup 1's adds).
# Prediction: +2-6 % at hdim 128 non-causal 8k (the tensor pipe's idle stretch while both
# warpgroups do their elementwise phase partly hidden; the grid is power-capped), causal alike;
# deterministic within +-2 %.
#   run: bash tools/device_plan_bwd_dq_keys.sh      (carry .whl; ~5 min, timeout_s 600)
bash tools/device_variants_only.sh \
  "@420 --bwd --deterministic --rounds 3 --seqlens 512,2048,8192 --hdim 128 --variant b0 --variant k1:FLASH_BWD_DEV_DQ_KEYS=1 --variant k2:FLASH_BWD_DEV_DQ_KEYS=2 --variant k3:FLASH_BWD_DEV_DQ_KEYS=1,FLASH_BWD_DEV_STAGES=3"
