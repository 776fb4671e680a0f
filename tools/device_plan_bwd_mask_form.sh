#!/bin/bash
# MEASURED (twenty-second session; the knob was removed after, so this plan no longer builds
# its variants; the code is at commit 2ccd7f1): hdim 64 causal 1k / 8k x cuDNN 1.198 / 1.180
# (0), 1.186 / 1.201 (1), 1.152 / 1.178 (2): within the spread. NOTES.md, twenty-second session.
# The masked steps' element test (FLASH_BWD_DEV_MASK_FORM, flash_bwd_kernel.h): 0 (default) the
# coordinates tested in place; 1 one lambda for both loops; 2 a run-time value per row minus a
# compile-time offset per column. Local SASS (twentieth session): hdim 64 causal masked step
# loops 1041 -> 868 instructions with 1 and 2 in the persistent kernel (LOP3 237 -> 125), 849 ->
# 786 with 1 in the other (2 spills there: 10 LDL per step); hdim 128 only its deterministic
# causal kernel changes (552 -> 522, 1 with 1-2 LDL in the outer loops, 2 without). FA3's masked
# loop at hdim 64 runs 780 (673 unmasked; ours 629). Prediction: hdim 64 causal +1-3 % at 1k,
# +0-1 % at 8k (one masked step in 4.5 against one in 32.5); non-causal unchanged (same kernels).
# 3 rounds against cuDNN; variants.py checks the gradients (masked shapes among them) first.
# ~5 minutes.
#   run: bash tools/device_plan_bwd_mask_form.sh      (carry .whl)
bash tools/device_variants_only.sh \
  "@220 --bwd --rounds 3 --seqlens 1024,8192 --deterministic --hdim 64 --variant k0 \
   --variant k1:FLASH_BWD_DEV_MASK_FORM=1 --variant k2:FLASH_BWD_DEV_MASK_FORM=2" \
  "@120 --bwd --rounds 3 --seqlens 1024,8192 --deterministic --hdim 128 --variant j0 --variant j2:FLASH_BWD_DEV_MASK_FORM=2"
