#!/bin/bash
# hdim 256 non-causal short keys (0.98x cuDNN at 512 in the 20:42 grid): main's persistent 128x80
# tile (O in Q's buffer) pads 512 keys to 7 blocks of 80 = 560 (the last block holds 32 keys,
# masked), where 128x64 runs 8 whole blocks. Variants, one build each (the developer tile
# override applies to every hdim 256 kernel of the build, so only non-causal is timed):
#   b256   main;
#   n64    128x64, 2 stages, persistent (FLASH_FWD_PERSISTENT=1; O in Q's buffer as main's, and
#          no max-free blocks, as main's persistent hdim 256 kernel). Built locally: 0 / 8 B spills.
# Prediction, n64 against b256: 512 +3-6 % (9 % fewer padded keys, minus the per-block cost of
# 8 blocks against 7), 640 (80 x 8, whole for both) -2 to -4 %, 1k -1 to +1 % (1040 against
# 1024 keys), 2k -2 to 0 %. If n64 wins at 512: the hdim 128 rule (tile_size.h
# fwd_keys_class_for) generalised to a short-keys pair, or 128x64 below 1k keys.
# Measured (sixteenth session, x cuDNN at 512 / 640 / 1k / 2k): b256 0.995 / 1.061 / 1.028 / 1.068,
# n64 1.008 / 1.014 / 1.006 / 1.029. +1.3 % at 512 only (within the spread): not adopted.
# ~3 minutes.
#   run: bash tools/device_plan_fwd_256n64.sh      (carry .whl)
bash tools/device_variants_only.sh \
  "@150 --hdim 256 --rounds 3 --causal 0 --seqlens 512,640,1024,2048 --variant b256 --variant n64:M=128,N=64,S=2,FLASH_FWD_PERSISTENT=1"
