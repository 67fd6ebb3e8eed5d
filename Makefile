# make test   runs the test suite (the README's command is `go test ./...`).
# make bench  reruns every benchmark of BENCHMARKS.md: bench/run.sh runs
#             each bench/commands.d/*.sh in name order and logs to
#             bench/out/ (add a file there for your own benchmarks).
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: test test-short bench
test:
	go test ./...

test-short:
	go test -short ./...

bench:
	./bench/run.sh
