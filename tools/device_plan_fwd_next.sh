#!/bin/bash
# Branch exp/fwd-fast-decode (the max-free repair, the relative mask, the fast decode), variants only,
# about 9 minutes (19 variant builds, then five timed sets, each with its own timeout).
# rp (FLASH_FWD_DEV_MAX_FREE=1 + FLASH_FWD_DEV_MAX_FREE_REPAIR=1): max-free key blocks in every
#   kernel, causal too; a warp whose p exceed the slack repairs its rows from p (block max of p,
#   the row's max moved by its log2, p and the sum divided by it) instead of the warpgroup
#   computing S again, which stays for overflowing p only. Main's max-free blocks (non-causal
#   only, second S) lost 6 % in causal tiles and 20 % in hdim 256's short-keys persistent kernel
#   (its first block visited holds 32 keys: 512 = 6 x 80 + 32). Predictions: causal hdim 64 / 128
#   / 256 +2-5 % from 2k (at least equal to main at 512); hdim 256 non-causal 512 back to >= main;
#   non-causal elsewhere equal to main (+-1 %).
# ov (FLASH_FWD_DEV_MASK_REL=1 + FLASH_FWD_DEV_FAST_DECODE=1), two cuts in per-tile and mask
# instructions (ncu, hdim 64 causal 512: ~1040 instructions per consumer warp and tile outside
# the key-block loop, 60 % of all executed; the masked diagonal block 688 against 451 unmasked):
# - fast decode: the tile decode's divisions by run-time values as cutlass::FastDivmod (divisors
#   built on the host), BlockRange's divisions by a power-of-two block as shifts (~80 fewer
#   instructions per tile and warp);
# - mask on relative columns (mr):
#   relative to the thread's first column (the old code held 32 column indices in registers) and
#   tests the left window edge only in blocks it can cross (never for causal). SASS, hdim 64 causal
#   128x128: a masked block 688 -> 595 instructions; the 192x128 long-keys causal kernel's spills
#   (152 / 240 B) gone.
#   Spills (local ptxas): rp alone hdim 128 causal 136 B, rp + ov 0; hdim 256 causal main 24 / 68 B
#   (stored / loaded), ov 0. With every macro off the hdim 64 SASS equals main's.
#   Prediction for ov: causal 512-2k +2-5 % (hdim 64 most), 8k within 1 %; non-causal 512 +0-2 %.
# hdim 96 / 192 non-causal: main (max-free off) against rp.
#   Prediction: +3-6 % from 2k, like hdim 64 / 128.
# The variants' checks now include sliding windows (rows whose first visited block is masked).
#   run: bash tools/device_plan_fwd_next.sh      (carry .whl)
RP=FLASH_FWD_DEV_MAX_FREE=1,FLASH_FWD_DEV_MAX_FREE_REPAIR=1
OV=FLASH_FWD_DEV_MASK_REL=1,FLASH_FWD_DEV_FAST_DECODE=1
v() { echo "@110 --hdim $1 --rounds 3 --causal 0,1 --seqlens 512,2048,8192 --variant main$1 --variant rp$1:$RP \
  --variant ov$1:$OV --variant rpov$1:$RP,$OV"; }
w() { echo "@60 --hdim $1 --rounds 3 --causal 0 --seqlens 512,2048,8192 --variant main$1 --variant rp$1:$RP"; }
# Key lengths just past a multiple of the block (the first key block visited holds 1 key), where
# main's max-free blocks likely compute a second S in most tiles: off / main / rp, hdim 128.
ODD="@60 --hdim 128 --rounds 3 --causal 0 --seqlens 513,1025,4097 --variant off128:FLASH_FWD_DEV_MAX_FREE=0 \
  --variant odd128 --variant rpodd128:$RP"
bash tools/device_variants_only.sh "$(v 128)" "$(v 64)" "$(v 256)" "$(w 96)" "$(w 192)" "$ODD"
