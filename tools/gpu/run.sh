#!/bin/bash
# The device runner: one bounded GPU call (build, checks, tests, benchmarks, variants, profilers),
# parametrized by environment variables. Run from the repository root on the GPU machine:
#
#   [STEPS=build,check,pytest] [HDIMS=64,128,256] [DTYPES=bf16] [VAR=value ...] bash tools/gpu/run.sh ["VARIANT SET" ...]
#
# Carry .whl/ (the nvidia-cutlass wheel and anything else to pip-install, e.g. triton) and, for the
# fa3 step, .peers/ (tools/gpu/fa3_peer.py pack). Every step writes its log under $OUT as it goes
# (a cut-off call still reports) and prints a short summary; a failed step does not stop the
# later ones, except a failed build. The exit status is 1 if any step failed.
#
# STEPS (comma list; they run in this order whatever order they are given in):
#   fa3        build FlashAttention-3 (tools/gpu/fa3_peer.py) in the background beside our build;
#              bench / breakdown / power / ncu wait for it, and bench then times the fa3 provider;
#              FA3_ENABLE=SOFTCAP,VARLEN compiles those features in (the peers of scoremods / varlen);
#              a peer prebuilt on the CPU machine and carried in $FA3_PREBUILT (.peers/fa3built:
#              `tools/gpu/fa3_peer.py build --out .peers/fa3built --jobs 2 --enable VARLEN`, ~4 min there)
#              is used instead, at no device time
#   build      build HDIMS x DTYPES in place (MAX_JOBS=16, ptxas -v), $OUT/build.log
#   wheel      pack that build as a wheel into $OUT/wheel/ (reuses the compiled objects)
#   wheeltest  a wheel built elsewhere (WHEEL, default the newest carried dist/flash_attn_hopper-*.whl,
#              e.g. built on the CPU machine by tools/build/build_wheel.sh), installed unchanged into a
#              fresh venv outside the checkout that sees the machine's torch; then, as the README says,
#              `python -m flash_attn_hopper` from /tmp and `pytest tests -q -rs` from the repository
#              root against the installed wheel (no source tree on the path), $OUT/wheeltest.log
#   check      tools/check/fwd_check.py and bwd_check.py on HDIMS x DTYPES
#   pytest     pytest $PYTEST_FILES (default tests) -n $PYTEST_WORKERS (4; 0: no xdist) $PYTEST_ARGS (-q -rs);
#              FULL=1 sets FLASH_ATTN_HOPPER_FULL_TESTS=1
#   bench      benchmarks/benchmark_attn.py: $PROVIDERS on $BENCH_HDIMS (default HDIMS), forward and
#              backward (BENCH_FWD_ONLY=1: forward), $BENCH_ARGS (default --rounds 3), $OUT/bench/
#   baseline   our build against a baseline build, alternating runs of one benchmark in separate
#              processes: $BASELINE (default .peers/baseline.tar.gz) is an older commit's source
#              (`git archive --format=tar.gz -o .peers/baseline.tar.gz <commit>`, built here for
#              BENCH_HDIMS (default HDIMS) x DTYPES, BASELINE_BUILD_TIMEOUT 300, and timed with its
#              own scripts) or a wheel (a variant built on the CPU machine, timed with ours);
#              BASELINE_ROUNDS (3) runs per version of $BASELINE_BENCH (default benchmark_attn.py
#              with ours and sdpa-cudnn, $BASELINE_ARGS default "--bwd"; e.g. "benchmark_varlen.py
#              --cases ragged --bwd --rounds 1" with BASELINE_TABLE="--ours varlen --anchor
#              fa3-varlen"; BASELINE_TESTS, e.g. "tests/test_varlen_gpu.py", first runs those tests
#              against the baseline build and times nothing if they fail), then
#              tools/gpu/baseline_grid.py $BASELINE_TABLE: new / old per point,
#              $OUT/baseline.{csv,md}. "new" is what later steps import (the checkout's build, or
#              the carried wheel with WHEEL_SITE=1)
#   variants   tools/gpu/variants.py on each VARIANT SET given as an argument: "[@SECONDS] <variants.py
#              arguments>", e.g. "@200 --bwd --hdim 128 --variant a --variant b:FLASH_BWD_DEV_X=1";
#              $VARIANTS_COMMON is prepended to every set. The sets build side by side (beside the
#              main build when STEPS has build), then each is checked and timed under its own
#              timeout (@SECONDS, else $SET_TIMEOUT, 110 s); timings in $OUT/variants.log
#   breakdown  tools/profile/kernel_breakdown.py per case of $BREAKDOWN_CASES ("args|args",
#              default "--bwd --hdim 128 --seqlens 8192")
#   power      tools/profile/power_probe.py per case of $POWER_CASES ("args|args",
#              default "--hdim 128 --seqlen 8192")
#   ncu        Nsight Compute on one launch per case of $NCU_CASES (tools/profile/profile_case.py
#              arguments, "args|args", default "--hdim 128 --seqlen 8192 --bwd") and per provider of
#              $NCU_PROVIDERS (ours, fa3, cudnn; default ours); the kernel regex is $NCU_KERNEL or
#              the provider's main kernel. $NCU_SECTIONS (default: speed of light, compute, memory,
#              warp state, scheduler, occupancy; empty: none), $NCU_METRICS (comma list, e.g.
#              dram__bytes_read.sum; `ncu --query-metrics` lists them), $NCU_EXTRA (more options);
#              NCU_SOURCE=1 adds the source counters and prints the SASS lines with the most stall
#              samples (tools/profile/ncu_source_top.py). Reports: $OUT/ncu_*.ncu-rep
#   sanitize   compute-sanitizer over tools/check/sanitize_check.py (HDIMS, first dtype): first
#              the planted-overrun probe (must be caught), then each of $SANITIZE_TOOLS (default
#              memcheck,synccheck,racecheck,varlen,paged; all but memcheck on the --quick cases)
#   cmd        bash -c "$CMD" (anything else: tools/profile/shape_probe.py, power_probe.py, ...)
#   readme     the README's "fresh Hopper machine" commands ($README_CMDS, default 1,2), taken from
#              README.md and run verbatim from the repository root as a user's shell would run them
#              (no PYTHONPATH, none of the build knobs above), pip pointed at the carried .whl/
#              and .whl/readme/ (PIP_NO_INDEX=1, PIP_FIND_LINKS; no network here: .whl/readme/ holds
#              nvidia-cutlass's dependencies the machine lacks, cuda-python, pydot, treelib and theirs,
#              kept out of the runner's /tmp/site), each under /usr/bin/time -v
#              (wall time, peak memory) and README_TIMEOUT (560); $OUT/readme_N.log
# Default STEPS: build,check,pytest.
#
# WHEEL_SITE=1: the steps after wheeltest (check, bench, sanitize, cmd, ...) import the carried wheel
# (WHEEL, else the newest dist/flash_attn_hopper-*.whl) installed into /tmp/fah-site, not the checkout;
# scripts run from the repository root then see only the wheel (pytest from the root does not: use wheeltest).
# Build knobs: HDIMS (64,128,256), DTYPES (bf16), DISABLE_BACKWARD=1 (forward kernels only),
# DEFINES="KEY=VALUE,KEY2" (developer macros, added as -D flags to
# FLASH_ATTN_HOPPER_EXTRA_NVCC_FLAGS, which passes through too), MAX_JOBS (16).
# Timeouts in seconds: BUILD_TIMEOUT 480, CHECK_TIMEOUT 200, TEST_TIMEOUT 300, BENCH_TIMEOUT 330,
# SET_TIMEOUT 110, BREAKDOWN_TIMEOUT 60, POWER_TIMEOUT 90, NCU_TIMEOUT 150 (per case),
# MEMCHECK_SECS 200, SYNCCHECK_SECS 80, RACECHECK_SECS 120, CMD_TIMEOUT 300, FA3_WAIT 300.
#
# Examples (tools/README.md has more):
#   STEPS=build,pytest,bench PROVIDERS=flash_attn_hopper,sdpa-cudnn,sdpa-flash,flash_attn_hopper-det bash tools/gpu/run.sh
#   STEPS=build,pytest HDIMS=64,96,128,192,256 DTYPES=fp16,bf16 FULL=1 bash tools/gpu/run.sh
#   STEPS=variants VARIANTS_COMMON="--bwd --rounds 3 --seqlens 1024,8192" bash tools/gpu/run.sh \
#     "@200 --hdim 128 --variant a0 --variant a1:FLASH_BWD_DEV_X=1" "@150 --hdim 64 --variant b0 --variant b1:FLASH_BWD_DEV_X=1"
set -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
REPO=$PWD
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
STEPS=${STEPS:-build,check,pytest}
HDIMS=${HDIMS:-64,128,256}
DTYPES=${DTYPES:-bf16}
known=",fa3,build,wheel,check,pytest,wheeltest,bench,baseline,variants,readme,breakdown,power,ncu,sanitize,cmd,"
for s in ${STEPS//,/ }; do
  case "$known" in *",$s,"*) ;; *) echo "run.sh: unknown step '$s' (known: ${known:1:-1})"; exit 2;; esac
