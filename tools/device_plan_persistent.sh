#!/bin/bash
# Forward persistent-mode variants only (no main build): base vs persistent vs persistent + own
# O buffer, hdim 128 and 64, each set bounded by a timeout. Output in $OUT/persist.log.
#   run: bash tools/device_plan_persist.sh      (carry .whl; about 4 minutes)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
V="python3 tools/variants.py"
FWD128="--hdim 128 --variant f128b --variant p128b:FLASH_FWD_PERSISTENT=1 --variant p128ob:M=128,N=128,S=2,FLASH_FWD_PERSISTENT=1,FLASH_FWD_DEV_SEPARATE_O=1"
FWD64="--hdim 64 --variant g64b --variant p64b:FLASH_FWD_PERSISTENT=1 --variant p64ob:FLASH_FWD_PERSISTENT=1,FLASH_FWD_DEV_SEPARATE_O=1"
{ $V $FWD128 --build-only & $V $FWD64 --build-only & wait; } 2>&1 | grep -E "built|rror" > $OUT/persist.log
timeout 75 $V $FWD128 --seqlens 512,2048,8192 2>&1 | grep -v "^ptxas\|bytes" >> $OUT/persist.log; echo "fwd128 exit $?" >> $OUT/persist.log
timeout 75 $V $FWD64 --seqlens 512,2048,8192 2>&1 | grep -v "^ptxas\|bytes" >> $OUT/persist.log; echo "fwd64 exit $?" >> $OUT/persist.log
cat $OUT/persist.log
