#!/usr/bin/env bash
# Side by side: toposched built from BASE and from NEW (default: the work
# tree), alternating, in one sitting on one machine, so that the two are
# compared under the same load. Usage: bench/compare-commits.sh BASE [NEW]
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: bench/compare-commits.sh BASE [NEW]}
new=${2:-}
tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/base" >/dev/null 2>&1 || true; [ -n "$new" ] && git worktree remove --force "$tmp/new" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
git worktree add -q "$tmp/base" "$base"
(cd "$tmp/base" && go build -o "$tmp/toposched-base" ./cmd/toposched)
if [ -n "$new" ]; then
  git worktree add -q "$tmp/new" "$new"
  (cd "$tmp/new" && go build -o "$tmp/toposched-new" ./cmd/toposched)
else
  go build -o "$tmp/toposched-new" ./cmd/toposched
fi
for round in 1 2; do
  for which in base new; do
    bin="$tmp/toposched-$which"
    echo "=== round $round $which: load --e2e 2000 --e2e-only"
    "$bin" load --e2e 2000 --e2e-only 2>&1 | grep -v '^time=' | tail -4
    echo "=== round $round $which: load --clusters 10k --jobs 8,64 --budget 2s"
    "$bin" load --clusters 10k --jobs 8,64 --budget 2s 2>&1 | grep -v '^time=' | tail -6
  done
done