done
has() { case ",$STEPS," in *",$1,"*) return 0;; esac; return 1; }
failed=""
step() { echo; echo "== $1 ($(date -u +%H:%M:%S))"; }
result() {  # $1 step, $2 exit status
  echo "$1 exit $2"
  [ "$2" -eq 0 ] || failed="$failed $1"
}
split_cases() {  # "a|b|c" -> one case per line
  tr '|' '\n' <<< "$1" | sed '/^ *$/d'
}

# Carried wheels (nvidia-cutlass, ...), installed beside the machine's own packages.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "run.sh: installing .whl/*.whl failed"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ "${WHEEL_SITE:-0}" = 1 ]; then  # the carried wheel (as wheeltest picks it), not the checkout
  site_wheel=${WHEEL:-$(ls -t dist/flash_attn_hopper-*.whl 2>/dev/null | head -n 1)}
  # A warm machine keeps /tmp between calls: an earlier call's wheel must not stay in its place.
  rm -rf /tmp/fah-site
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fah-site "$site_wheel" \
    || { echo "run.sh: installing $site_wheel failed"; exit 1; }
  export PYTHONPATH=/tmp/fah-site${PYTHONPATH:+:$PYTHONPATH}
  echo "run.sh: flash_attn_hopper from $site_wheel ($(sha256sum "$site_wheel" | cut -c1-12))"
