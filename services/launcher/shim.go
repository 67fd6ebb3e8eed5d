package launcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

// The rank shim stands between the agent and a rank: the agent starts
// `toposched agent rank-exec [--alive FILE --silence D --grace D] EXITFILE
// -- COMMAND ARGS...` (Config.Shim), which runs the rank as its own child,
// waits for it and writes how it ended to EXITFILE. The shim survives its
// agent like the rank does, so a restarted agent that adopts a rank (not
// its child, so not one it can wait for) still learns its exit code from
// the file.
//
// The shim also watches its agent: the agent sets the mtime of its alive
// file (Config.AliveFile) to the start of each heartbeat NATS took, and a
// shim that sees it older than the silence stops its rank (SIGTERM, then
// SIGKILL after the grace) and whatever the rank left in its process
// group. The agent picks the silence so that the ranks are gone before the
// watchdog frees their GPUs (Config.Silence); a restarted agent that
// heartbeats again within it adopts them as before.

// ShimConfig is what the shim is told besides the rank's argv.
type ShimConfig struct {
	// ExitFile is where the shim writes how the rank ended.
	ExitFile string
	// AliveFile is the agent's alive file; "" does not watch the agent.
	AliveFile string
	// Silence is how old the alive file may grow before the rank is
	// stopped; Grace how long it has between SIGTERM and SIGKILL then.
	Silence time.Duration
	Grace   time.Duration
}

// shimPoll is how often the shim looks at the alive file: at most this,
// and a tenth of the silence.
const shimPoll = 100 * time.Millisecond

// shimExit is what the shim writes.
type shimExit struct {
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal,omitempty"`
	// AgentSilent is set when the shim stopped the rank because the
	// agent's alive file had not moved for the silence.
	AgentSilent bool `json:"agent_silent,omitempty"`
}

// RunShim is the shim's main: it runs argv, writes its end to the exit
// file and returns the status to exit with (the rank's, or 128+signal).
// When it stopped the rank for the agent's silence it kills what is left
// of its process group, itself included, once the file is written.
func RunShim(cfg ShimConfig, argv []string) int {
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
		writeShimExit(cfg.ExitFile, shimExit{ExitCode: 127})
		return 127
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	started := time.Now()
	var poll <-chan time.Time
	if cfg.AliveFile != "" && cfg.Silence > 0 {
		tick := time.NewTicker(min(shimPoll, cfg.Silence/10))
		defer tick.Stop()
		poll = tick.C
	}
	var err error
	silent := false
wait:
	for {
		select {
		case err = <-waited:
			break wait
		case <-poll:
			quiet := time.Since(lastAlive(cfg.AliveFile, started))
			if quiet <= cfg.Silence {
				continue
			}
			fmt.Fprintf(os.Stderr, "rank-exec: no heartbeat from the agent for %s (limit %s): stopping the rank before its GPUs are given away\n",
				quiet.Round(time.Millisecond), cfg.Silence)
			silent = true
			err = stopChild(cmd, waited, cfg.Grace)
			break wait
		}
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		fmt.Fprintf(os.Stderr, "rank-exec: %v\n", err)
	}
	code, sig := exitOf(cmd.ProcessState)
	writeShimExit(cfg.ExitFile, shimExit{ExitCode: code, Signal: sig, AgentSilent: silent})
	if silent {
		// Whatever the rank started and left behind goes too.
		killOwnGroup()
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return code
}

// lastAlive is the agent's last sign of life: the alive file's mtime, or
// the shim's start where there is no file yet.
func lastAlive(path string, started time.Time) time.Time {
	fi, err := os.Stat(path)
	if err != nil {
		return started
	}
	return fi.ModTime()
}

// stopChild sends the rank SIGTERM (its whole group where the shim leads
// one), SIGKILL after grace, and returns its Wait's error.
func stopChild(cmd *exec.Cmd, waited <-chan error, grace time.Duration) error {
	if !signalOwnGroup(sigTerm) {
		_ = cmd.Process.Signal(sigTerm)
	}
	select {
	case err := <-waited:
		return err
	case <-time.After(grace):
	}
	_ = cmd.Process.Kill()
	return <-waited
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
