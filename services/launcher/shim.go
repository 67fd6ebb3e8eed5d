package launcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

// The rank shim stands between the agent and a rank: the agent starts
// `toposched agent rank-exec EXITFILE -- COMMAND ARGS...` (Config.Shim),
// which runs the rank as its own child, waits for it and writes how it
// ended to EXITFILE. The shim survives its agent like the rank does, so a
// restarted agent that adopts a rank (not its child, so not one it can
// wait for) still learns its exit code from the file.

// shimExit is what the shim writes.
type shimExit struct {
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal,omitempty"`
}

// RunShim is the shim's main: it runs argv, writes its end to exitFile and
// returns the status to exit with (the rank's, or 128+signal).
func RunShim(exitFile string, argv []string) int {
	if len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "rank-exec: no command")
		return 2
	}
	// The agent signals the whole process group, which reaches the rank
	// directly; the shim must outlive it to write the file. Caught, not
	// ignored: an ignored signal would stay ignored in the rank.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "rank-exec: %v\n", err)
		writeShimExit(exitFile, shimExit{ExitCode: 127})
		return 127
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		fmt.Fprintf(os.Stderr, "rank-exec: %v\n", err)
	}
	code, sig := exitOf(cmd.ProcessState)
	writeShimExit(exitFile, shimExit{ExitCode: code, Signal: sig})
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return code
}

func writeShimExit(path string, e shimExit) {
	b, _ := json.Marshal(e)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "rank-exec: exit file: %v\n", err)
		return
	}
	if err := os.Rename(tmp, path); err != nil {
		fmt.Fprintf(os.Stderr, "rank-exec: exit file: %v\n", err)
	}
}

// readShimExit reads how a rank ended, from its shim's file.
func readShimExit(path string) (shimExit, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return shimExit{}, false
	}
	var e shimExit
	if json.Unmarshal(b, &e) != nil {
		return shimExit{}, false
	}
	return e, true
}