else
  export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
fi

# Build configuration (setup.py and tools/gpu/variants.py read these).
export FLASH_ATTN_HOPPER_HDIMS=$HDIMS FLASH_ATTN_HOPPER_DTYPES=$DTYPES MAX_JOBS=${MAX_JOBS:-16}
export FLASH_ATTN_HOPPER_VERBOSE_PTXAS=${FLASH_ATTN_HOPPER_VERBOSE_PTXAS:-1}  # spills, "Performance Loss"
[ "${DISABLE_BACKWARD:-0}" = 1 ] && export FLASH_ATTN_HOPPER_DISABLE_BACKWARD=1
if [ -n "${DEFINES:-}" ]; then
  for d in ${DEFINES//,/ }; do FLASH_ATTN_HOPPER_EXTRA_NVCC_FLAGS="${FLASH_ATTN_HOPPER_EXTRA_NVCC_FLAGS:+$FLASH_ATTN_HOPPER_EXTRA_NVCC_FLAGS }-D$d"; done
  export FLASH_ATTN_HOPPER_EXTRA_NVCC_FLAGS
fi
[ "${FULL:-0}" = 1 ] && export FLASH_ATTN_HOPPER_FULL_TESTS=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader | tee "$OUT/gpu.txt"
echo "steps $STEPS; hdims $HDIMS; dtypes $DTYPES; extra nvcc flags: ${FLASH_ATTN_HOPPER_EXTRA_NVCC_FLAGS:-none}"

# fa3: FlashAttention-3 builds in the background; $FA3_DONE holds its exit status when it ends.
FA3_DIR=/tmp/fa3peer FA3_DONE=/tmp/fa3peer.rc FA3_PREBUILT=${FA3_PREBUILT:-.peers/fa3built}
fa3_wait() {
  has fa3 || return 0
  local waited=0
  while [ ! -f "$FA3_DONE" ] && [ $waited -lt "${FA3_WAIT:-300}" ]; do sleep 2; waited=$((waited + 2)); done
  if [ -z "$fa3_reported" ]; then
    fa3_reported=1
    echo "FA3 build rc=$(cat "$FA3_DONE" 2>/dev/null || echo timeout) (waited ${waited} s)"
    grep -E "built in|rror" "$OUT/fa3_build.log" 2>/dev/null | cut -c1-300 | tail -8
    python3 tools/gpu/fa3_peer.py check 2>&1 | tail -4
  fi
}
if has fa3; then
  step fa3
  rm -f "$FA3_DONE"
  if [ -f "$FA3_PREBUILT/flash_attn_3/_C.so" ]; then  # built on the CPU machine: no device minutes
    export PYTHONPATH=$REPO/$FA3_PREBUILT:$PYTHONPATH
    echo 0 > "$FA3_DONE"
    echo "FA3: the prebuilt peer in $FA3_PREBUILT ($(grep -o "'FLASHATTENTION_DISABLE_VARLEN': [A-Za-z]*" "$FA3_PREBUILT/flash_attn_config.py"))"
  else
    export PYTHONPATH=$FA3_DIR:$PYTHONPATH
    rm -f "$FA3_DIR/flash_attn_3/lock"  # a build cut off by an earlier call's end leaves torch's lock
    (python3 tools/gpu/fa3_peer.py build --out "$FA3_DIR" --jobs "${FA3_JOBS:-8}" > "$OUT/fa3_build.log" 2>&1
     echo $? > "$FA3_DONE") &
    echo "building FA3 into $FA3_DIR in the background (log $OUT/fa3_build.log)"
  fi
fi

# variants: the sets' builds start now, beside the main build.
args_of() { case "$1" in @*) echo "${1#* }";; *) echo "$1";; esac; }
timeout_of() { case "$1" in @*) local t="${1%% *}"; echo "${t#@}";; *) echo "${SET_TIMEOUT:-110}";; esac; }
variant_pids=()
if has variants; then
  [ $# -gt 0 ] || { echo "run.sh: the variants step needs variant sets as arguments"; exit 2; }
  # Each variant builds in /tmp/flash_variants/<name>: a name in two sets would load the other's library.
  dup=$(for set in "$@"; do args_of "$set"; echo; done | grep -o -- "--variant [^: ]*" | awk '{print $2}' | sort | uniq -d)
  [ -z "$dup" ] || { echo "run.sh: variant names repeat across sets: $dup"; exit 2; }
  i=0
  for set in "$@"; do
    i=$((i + 1))
    # shellcheck disable=SC2046
    python3 tools/gpu/variants.py ${VARIANTS_COMMON:-} $(args_of "$set") --build-only > "$OUT/variants_build$i.log" 2>&1 &
    variant_pids+=($!)
  done
  variants_start=$(date +%s)
fi

if has build; then
  step build
  start=$(date +%s)
  timeout "${BUILD_TIMEOUT:-480}" python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1
  rc=$?
  echo "built in $(( $(date +%s) - start )) s"
  grep -E "error|flash_attn_hopper: |^ +[0-9.]+ s  |Performance Loss" "$OUT/build.log" | cut -c1-400 | tail -30
  result build $rc
  if [ $rc -ne 0 ]; then tail -60 "$OUT/build.log"; echo "run.sh: build failed, stopping"; exit 1; fi
fi

if has wheel; then
  step wheel
  timeout "${BUILD_TIMEOUT:-480}" python3 -m pip wheel --no-build-isolation --no-deps -w "$OUT/wheel" . > "$OUT/wheel.log" 2>&1
  rc=$?; ls -l "$OUT/wheel" 2>/dev/null; [ $rc -eq 0 ] || tail -20 "$OUT/wheel.log"
  result wheel $rc
fi

if has check; then
  step check
  timeout "${CHECK_TIMEOUT:-200}" python3 tools/check/fwd_check.py --hdims "$HDIMS" --dtypes "$DTYPES" > "$OUT/fwd_check.log" 2>&1
  rc=$?; grep -v "^ok" "$OUT/fwd_check.log" | tail -20; echo "$(grep -c '^ok' "$OUT/fwd_check.log") forward cases ok"
  result fwd_check $rc
  if [ "${DISABLE_BACKWARD:-0}" != 1 ]; then
    timeout "${CHECK_TIMEOUT:-200}" python3 tools/check/bwd_check.py --hdims "$HDIMS" --dtypes "$DTYPES" > "$OUT/bwd_check.log" 2>&1
    rc=$?; grep -v "^ok" "$OUT/bwd_check.log" | tail -20; echo "$(grep -c '^ok' "$OUT/bwd_check.log") backward cases ok"
    result bwd_check $rc
  fi
  vl_bwd=$([ "${DISABLE_BACKWARD:-0}" = 1 ] && echo --no-bwd)
  # shellcheck disable=SC2086
  timeout "${CHECK_TIMEOUT:-200}" python3 tools/check/varlen_check.py --hdims "$HDIMS" --dtype "${DTYPES%%,*}" \
    $vl_bwd > "$OUT/varlen_check.log" 2>&1
  rc=$?; grep -v "^ok\|^ran" "$OUT/varlen_check.log" | tail -20; echo "$(grep -c '^ok' "$OUT/varlen_check.log") varlen cases ok"
  result varlen_check $rc
  timeout "${CHECK_TIMEOUT:-200}" python3 tools/check/paged_check.py --hdims "$HDIMS" --dtype "${DTYPES%%,*}" \
    > "$OUT/paged_check.log" 2>&1
  rc=$?; grep -v "^ok\|^ran" "$OUT/paged_check.log" | tail -20; echo "$(grep -c '^ok' "$OUT/paged_check.log") paged cases ok"
  result paged_check $rc
fi

if has pytest; then
  step pytest
  workers=""; [ "${PYTEST_WORKERS:-4}" = 0 ] || workers="-n ${PYTEST_WORKERS:-4}"  # 0: no pytest-xdist
  # shellcheck disable=SC2086
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest ${PYTEST_FILES:-tests} $workers -p no:cacheprovider \
    ${PYTEST_ARGS:--q -rs} > "$OUT/pytest.log" 2>&1
  rc=$?
  grep -E "FAILED|ERROR|SKIPPED|passed|failed|crashed" "$OUT/pytest.log" | sort | uniq -c | sort -rn | head -30
  result pytest $rc
fi

if has wheeltest; then
  step wheeltest
  wheel=${WHEEL:-$(ls -t dist/flash_attn_hopper-*.whl 2>/dev/null | head -n 1)}
  if [ -z "$wheel" ] || [ ! -f "$wheel" ]; then
    echo "no wheel: carry dist/ with a flash_attn_hopper wheel, or set WHEEL"; result wheeltest 1
  else
    wt=/tmp/fah-wheel-target
    workers=""; [ "${PYTEST_WORKERS:-4}" = 0 ] || workers="-n ${PYTEST_WORKERS:-4}"  # 0: no pytest-xdist
    rm -rf "$wt"
    # Installed unchanged into a directory of its own beside the machine's torch (a venv would not
    # see a torch that itself lives in a venv). Only that directory and the carried helper wheels
    # (nvidia-cutlass for the host-program tests) are on the path: the repository root must not be,
    # or the source tree would shadow the installed package (PYTHONSAFEPATH=1, Python >= 3.11, keeps
    # `python -m pytest` from putting it first; on an older Python the tests' conftest refuses).
    wpath=$wt; [ -d /tmp/site ] && wpath=$wt:/tmp/site
    (
      set -e
      echo "wheel: $wheel ($(du -k "$wheel" | cut -f1) KiB)"
      env -u PYTHONPATH python3 -m pip install -q --no-deps --no-index --no-compile --target "$wt" "$wheel"
      cd /tmp && PYTHONPATH=$wpath python3 -m flash_attn_hopper --no-bench
      cd "$REPO" && PYTHONPATH=$wpath FLASH_ATTN_HOPPER_FULL_TESTS=${FLASH_ATTN_HOPPER_FULL_TESTS:-} \
        PYTHONSAFEPATH=1 timeout "${TEST_TIMEOUT:-300}" python3 -m pytest tests -q -rs -p no:cacheprovider $workers
    ) > "$OUT/wheeltest.log" 2>&1
    rc=$?
    grep -E "^wheel:|extension:|torch:|runtime:|FAILED|ERROR|passed|failed" "$OUT/wheeltest.log" | head -30
    result wheeltest $rc
  fi
fi

if has bench; then
  step bench
  fa3_wait
  providers=${PROVIDERS:-flash_attn_hopper,sdpa-cudnn,sdpa-flash}
  if has fa3 && [ -z "${PROVIDERS:-}" ]; then providers=flash_attn_hopper,sdpa-cudnn,fa3,sdpa-flash; fi
  bwd="--bwd"; [ "${BENCH_FWD_ONLY:-0}" = 1 ] && bwd=""
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-330}" python3 benchmarks/benchmark_attn.py --providers "$providers" \
    --hdims "${BENCH_HDIMS:-$HDIMS}" $bwd ${BENCH_ARGS:---rounds 3} --no-check --out-dir "$OUT/bench" > "$OUT/bench.log" 2>&1
  rc=$?; tail -60 "$OUT/bench.log"
  result bench $rc
