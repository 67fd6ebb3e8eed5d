# Cost model error against measurements, cost evaluation, store, paths and
# policy evaluation (BENCHMARKS.md sections of the same names).
set -euo pipefail
"$TOPOSCHED" model validate
go test -run '^$' -bench 'AllocateRelease|UpsertNode' -benchmem ./services/internal/store/
go test -run '^$' -bench 'Load' -benchtime 1x ./services/internal/store/
go test -run '^$' -bench 'NewFabric|GPUPath' -benchmem ./services/internal/topology/
go test -run '^$' -bench Analyze -benchmem ./services/analysis
go test -run '^$' -bench Evaluate -benchmem ./services/collective
go test -run '^$' -bench 'Eval' -benchmem ./policies
