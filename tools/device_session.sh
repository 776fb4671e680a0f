#!/bin/bash
# A whole GPU session in one bounded call (device time is the scarce thing): build the selected
# head dims, then run the chosen steps. Every step writes under $OUT as it goes, so a cut-off run
# still reports.
#   STEPS: comma list of diag, regdiag, bwdcheck, cmd, ncu, bench, benchbwd, pytest, bwdtest (default diag,bench,pytest)
#   ncu: Nsight Compute on one launch of $NCU_KERNEL (default flash_bwd_kernel) in
#        tools/profile_case.py $NCU_CASE (default --hdim 128 --seqlen 8192 --bwd), report in $OUT/ncu.txt;
#        NCU_EXTRA adds options, e.g. "--section MemoryWorkloadAnalysis_Tables --metrics
#        l1tex__data_pipe_lsu_wavefronts_mem_shared.sum" (shared-memory traffic)
#   cmd: runs $EXTRA_CMD (e.g. tools/variants.py ...; pair it with BG_CMD=... --build-only so the
#        variants build beside the main build), output in $OUT/cmd.log
#   BWD=1: also build the (experimental) backward.
#   BENCH_WAIT_FILE: the bench step first waits (up to 300 s) for this file (a background build).
set -o pipefail
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
export STEPS=${STEPS:-diag,bench,pytest}
if [ "${BWD:-0}" = 1 ]; then export FLASH_ATTN_HOPPER_EXPERIMENTAL_BACKWARD=1; fi
export HDIMS=${HDIMS:-64,128,256}
HDIMS=$HDIMS DTYPES=${DTYPES:-bf16} bash tools/device_run.sh bash -c '
  has() { case ",$STEPS," in *",$1,"*) return 0;; esac; return 1; }
  if has diag; then
  python3 -X faulthandler -c "
import torch, flash_attn_hopper._C
q = torch.randn(1, 8, 2, 72, device=\"cuda\", dtype=torch.bfloat16)
try:
    torch.ops.flash_attn_hopper.fwd(q, q, q, 0.1, False)
    print(\"uncompiled head dim: ran (it was compiled?)\")
except RuntimeError as e:
    print(\"uncompiled head dim raised:\", str(e)[:200])
" > $OUT/diag.log 2>&1; echo "diag exit $? (a crash here means C++ TORCH_CHECK errors kill the process)"; tail -5 $OUT/diag.log
  fi
  if has regdiag; then
    timeout 60 python3 tools/registry_diag.py > $OUT/regdiag.log 2>&1; echo "regdiag exit $?"; tail -12 $OUT/regdiag.log
  fi
  if has bwdcheck; then
    timeout ${BWD_TIMEOUT:-120} python3 tools/bwd_check.py --hdims $HDIMS > $OUT/bwd_check.log 2>&1
    rc=$?; echo "bwd_check exit $rc"; grep -v "^ok" $OUT/bwd_check.log | tail -30
    if [ $rc -ne 0 ] && [ -n "$SANITIZE" ]; then
      timeout 150 compute-sanitizer --print-limit 10 python3 -c "$SANITIZE" > $OUT/sanitize.log 2>&1
      echo "sanitizer exit $?"; head -60 $OUT/sanitize.log
    fi
  fi
  if has cmd; then
    timeout ${CMD_TIMEOUT:-200} bash -c "$EXTRA_CMD" > $OUT/cmd.log 2>&1; echo "cmd exit $?"; grep -v "^ptxas\|^ *[0-9]* bytes\|^ *$" $OUT/cmd.log | tail -40
  fi
  if has ncu; then
    timeout ${NCU_TIMEOUT:-180} ncu --clock-control none -k regex:${NCU_KERNEL:-flash_bwd_kernel} -s 2 -c 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section SchedulerStats --section Occupancy ${NCU_EXTRA:-} \
        python3 tools/profile_case.py ${NCU_CASE:---hdim 128 --seqlen 8192 --bwd} > $OUT/ncu.txt 2>&1
    echo "ncu exit $?"; grep -E "Throughput|Pipe|Stall|Issue|Eligible|Duration|Shared|L2|DRAM|==ERR|==WARN" $OUT/ncu.txt | head -40
  fi
  if has bench || has benchbwd; then
    extra=""; has benchbwd && extra="--bwd"
    if [ -n "$BENCH_WAIT_FILE" ]; then  # a background build the benchmark needs (e.g. FA3)
      w=0; while [ ! -f "$BENCH_WAIT_FILE" ] && [ $w -lt 300 ]; do sleep 2; w=$((w + 2)); done
      echo "waited $w s for $BENCH_WAIT_FILE"; grep -E "built in|rror" $OUT/bg.log 2>/dev/null | cut -c1-300 | tail -5
    fi
    timeout ${BENCH_TIMEOUT:-130} python3 benchmarks/benchmark_attn.py --providers ${PROVIDERS:-flash_attn_hopper,sdpa-cudnn,sdpa-flash} \
        --hdims $HDIMS $extra ${BENCH_ARGS:-} --no-check --out-dir $OUT/bench > $OUT/bench.log 2>&1; echo "bench exit $?"; tail -50 $OUT/bench.log
  fi
  if has bwdtest; then
    timeout ${BWDTEST_TIMEOUT:-200} python3 -m pytest tests/test_flash_bwd.py -q -x -n 4 -p no:cacheprovider > $OUT/bwdtest.log 2>&1
    echo "bwdtest exit $?"; grep -E "FAILED|ERROR|passed|failed|crashed" $OUT/bwdtest.log | tail -30
  fi
  if has pytest; then
    timeout ${TEST_TIMEOUT:-90} python3 -m pytest tests -v -n 4 -p no:cacheprovider ${PYTEST_ARGS:-} > $OUT/pytest.log 2>&1
    echo "pytest exit $?"; grep -E "FAILED|ERROR|passed|failed|crashed" $OUT/pytest.log | tail -40
  fi
'
