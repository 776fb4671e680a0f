#!/bin/bash
# Variants only, no package build (tools/variants.py builds its own extensions): build every set
# side by side, then check and time the sets one after another, each under its own timeout, so
# that a variant that hangs costs only its set. Experiment plans on branches call it.
#   bash tools/device_variants_only.sh "<set>" ["<set>" ...]          (carry .whl)
# A set is a whole variants.py argument list, e.g. "--hdim 128 --rounds 3 --variant a --variant
# b:KEY=1"; a set may start with "@SECONDS " for its timeout (default $SET_TIMEOUT, else 110).
# Timings go to $OUT/v.log as they come.
export OUT=${OUT:-/tmp/flash_attn_hopper_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PYTHONPATH || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
args_of() { case "$1" in @*) echo "${1#* }";; *) echo "$1";; esac; }
timeout_of() { case "$1" in @*) local t="${1%% *}"; echo "${t#@}";; *) echo "${SET_TIMEOUT:-110}";; esac; }
# Sets build side by side in /tmp/flash_variants/<name>: a name in two sets would rebuild and
# load the other set's library (it cost a whole call once).
dup=$(for set in "$@"; do args_of "$set"; echo; done | grep -o -- "--variant [^: ]*" | awk '{print $2}' | sort | uniq -d)
if [ -n "$dup" ]; then echo "variant names repeat across sets: $dup"; exit 1; fi
start=$(date +%s)
i=0
for set in "$@"; do
  i=$((i + 1))
  python3 tools/variants.py $(args_of "$set") --build-only > "$OUT/build$i.log" 2>&1 &
done
wait
echo "built in $(( $(date +%s) - start )) s"
grep -hE "^built|rror|Performance Loss" "$OUT"/build*.log | cut -c1-400 | head -40
rm -f "$OUT"/build*.log
for set in "$@"; do
  timeout "$(timeout_of "$set")" python3 tools/variants.py $(args_of "$set") 2>&1 \
    | grep -v "^ptxas\|bytes stack\|^ *$\|resource_tracker\|warnings.warn\|^built" | tee -a "$OUT/v.log"
done