fi

if has baseline; then
  step baseline
  base=${BASELINE:-.peers/baseline.tar.gz}
  rc=1
  rm -rf /tmp/baseline /tmp/baseline-site && mkdir -p /tmp/baseline
  if [ ! -f "$base" ]; then
    echo "no $base: carry a git archive of the baseline commit, or a wheel"
  elif [[ "$base" == *.whl ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/baseline-site "$base"; rc=$?
    base_scripts=$REPO
  else
    tar xzf "$base" -C /tmp/baseline
    start=$(date +%s)
    (cd /tmp/baseline && FLASH_ATTN_HOPPER_HDIMS=${BENCH_HDIMS:-$HDIMS} timeout "${BASELINE_BUILD_TIMEOUT:-300}" \
      python3 -m pip install -q --no-build-isolation --no-deps --no-index --no-compile --target /tmp/baseline-site . \
      > "$OUT/baseline_build.log" 2>&1)
    rc=$?
    echo "baseline built in $(( $(date +%s) - start )) s (exit $rc)"
    [ $rc -eq 0 ] || tail -20 "$OUT/baseline_build.log"
    base_scripts=/tmp/baseline
  fi
  if [ $rc -eq 0 ] && [ -n "${BASELINE_TESTS:-}" ]; then  # a variant is timed only once its results are right
    workers=""; [ "${PYTEST_WORKERS:-4}" = 0 ] || workers="-n ${PYTEST_WORKERS:-4}"  # 0: no pytest-xdist
    # shellcheck disable=SC2086
    (cd "$REPO" && PYTHONPATH=/tmp/baseline-site:$PYTHONPATH PYTHONSAFEPATH=1 timeout "${TEST_TIMEOUT:-300}" \
      python3 -m pytest -q -p no:cacheprovider $workers $BASELINE_TESTS > "$OUT/baseline_tests.log" 2>&1)
    rc=$?
    echo "baseline tests ($BASELINE_TESTS) exit $rc: $(tail -1 "$OUT/baseline_tests.log")"
  fi
  if [ $rc -eq 0 ]; then
    fa3_wait
    bench=${BASELINE_BENCH:-benchmark_attn.py --hdims ${BENCH_HDIMS:-$HDIMS} --providers flash_attn_hopper,sdpa-cudnn --no-check ${BASELINE_ARGS:---bwd}}
    for i in $(seq "${BASELINE_ROUNDS:-3}"); do
      for v in old new; do
        if [ $v = old ]; then path=/tmp/baseline-site:$PYTHONPATH; scripts=$base_scripts/benchmarks
        else path=$PYTHONPATH; scripts=$REPO/benchmarks; fi
        dir=$OUT/baseline-$v-$i; mkdir -p "$dir"
        case "$bench" in *benchmark_attn.py*) where="--out-dir $dir";; *) where="--out $dir/run";; esac
        # shellcheck disable=SC2086
        (cd /tmp && PYTHONPATH=$path PYTHONSAFEPATH=1 timeout "${BENCH_TIMEOUT:-330}" python3 $scripts/$bench $where \
          > "$dir.log" 2>&1)
        echo "$v round $i exit $?"
      done
    done
    # shellcheck disable=SC2086
    python3 tools/gpu/baseline_grid.py "$OUT" ${BASELINE_TABLE:-}
    rc=$?
  fi
  result baseline $rc
