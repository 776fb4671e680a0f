#!/bin/bash
# MEASURED (twenty-second session; the knobs were removed after, so this plan no longer builds
# its variants; the code is at commit 2ccd7f1): ISSUE_BAR=1 / 2 and DP_AFTER_S=1 within the
# spread at hdim 128 (-4 to +1.5 %), ISSUE_BAR=1 mixed at hdim 64 (+2.8 % at 8k, -1.4 % at 16k).
# NOTES.md, twenty-second session.
# The order in which the two consumer warpgroups' GEMMs reach the tensor core, which runs them in
# issue order (flash_bwd_kernel.h):
#   FLASH_BWD_DEV_ISSUE_BAR (kIssueBar; a 256-thread barrier between two issues): 1: both S^T
#     before either dP^T (the second warpgroup's exps start 256 tensor clocks earlier at hdim
#     128, so it reaches the dS meeting sooner); 2: both dQ before either's rest of dV and dK (the
#     second warpgroup's dQ, whose staging its next S^T waits for, no longer queues behind the
#     first one's other GEMMs); 3: both.
#   FLASH_BWD_DEV_DP_AFTER_S=1 (kDpAfterS): dP^T issued after this warpgroup's S^T wait, which
#     gives bit 1's order without a barrier whenever the warpgroups start together.
# Local SASS (twenty-first session): hdim 128 step loops 426 -> 423 / 427 / 424 instructions with
# ISSUE_BAR 1 / 2 / 3, one or two BARs more, no spills.
# Prediction: ISSUE_BAR 1 and DP_AFTER_S +1-3 %, ISSUE_BAR 2 +0.5-2 %, at hdim 128 and 64;
# deterministic alike. If one holds, confirm at 2k / 16k before adopting (kIssueBar / kDpAfterS
# defaults), then tests + grid.
#   run: bash tools/device_plan_bwd_issue_bar.sh      (carry .whl; ~6 min, timeout_s 480)
bash tools/device_variants_only.sh \
  "@260 --bwd --rounds 3 --seqlens 1024,8192 --deterministic --hdim 128 --variant j0 --variant j1:FLASH_BWD_DEV_ISSUE_BAR=1 \
   --variant j2:FLASH_BWD_DEV_ISSUE_BAR=2 --variant j4:FLASH_BWD_DEV_DP_AFTER_S=1" \
  "@200 --bwd --rounds 3 --seqlens 1024,8192 --deterministic --hdim 64 --variant k0 --variant k1:FLASH_BWD_DEV_ISSUE_BAR=1 \
   --variant k4:FLASH_BWD_DEV_DP_AFTER_S=1"
