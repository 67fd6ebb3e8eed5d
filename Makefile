# make test   runs the test suite: the README's `go test ./...`, and the NVML
#             discovery's tests (built with -tags nvml).
# make lint   runs golangci-lint (layering and correctness), as CI does.
# make bench  reruns every benchmark of BENCHMARKS.md: bench/run.sh runs
#             each bench/commands.d/*.sh in name order and logs to
#             bench/out/ (add a file there for your own benchmarks).
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: test test-short bench lint
# test also runs the NVML discovery's tests, which go test ./... leaves out:
# it is built only with the tag nvml (services/discovery/nvml's doc).
test:
	go test ./...
	go test -tags nvml ./services/discovery/nvml/
	go test -tags nvml -run '^TestAgent' ./cmd/toposched/

test-short:
	go test -short ./...
	go test -short -tags nvml ./services/discovery/nvml/

bench:
	./bench/run.sh

# lint builds golangci-lint from tools/go.mod (pinned there as a tool) and
# runs the layering rules and linters of .golangci.yml, as .ci/run does.
lint:
	cd tools && go build -o ../bin/golangci-lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint
	bin/golangci-lint run ./...
