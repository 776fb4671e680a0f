#!/bin/bash
# Forward with one consumer warpgroup and two CTAs per SM (kBlockM = 64, flash_fwd_kernel.h
# kCtasPerSm) against the table's tiles, as variants (no main build): the short-sequence points
# (causal 512-2k at 0.73-0.94x cuDNN) are where one CTA per SM cannot overlap one tile's
# prologue and epilogue with another's GEMMs. cuDNN's forward here runs a 64x128 tile. About 5
# minutes (head dims 64 and 128; past 128 two CTAs do not fit the registers).
#   run: bash tools/device_plan_two_ctas.sh      (carry .whl)
export OUT=${OUT:-/tmp/flash_attn_hopper_out}; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
V="python3 tools/variants.py --seqlens 512,1024,2048,8192"
T128="--hdim 128 --variant t128 --variant t128a:M=64,N=128,S=1 --variant t128b:M=64,N=64,S=2"
T64="--hdim 64 --variant t64 --variant t64a:M=64,N=128,S=2"
# Also hdim 256 persistent (O staged in Q's buffer: no room for its own; ptxas 16 B spills
# non-causal, 136 B causal): today 0.81-0.89x cuDNN at 512-1k.
T256="--hdim 256 --variant t256 --variant t256p:FLASH_FWD_PERSISTENT=1"
{ $V $T128 --build-only & $V $T64 --build-only & $V $T256 --build-only & wait; } 2>&1 | grep -E "built|rror" > $OUT/twocta.log
for set in "$T128" "$T64" "$T256"; do
  timeout 80 $V $set 2>&1 | grep -v "^ptxas\|bytes" >> $OUT/twocta.log; echo "exit $?" >> $OUT/twocta.log
done
cat $OUT/twocta.log
