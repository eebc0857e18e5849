#!/usr/bin/env bash
# The AVX2 kernels of revision REV against the working tree's, in one process
# that alternates them call by call (bench/ab_kernels.c says why): the matmul
# kernels for a weight type, or the integer attention kernel.
#
#   bench/ab_kernels.sh REV TYPE N_IN N_OUT N_TOK [PAIRS] [COPIES]
#   bench/ab_kernels.sh REV attention DEPTH TILE_TOK [PAIRS] [COPIES]
#   e.g. bench/ab_kernels.sh HEAD q8_0 896 4864 512
#        bench/ab_kernels.sh HEAD attention 3089 35 21 40
#
# Compiles src/kernels/kernels_avx2.c and kernels_avx2_int8.c (or
# attention_avx2_i16.c) of both sides with the flags CMake gives them, renames
# each side's entry points (old_*, new_*) and makes every other symbol of
# those objects local, then links them with build/libkvchat.a (run
# scripts/build.sh first) for everything else.
set -euo pipefail
rev=${1:?usage: $0 REV TYPE N_IN N_OUT N_TOK [PAIRS] [COPIES]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
lib=$root/build/libkvchat.a
[ -f "$lib" ] || { echo "ab_kernels: $lib is missing: run scripts/build.sh first" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/old"
git -C "$root" archive "$rev" src/kernels | tar -x -C "$work/old"

flags=(-std=c11 -O2 -D_GNU_SOURCE -ffp-contract=off -mavx2 -mfma -mf16c -I"$root/include" -I"$root/src")
if [ "${1:-}" = attention ]; then
  shift
  for s in old new; do
    if [ $s = old ]; then dir=$work/old/src/kernels; else dir=$root/src/kernels; fi
    gcc "${flags[@]}" -I"$dir" -c "$dir/attention_avx2_i16.c" -o "$work/${s}_attn.o"
    # revisions before the scratch accessors became inline call them
    objcopy --redefine-sym kvc_attn_i16_avx2=${s}_attn_ops --redefine-sym kvc_attn_i16_q=ab_attn_i16_q \
            --redefine-sym kvc_attn_i16_cq=ab_attn_i16_cq --redefine-sym kvc_attn_i16_slot=ab_attn_i16_slot \
            "$work/${s}_attn.o"
    objcopy --keep-global-symbol=${s}_attn_ops "$work/${s}_attn.o"
  done
  gcc "${flags[@]}" -I"$root/src/kernels" "$root/bench/ab_attention.c" "$work"/{old,new}_attn.o "$lib" \
      -lm -lpthread -o "$work/ab_attention"
  "$work/ab_attention" "$@"
  exit
fi
for s in old new; do
  if [ $s = old ]; then dir=$work/old/src/kernels; else dir=$root/src/kernels; fi
  gcc "${flags[@]}" -I"$dir" -c "$dir/kernels_avx2.c" -o "$work/${s}_float.o"
  objcopy --redefine-sym kvc_kernels_avx2=${s}_float_ops "$work/${s}_float.o"
  objcopy --keep-global-symbol=${s}_float_ops "$work/${s}_float.o"
  gcc "${flags[@]}" -I"$dir" -c "$dir/kernels_avx2_int8.c" -o "$work/${s}_i8.o"
  objcopy --redefine-sym kvc_avx2_i8_quantize_rows=${s}_i8_quantize \
          --redefine-sym kvc_avx2_i8_matmul_act=${s}_i8_act \
          --redefine-sym kvc_avx2_i8_scratch_floats=${s}_i8_scratch "$work/${s}_i8.o"
  objcopy --keep-global-symbol=${s}_i8_quantize --keep-global-symbol=${s}_i8_act \
          --keep-global-symbol=${s}_i8_scratch "$work/${s}_i8.o"
done
gcc "${flags[@]}" -I"$root/src/kernels" "$root/bench/ab_kernels.c" "$work"/{old,new}_{float,i8}.o "$lib" \
    -lm -lpthread -o "$work/ab_kernels"
"$work/ab_kernels" "$@"
