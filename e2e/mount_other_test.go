//go:build !linux

package e2e

import "testing"

// mountTmpfs is Linux only: elsewhere the tests that need a small or
// read-only filesystem skip.
func mountTmpfs(t *testing.T, size string, _ bool) string {
	t.Helper()
	t.Skipf("mounting a %s tmpfs is Linux only", size)
	return ""
}

// resizeTmpfs is Linux only, as mountTmpfs is.
func resizeTmpfs(t *testing.T, _, size string) {
	t.Helper()
	t.Skipf("resizing a tmpfs to %s is Linux only", size)
}
