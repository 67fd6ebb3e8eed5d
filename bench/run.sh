#!/usr/bin/env bash
# Runs every benchmark command file of bench/commands.d in name order and
# keeps each one's output in bench/out/NAME.log. A command file is a bash
# script run from the repository root with TOPOSCHED (a built toposched
# binary), SHARED (../shared/testdata, may be missing) and OUT (its own
# output directory) set. BENCH_ONLY=glob runs only matching files.
# The whole set is meant to finish within 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
mkdir -p bench/out
export TOPOSCHED="$PWD/bench/out/toposched"
go build -o "$TOPOSCHED" ./cmd/toposched
export SHARED="${SHARED:-$PWD/../shared/testdata}"
start=$(date +%s)
for f in bench/commands.d/${BENCH_ONLY:-*}.sh; do
  [ -e "$f" ] || continue
  name=$(basename "$f" .sh)
  export OUT="$PWD/bench/out/$name"
  mkdir -p "$OUT"
  echo "== $name"
  t0=$(date +%s)
  bash "$f" 2>&1 | tee "bench/out/$name.log"
  echo "== $name: $(( $(date +%s) - t0 )) s"
done
echo "== all benchmarks: $(( $(date +%s) - start )) s"
