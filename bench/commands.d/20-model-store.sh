# Cost model error against measurements, cost evaluation, store, paths and
# policy evaluation (BENCHMARKS.md sections of the same names).
set -euo pipefail
S=../shared/testdata/nccl-tests
if [ -d "$S" ]; then "$TOPOSCHED" model validate "$S"; else "$TOPOSCHED" model validate; fi
go test -run '^$' -bench 'AllocateRelease|UpsertNode' -benchmem ./internal/store/
go test -run '^$' -bench 'Load' -benchtime 1x ./internal/store/
go test -run '^$' -bench 'NewFabric|GPUPath' -benchmem ./internal/topology/
go test -run '^$' -bench Analyze -benchmem ./internal/pattern
go test -run '^$' -bench Evaluate -benchmem ./internal/collective
go test -run '^$' -bench 'Eval' -benchmem ./policies
