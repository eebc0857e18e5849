#!/usr/bin/env bash
# Prompt processing (ppP) and generation (tgN) tokens/s of kvchat and of
# llama.cpp's llama-bench, on the same GGUF files and thread count, run one after
# the other in one go, with the ratio kvchat / llama.cpp.
#
#   bench/compare_llama_bench.sh [-p N] [-n N] [-d N] LLAMA_BENCH MODEL.gguf [MODEL.gguf ...]
#
# -p, -n, -d are passed to both benches (defaults 512, 128, 0); with -d the
# tests run after N cached tokens and the rows read "pp192 @ d4096".
# LLAMA_BENCH is a llama-bench binary you built yourself beside the project
# (nothing of llama.cpp is part of kvchat). Environment: THREADS (default 2),
# REPS (default 3), ROUNDS (default 1: how many times the pair runs, alternating,
# each round printed, then the median of the rounds' ratios), NICE (default 0),
# KVCHAT (default build/kvchat).
set -euo pipefail
n_prompt=512 n_gen=128 depth=0
while getopts p:n:d: opt; do
  case $opt in
    p) n_prompt=$OPTARG ;;
    n) n_gen=$OPTARG ;;
    d) depth=$OPTARG ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
llama_bench=${1:?usage: $0 [-p N] [-n N] [-d N] LLAMA_BENCH MODEL.gguf...}
shift
threads=${THREADS:-2}
reps=${REPS:-3}
rounds=${ROUNDS:-1}
kvchat=${KVCHAT:-$(dirname "$0")/../build/kvchat}
run() { nice -n "${NICE:-0}" "$@"; }

# the t/s mean of the row whose test column, spaces removed, is $2, from a markdown table in $1
tps() { awk -F'|' -v t="$2" '{ gsub(/ /, "", $(NF-2)); if ($(NF-2) == t) { split($(NF-1), a, "±"); gsub(/ /, "", a[1]); print a[1]; exit } }' <<<"$1"; }

suffix=""
[ "$depth" -gt 0 ] && suffix=" @ d$depth"
tests=()
[ "$n_prompt" -gt 0 ] && tests+=("pp$n_prompt$suffix")
[ "$n_gen" -gt 0 ] && tests+=("tg$n_gen$suffix")
printf '| model | round | test | kvchat t/s | llama.cpp t/s | kvchat / llama.cpp |\n|---|---:|---|---:|---:|---:|\n'
# the median of the numbers in "$@"
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "n/a"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for model in "$@"; do
  declare -A ratios=()
  for round in $(seq "$rounds"); do
    ours=$(run "$kvchat" bench -m "$model" -t "$threads" -r "$reps" -p "$n_prompt" -n "$n_gen" -d "$depth")
    theirs=$(run "$llama_bench" -m "$model" -t "$threads" -r "$reps" -p "$n_prompt" -n "$n_gen" \
             -d "$depth" 2>/dev/null)
    for test in "${tests[@]}"; do
      a=$(tps "$ours" "${test// /}"); b=$(tps "$theirs" "${test// /}")
      ratio=$(awk -v a="$a" -v b="$b" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "n/a" }')
      printf '| %s | %s | %s | %s | %s | %s |\n' "$(basename "$model")" "$round" "$test" "$a" "$b" "$ratio"
      [ "$ratio" != n/a ] && ratios[$test]+="${ratio%x} "
    done
  done
  if [ "$rounds" -gt 1 ]; then   # the machine may be shared: the median of the rounds' ratios
    for test in "${tests[@]}"; do
      # shellcheck disable=SC2086
      printf '| %s | median | %s | | | %sx |\n' "$(basename "$model")" "$test" "$(median ${ratios[$test]:-})"
    done
  fi
  unset ratios
done
