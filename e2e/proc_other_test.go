//go:build !linux

package e2e

import "os/exec"

// dieWithParent has no portable equivalent outside Linux; t.Cleanup still
// kills every process when the test ends normally.
func dieWithParent(*exec.Cmd) {}