fi

if has variants; then
  step variants
  for pid in "${variant_pids[@]}"; do wait "$pid" || failed="$failed variants_build"; done
  echo "variants built in $(( $(date +%s) - variants_start )) s"
  grep -hE "^built|rror|Performance Loss" "$OUT"/variants_build*.log | cut -c1-400 | head -40
  for set in "$@"; do
    echo "-- set: ${VARIANTS_COMMON:-} $(args_of "$set")" | tee -a "$OUT/variants.log"
    # shellcheck disable=SC2046
    timeout "$(timeout_of "$set")" python3 tools/gpu/variants.py ${VARIANTS_COMMON:-} $(args_of "$set") 2>&1 \
      | grep -v "^ptxas\|bytes stack\|^ *$\|resource_tracker\|warnings.warn\|^built" | tee -a "$OUT/variants.log"
    rc=${PIPESTATUS[0]}
    [ $rc -eq 0 ] || echo "(set exit $rc)"
    [ $rc -eq 0 ] || failed="$failed variants"
  done
fi

if has breakdown; then
  step breakdown
  fa3_wait
  while read -r c; do
    # shellcheck disable=SC2086
    timeout "${BREAKDOWN_TIMEOUT:-60}" python3 tools/profile/kernel_breakdown.py $c < /dev/null || failed="$failed breakdown"
  done < <(split_cases "${BREAKDOWN_CASES:---bwd --hdim 128 --seqlens 8192}") > "$OUT/breakdown.log" 2>&1
  grep -E "^hdim|in all|^ +[0-9.]+ us|rror" "$OUT/breakdown.log" | cut -c1-150
