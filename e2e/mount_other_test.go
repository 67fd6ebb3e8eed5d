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
