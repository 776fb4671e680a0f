#!/bin/bash
# A whole GPU session in one bounded call (device time is the scarce thing): build the benchmark
# head dims, check that an uncompiled head dim raises cleanly, benchmark against the peers, then
# run the test suite. Every step writes under $OUT as it goes, so a cut-off run still reports.
#   BWD=1: also build the experimental backward and run tools/bwd_check.py first.
set -o pipefail
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
if [ "${BWD:-0}" = 1 ]; then export FLASH_ATTN_HOPPER_EXPERIMENTAL_BACKWARD=1; fi
HDIMS=${HDIMS:-64,128,256} DTYPES=${DTYPES:-bf16} bash tools/device_run.sh bash -c '
  python3 -X faulthandler -c "
import torch, flash_attn_hopper._C
q = torch.randn(1, 8, 2, 72, device=\"cuda\", dtype=torch.bfloat16)
try:
    torch.ops.flash_attn_hopper.fwd(q, q, q, 0.1, False)
    print(\"uncompiled head dim: ran (it was compiled?)\")
except RuntimeError as e:
    print(\"uncompiled head dim raised:\", str(e)[:200])
" > $OUT/diag.log 2>&1; echo "diag exit $? (a crash here means C++ TORCH_CHECK errors kill the process)"; tail -5 $OUT/diag.log
  if [ "${BWD:-0}" = 1 ]; then
    timeout ${BWD_TIMEOUT:-120} python3 tools/bwd_check.py --hdims ${HDIMS:-64,128,256} > $OUT/bwd_check.log 2>&1
    echo "bwd_check exit $?"; grep -v "^ok" $OUT/bwd_check.log | tail -20
  fi
  timeout ${BENCH_TIMEOUT:-130} python3 benchmarks/benchmark_attn.py --providers flash_attn_hopper,sdpa-cudnn,sdpa-flash \
      --no-check --out-dir $OUT/bench > $OUT/bench.log 2>&1; echo "bench exit $?"; tail -45 $OUT/bench.log
  timeout ${TEST_TIMEOUT:-90} python3 -m pytest tests -v -n 4 -p no:cacheprovider > $OUT/pytest.log 2>&1
  echo "pytest exit $?"; grep -E "FAILED|ERROR|passed|failed|crashed" $OUT/pytest.log | tail -40
'