fi

if has power; then
  step power
  fa3_wait
  while read -r c; do
    # shellcheck disable=SC2086
    timeout "${POWER_TIMEOUT:-90}" python3 tools/profile/power_probe.py $c < /dev/null || failed="$failed power"
  done < <(split_cases "${POWER_CASES:---hdim 128 --seqlen 8192}") > "$OUT/power.log" 2>&1
  cat "$OUT/power.log"
fi

if has ncu; then
  step ncu
  fa3_wait
  sections=${NCU_SECTIONS---section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy}
  [ "${NCU_SOURCE:-0}" = 1 ] && sections="$sections --section SourceCounters --import-source yes"
  metrics=""; [ -n "${NCU_METRICS:-}" ] && metrics="--metrics $NCU_METRICS"
  i=0
  while read -r c; do
    i=$((i + 1))
    for prov in ${NCU_PROVIDERS:-ours}; do
      case "$prov:$c" in
        ours:*--bwd*) kern=flash_bwd_kernel;; ours:*) kern=flash_fwd_kernel;;
        fa3:*--bwd*) kern=FlashAttnBwdSm90;; fa3:*) kern=FlashAttnFwdSm90;;
        cudnn:*--bwd*) kern="dgrad|bprop|bwd";; *) kern="fprop|fmha|fwd";;
      esac
      tag=${prov}_$i
      # shellcheck disable=SC2086
      timeout "${NCU_TIMEOUT:-150}" ncu --clock-control none --kernel-name-base demangled -k "regex:${NCU_KERNEL:-$kern}" \
        -s "${NCU_SKIP:-2}" -c 1 $sections $metrics ${NCU_EXTRA:-} -o "$OUT/ncu_$tag" -f \
        python3 tools/profile/profile_case.py --provider "$prov" $c < /dev/null > "$OUT/ncu_$tag.log" 2>&1
      rc=$?
      echo "-- ncu $prov case $i ($c): exit $rc"
      [ $rc -eq 0 ] || { failed="$failed ncu"; tail -5 "$OUT/ncu_$tag.log"; continue; }
      ncu --import "$OUT/ncu_$tag.ncu-rep" --page details < /dev/null > "$OUT/ncu_$tag.txt" 2>&1
      grep -E "Duration|SM Frequency|Throughput|Pipe|Stall|Issue|Eligible|Warp Cycles|Registers Per|Achieved Occupancy|Shared|L2|DRAM|==ERR|==WARN" \
        "$OUT/ncu_$tag.txt" | sed "s/  */ /g" | head -40
      if [ -n "$metrics" ]; then
        ncu --import "$OUT/ncu_$tag.ncu-rep" --page raw --metrics "$NCU_METRICS" < /dev/null 2>&1 | grep -E "^ +[a-z0-9_]+__" | sed "s/  */ /g"
      fi
      if [ "${NCU_SOURCE:-0}" = 1 ]; then
        ncu --import "$OUT/ncu_$tag.ncu-rep" --page source --csv --print-source sass < /dev/null > "/tmp/src_$tag.csv" 2>&1
        python3 tools/profile/ncu_source_top.py "/tmp/src_$tag.csv" --top "${NCU_TOP:-30}" > "$OUT/src_$tag.txt" 2>&1
        head -40 "$OUT/src_$tag.txt"
      fi
    done
  done < <(split_cases "${NCU_CASES:---hdim 128 --seqlen 8192 --bwd}")
