//go:build !unix

package launcher

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
)

// Ranks are started in process groups, which only Unix has.

func detach(*exec.Cmd) {}

func setCredential(*exec.Cmd, *Credential) error {
	return errors.New("running a rank as another user needs a Unix system")
}

func signalGroup(int, syscall.Signal) error {
	return errors.New("launching ranks needs a Unix system")
}

func signalOwnGroup(syscall.Signal) bool { return false }

func killOwnGroup() {}

func alive(int, uint64) bool { return false }

func procStart(int) (uint64, error) { return 0, nil }

func exitOf(state *os.ProcessState) (int, string) { return state.ExitCode(), "" }

var (
	sigTerm = syscall.SIGTERM
	sigKill = syscall.SIGKILL
)

// checkOwnDir: ownership is not checked where there are no Unix owners.
func checkOwnDir(string) error { return nil }
