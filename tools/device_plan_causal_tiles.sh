#!/bin/bash
# Causal forward at short sequences (0.73-0.86x cuDNN at 512-1k): smaller tiles than the table's,
# as variants (no main build), hdim 64 and 128 side by side. About 3.5 minutes.
#   run: bash tools/device_plan_causal_tiles.sh      (carry .whl)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
V="python3 tools/variants.py --causal 1 --seqlens 512,1024,2048"
C64="--hdim 64 --variant c64 --variant c64m128:M=128,N=128,S=2,FLASH_FWD_PERSISTENT=1,FLASH_FWD_DEV_SEPARATE_O=1 --variant c64m128np:M=128,N=128,S=2"
C128="--hdim 128 --variant c128 --variant c128n64:M=128,N=64,S=3 --variant c128n96:M=128,N=96,S=2"
{ $V $C64 --build-only & $V $C128 --build-only & wait; } 2>&1 | grep -E "built|rror" > $OUT/causal.log
timeout 60 $V $C64 2>&1 | grep -v "^ptxas\|bytes" >> $OUT/causal.log; echo "c64 exit $?" >> $OUT/causal.log
timeout 60 $V $C128 2>&1 | grep -v "^ptxas\|bytes" >> $OUT/causal.log; echo "c128 exit $?" >> $OUT/causal.log
cat $OUT/causal.log
