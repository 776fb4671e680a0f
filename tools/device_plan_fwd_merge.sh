#!/bin/bash
# Max-free key blocks off / on in every forward kernel (the policy's measurement; written on
# branch exp/fwd-merge, now on main): the relative mask and the fast decode on by default (ov,
# measured on exp/fwd-fast-decode: causal +2-5 %, non-causal equal), and max-free key blocks
# only after the tile's first full unmasked block (n < n_free_from), whose max is taken exactly
# (next_block<true>: no lazy slack in kernels with max-free blocks). ~4.5 min.
# First run of this plan (without the exact max): keys just past a block multiple still lost
# 25-37 % with max-free blocks (hdim 128 1025: off 1.092, max-free 0.759-0.773 x cuDNN; hdim 64
# 1025: 1.244 -> 0.790); causal with max-free lost 2-5 %. Cause: the lazy rule keeps the max of
# the first (1-key or diagonal) block unless a later one exceeds it by 2^8, so later blocks'
# partial sums pass 2^8 and the warpgroup computes S again on most blocks.
# Variants: off (FLASH_FWD_DEV_MAX_FREE=0), all (FLASH_FWD_DEV_MAX_FREE=1: every kernel).
# Predictions: 1025 with max-free >= off (+3-8 % like the multiples); causal all >= off from 2k
# (+2-5 %), 512 within 2 %; hdim 256 non-causal 512 (persistent, first block 32 keys) all >= off;
# hdim 96 / 192 non-causal +5-10 % from 2k (as measured in the first run), causal >= off.
#   run: bash tools/device_plan_fwd_merge.sh      (carry .whl)
ON=FLASH_FWD_DEV_MAX_FREE=1
OFF=FLASH_FWD_DEV_MAX_FREE=0
bash tools/device_variants_only.sh \
  "@70 --hdim 128 --rounds 3 --causal 0,1 --seqlens 512,1025,2048,8192 --variant off128:$OFF --variant all128:$ON" \
  "@70 --hdim 64 --rounds 3 --causal 0,1 --seqlens 512,1025,2048,8192 --variant off64:$OFF --variant all64:$ON" \
  "@60 --hdim 256 --rounds 3 --causal 0,1 --seqlens 512,1025,2048,8192 --variant off256:$OFF --variant all256:$ON" \
  "@60 --hdim 96 --rounds 3 --causal 0,1 --seqlens 1025,2048,8192 --variant off96:$OFF --variant all96:$ON" \
  "@60 --hdim 192 --rounds 3 --causal 0,1 --seqlens 1025,2048,8192 --variant off192:$OFF --variant all192:$ON"
