#!/usr/bin/env bash
# Prompt processing (pp512) and generation (tg128) tokens/s of kvchat and of
# llama.cpp's llama-bench, on the same GGUF files and thread count, run one after
# the other in one go, with the ratio kvchat / llama.cpp.
#
#   bench/compare_llama_bench.sh LLAMA_BENCH MODEL.gguf [MODEL.gguf ...]
#
# LLAMA_BENCH is a llama-bench binary you built yourself beside the project
# (nothing of llama.cpp is part of kvchat). Environment: THREADS (default 2),
# REPS (default 3), KVCHAT (default build/kvchat).
set -euo pipefail
llama_bench=${1:?usage: $0 LLAMA_BENCH MODEL.gguf...}
shift
threads=${THREADS:-2}
reps=${REPS:-3}
kvchat=${KVCHAT:-$(dirname "$0")/../build/kvchat}

# the t/s mean of the row whose test column is $2, from a markdown table in $1
tps() { awk -F'|' -v t="$2" '{ gsub(/ /, "", $(NF-2)); if ($(NF-2) == t) { split($(NF-1), a, "±"); gsub(/ /, "", a[1]); print a[1]; exit } }' <<<"$1"; }

printf '| model | test | kvchat t/s | llama.cpp t/s | kvchat / llama.cpp |\n|---|---|---:|---:|---:|\n'
for model in "$@"; do
  ours=$("$kvchat" bench -m "$model" -t "$threads" -r "$reps" -p 512 -n 128)
  theirs=$("$llama_bench" -m "$model" -t "$threads" -r "$reps" -p 512 -n 128 2>/dev/null)
  for test in pp512 tg128; do
    a=$(tps "$ours" "$test"); b=$(tps "$theirs" "$test")
    ratio=$(awk -v a="$a" -v b="$b" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "n/a" }')
    printf '| %s | %s | %s | %s | %s |\n' "$(basename "$model")" "$test" "$a" "$b" "$ratio"
  done
done