fi

if has sanitize; then
  step sanitize
  cs() {  # tool, seconds, log name, script arguments (script: $CS_SCRIPT, default sanitize_check.py)
    local tool=$1 secs=$2 log=$3; shift 3
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "$secs" compute-sanitizer --tool "$tool" --kernel-name kns=flash \
      --error-exitcode 9 --print-limit 10 python3 "tools/check/${CS_SCRIPT:-sanitize_check.py}" --hdims "$HDIMS" \
      --dtype "${DTYPES%%,*}" "$@" > "$OUT/sanitize_$log.log" 2>&1
    local rc=$?
    grep -E "FAIL|all ok|SOME|probe|ERROR SUMMARY|rror|nrecognized" "$OUT/sanitize_$log.log" | head -12
    echo "$log exit $rc"
    return $rc
  }
  # The planted overrun (a Triton kernel named flash_probe_...) must be reported (exit 9): else the
  # kernel filter instruments nothing and the clean reports below mean nothing.
  cs memcheck 60 probe --probe
  [ $? -eq 9 ] || { echo "the probe's overrun was not reported"; failed="$failed sanitize_probe"; }
  for tool in $(tr ',' ' ' <<< "${SANITIZE_TOOLS:-memcheck,synccheck,racecheck,varlen,paged}"); do
    case $tool in
      memcheck) cs memcheck "${MEMCHECK_SECS:-200}" memcheck || failed="$failed memcheck";;
      synccheck) cs synccheck "${SYNCCHECK_SECS:-80}" synccheck --quick || failed="$failed synccheck";;
      racecheck) cs racecheck "${RACECHECK_SECS:-120}" racecheck --quick || failed="$failed racecheck";;
      varlen) CS_SCRIPT=varlen_check.py cs memcheck "${VARLEN_MEMCHECK_SECS:-200}" varlen_memcheck \
                || failed="$failed varlen_memcheck";;  # malformed cu_seqlens / seqused
      paged) CS_SCRIPT=paged_check.py cs memcheck "${PAGED_MEMCHECK_SECS:-200}" paged_memcheck \
               || failed="$failed paged_memcheck";;  # malformed page tables
      *) echo "unknown sanitizer tool $tool"; failed="$failed sanitize";;
    esac
  done
