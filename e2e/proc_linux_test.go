package e2e

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel kill cmd if the test binary dies first
// (a -timeout panic, a kill), so that no server outlives the run.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
