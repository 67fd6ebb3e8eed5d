# Placement: quality against the optimum and blind, decision latency through
# the planner, end to end through NATS (BENCHMARKS.md "Issue 5", "Placement
# quality"). Go benchmarks print their figures with the test binary.
set -euo pipefail
S=../shared/testdata
if [ -d "$S" ]; then "$TOPOSCHED" quality --topologies "$S/topologies" --fabrics "$S/fabric"; else "$TOPOSCHED" quality; fi
"$TOPOSCHED" load --budget 2s --strategy topology-aware,blind
"$TOPOSCHED" load --e2e 2000 --e2e-only
go test -run '^$' -bench EndToEnd -benchtime 2000x ./services/operator
go test -run '^$' -bench '^BenchmarkPlace$' -benchtime 20x -benchmem ./internal/placer/aware
go test -run '^$' -bench 'Place' -benchmem ./internal/placer/blind
