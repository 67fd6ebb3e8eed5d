// Package docs is the reference behind the README: one Markdown page per
// part of toposched. It holds no code; its test checks that every relative
// link and anchor in README.md, BENCHMARKS.md, these pages and the READMEs
// beside the code resolves, so a moved or renamed section breaks
// `go test ./...` rather than a reader's click.
package docs
