# Runtime optimizer: tuning per decision and telemetry ingest
# (BENCHMARKS.md "Runtime optimizer").
set -euo pipefail
go test -run '^$' -bench 'Tuning|TelemetryIngest' -benchtime 1s -benchmem ./services/optimizer