fi

if has readme; then
  step readme
  # The numbered `pip install ...` lines of the README's first bash block under "On a fresh Hopper machine".
  mapfile -t readme_cmds < <(awk '/^## On a fresh Hopper machine/ {s = 1} s && /^```bash/ {b = 1; next}
                                  b && /^```/ {exit} b && /^pip install/' README.md)
  rc=0
  # The README's `pip` and `pytest` are those of the machine's python3, as in an activated venv (the
  # machine's venv has no pip script: /usr/local/bin/pip is the system Python's, so one is made).
  pybin=/tmp/readme-bin; mkdir -p $pybin
  printf '#!/bin/sh\nexec %s -m pip "$@"\n' "$(command -v python3)" > $pybin/pip; chmod +x $pybin/pip
  timer=""; [ -x /usr/bin/time ] && timer="/usr/bin/time -v"  # peak memory too where it exists
  readme_list=${README_CMDS:-1,2}
  for i in ${readme_list//,/ }; do
    c=${readme_cmds[$((i - 1))]:-}
    if [ -z "$c" ]; then echo "README command $i: not found"; rc=1; continue; fi
    echo "README command $i: $c"
    # As a user's shell would run it: none of this runner's build knobs (HDIMS, MAX_JOBS, ...) and no
    # PYTHONPATH (the source tree or /tmp/site would stand in for what the command installs).
    t0=$(date +%s)
    (cd "$REPO" && for v in $(compgen -e | grep -E '^(FLASH_ATTN_HOPPER_|MAX_JOBS$|PYTHONPATH$)'); do unset "$v"; done
     PATH=$pybin:$PATH PIP_NO_INDEX=1 PIP_FIND_LINKS="$REPO/.whl $REPO/.whl/readme" timeout "${README_TIMEOUT:-560}" \
      $timer bash -c "$c") > "$OUT/readme_$i.log" 2>&1
    r=$?; [ $r -eq 0 ] || rc=$r
    echo "README command $i: $(( $(date +%s) - t0 )) s wall" | tee -a "$OUT/readme_$i.log"
    grep -E "Elapsed \(wall|Maximum resident|passed|failed|Self-check|compiled [0-9]+ file|largest nvcc" "$OUT/readme_$i.log" | tail -8
    echo "README command $i exit $r"
  done
  result readme $rc
fi

if has cmd; then
  step cmd
  timeout "${CMD_TIMEOUT:-300}" bash -c "${CMD:?the cmd step needs CMD}" > "$OUT/cmd.log" 2>&1
  rc=$?; grep -v "^ptxas\|^ *[0-9]* bytes\|^ *$" "$OUT/cmd.log" | tail -60
  result cmd $rc
fi

echo
failed=$(tr ' ' '\n' <<< "$failed" | awk 'NF && !seen[$0]++' | xargs)
if [ -n "$failed" ]; then echo "run.sh: FAILED: $failed"; exit 1; fi
echo "run.sh: all steps ok ($STEPS)"
