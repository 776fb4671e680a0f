#!/bin/bash
# The order in which the two consumer warpgroups' GEMMs reach the tensor core
# (FLASH_BWD_DEV_ISSUE_BAR, flash_bwd_kernel.h kIssueBar; a 256-thread barrier between two
# issues). 1: both S^T before either dP^T (the second warpgroup's exps start 256 tensor clocks
# earlier at hdim 128, so it reaches the dS meeting sooner); 2: both dQ before either's rest of
# dV and dK (the second warpgroup's dQ, whose staging its next S^T waits for, no longer queues
# behind the first one's other GEMMs); 3: both. Local SASS (twenty-first session): hdim 128 step
# loops 426 -> 423 / 427 / 424 instructions, one or two BARs more, no spills.
# Prediction: 1: +1-3 %, 2: +0.5-2 %, 3: the sum, at hdim 128 and 64; deterministic alike.
#   run: bash tools/device_plan_bwd_issue_bar.sh      (carry .whl; ~5 min)
bash tools/device_variants_only.sh \
  "@240 --bwd --rounds 3 --seqlens 1024,8192 --deterministic --hdim 128 --variant j0 --variant j1:FLASH_BWD_DEV_ISSUE_BAR=1 \
   --variant j2:FLASH_BWD_DEV_ISSUE_BAR=2 --variant j3:FLASH_BWD_DEV_ISSUE_BAR=3" \
  "@200 --bwd --rounds 3 --seqlens 1024,8192 --deterministic --hdim 64 --variant k0 --variant k1:FLASH_BWD_DEV_ISSUE_BAR=1 \
   --variant k3:FLASH_BWD_DEV_ISSUE_BAR=3"
