#!/usr/bin/env bash
# Fuzz one libFuzzer target for SECONDS on its committed seeds and say what
# happened in one line; the CTest test run_<target> (CMakeLists.txt,
# -DKVC_FUZZ=ON) runs this. Exit 0 when the run found nothing; 1 on a finding
# (a crash, sanitizer report, leak, an input slower than the per-input timeout,
# or memory over the limit), with the report and the input saved under OUT.
#
#   scripts/fuzz_one.sh TARGET_BINARY FUZZ_DIR SECONDS OUT
#
# Seeds: FUZZ_DIR/corpus/<target>/ (read only; a target without seeds starts
# from nothing); dictionary: FUZZ_DIR/<target>.dict when present. What the run
# adds to the corpus, the full libFuzzer log and any crashing input go to
# OUT/<target>/. KVC_FUZZ_INPUT_TIMEOUT: seconds one input may take (30).
set -uo pipefail
bin=${1:?usage: $0 TARGET_BINARY FUZZ_DIR SECONDS OUT}
fuzz_dir=${2:?} secs=${3:?} out=${4:?}
name=$(basename "$bin")
seeds=$fuzz_dir/corpus/$name
dir=$out/$name
rm -rf "$dir"
mkdir -p "$dir/corpus" "$dir/artifacts"
log=$dir/log.txt

args=(-max_total_time="$secs" -timeout="${KVC_FUZZ_INPUT_TIMEOUT:-30}" -rss_limit_mb=2048
      -print_final_stats=1 -artifact_prefix="$dir/artifacts/")
[ -f "$fuzz_dir/$name.dict" ] && args+=(-dict="$fuzz_dir/$name.dict")
dirs=("$dir/corpus")          # new inputs go to the first one; the seeds stay as committed
n_seeds=0
if [ -d "$seeds" ]; then
  n_seeds=$(find "$seeds" -type f | wc -l)
  dirs+=("$seeds")
fi
start=$SECONDS
"$bin" "${args[@]}" "${dirs[@]}" >"$log" 2>&1
rc=$?
took=$((SECONDS - start))

execs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -1)
[ -n "$execs" ] || execs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log" | tail -1)
[ -n "$execs" ] || execs=$(sed -n 's/^#\([0-9]*\).*/\1/p' "$log" | tail -1)
cov_seeds=$(sed -n 's/.*INITED cov: \([0-9]*\).*/\1/p' "$log" | tail -1)
rss=$(sed -n 's/^stat::peak_rss_mb: *\([0-9]*\).*/\1/p' "$log" | tail -1)
cov=$(sed -n 's/^#[0-9]*.* cov: \([0-9]*\).*/\1/p' "$log" | tail -1)
corp=$(sed -n 's/^#[0-9]*.* corp: \([0-9]*\).*/\1/p' "$log" | tail -1)
found=$(find "$dir/artifacts" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
        -o -name 'oom-*' \) | sort)
n_found=$(printf '%s' "$found" | grep -c . || true)
[ "$rc" -ne 0 ] && [ "$n_found" -eq 0 ] && n_found=1    # died without saving an input

printf '%s: %s execs in %d s (%s/s), %d finding(s); coverage %s edges (%s after the %d seeds), corpus %s inputs, peak RSS %s MB\n' \
  "$name" "${execs:-?}" "$took" "$(( ${execs:-0} / (took > 0 ? took : 1) ))" "$n_found" \
  "${cov:-?}" "${cov_seeds:-?}" "$n_seeds" "${corp:-?}" "${rss:-?}"
if [ "$rc" -ne 0 ] || [ "$n_found" -gt 0 ]; then
  echo "$name: FINDING (libFuzzer exit $rc); full log $log"
  for f in $found; do echo "$name: input saved as $f (rerun: $bin $f)"; done
  # the report: from the sanitizer's or libFuzzer's first error line on,
  # without ASan's shadow memory dump
  awk '/==[0-9]+==ERROR|^==[0-9]+== ERROR|deadly signal|ALARM|out-of-memory|KVC_ASSERT|runtime error/ {p=1}
       /^Shadow bytes around/ {skip=1} /==ABORTING/ {skip=0} p && !skip' "$log" | head -60
  exit 1
fi
exit 0
