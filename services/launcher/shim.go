package launcher

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The rank shim stands between the agent and a rank: the agent starts
// `toposched agent rank-exec [--alive FILE --silence D --grace D]
// [--gate-fd N] [--uid U --gid G --groups G,...] EXITFILE -- COMMAND
// ARGS...` (Config.Shim, then ShimConfig.Args), which runs the rank as its
// own child, waits for it and writes how it ended to EXITFILE. The shim
// survives its agent like the rank does, so a restarted agent that adopts
// a rank (not its child, so not one it can wait for) still learns its
// exit code from the file.
//
// The shim starts the rank only once the agent has recorded it: it waits
// for a byte on the gate descriptor, which the agent writes after the
// job's state file. An agent killed in between closes the pipe, and the
// shim ends without starting the rank, so a restarted agent, which finds
// no state, may start the job without running it twice.
//
// The shim keeps the agent's identity, to write the exit file into the
// agent's state directory; the rank runs as the job's user where it is
// given (--uid, --gid, --groups), entering its working directory as that
// user.
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
	// GateFD, above 0, is the descriptor (inherited from the agent) the
	// shim reads one byte from before it starts the rank.
	GateFD int
	// User is who the rank runs as; nil: the shim's own user.
	User *Credential
}

// Credential is a user a rank runs as.
type Credential struct {
	UID, GID uint32
	// Groups are the supplementary groups.
	Groups []uint32
}

// Args is the shim's command line after the command that runs it
// (Config.Shim): cfg as flags, the exit file, "--" and the rank's argv.
func (c ShimConfig) Args(argv []string) []string {
	var out []string
	if c.AliveFile != "" {
		out = append(out, "--alive", c.AliveFile, "--silence", c.Silence.String(), "--grace", c.Grace.String())
	}
	if c.GateFD > 0 {
		out = append(out, "--gate-fd", strconv.Itoa(c.GateFD))
	}
	if u := c.User; u != nil {
		groups := make([]string, len(u.Groups))
		for i, g := range u.Groups {
			groups[i] = strconv.FormatUint(uint64(g), 10)
		}
		out = append(out, "--uid", strconv.FormatUint(uint64(u.UID), 10), "--gid", strconv.FormatUint(uint64(u.GID), 10),
			"--groups="+strings.Join(groups, ","))
	}
	return append(append(out, c.ExitFile, "--"), argv...)
}

// ParseShimArgs reads what Args wrote: the shim's config and the rank's
// argv.
func ParseShimArgs(args []string) (ShimConfig, []string, error) {
	var c ShimConfig
	fs := flag.NewFlagSet("rank-exec", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.AliveFile, "alive", "", "the agent's alive file")
	fs.DurationVar(&c.Silence, "silence", 0, "how old the alive file may grow")
	fs.DurationVar(&c.Grace, "grace", DefaultGrace, "how long the rank has between SIGTERM and SIGKILL")
	fs.IntVar(&c.GateFD, "gate-fd", 0, "descriptor to read one byte from before starting the rank")
	uid := fs.Int64("uid", -1, "user id the rank runs as")
	gid := fs.Int64("gid", -1, "group id the rank runs as")
	groups := fs.String("groups", "", "supplementary groups of the rank, comma-separated")
	if err := fs.Parse(args); err != nil {
		return c, nil, err
	}
	rest := fs.Args()
	if len(rest) < 3 || rest[1] != "--" || rest[0] == "" {
		return c, nil, errors.New("expected EXITFILE -- COMMAND ARGS")
	}
	c.ExitFile = rest[0]
	switch {
	case *uid < 0 && *gid < 0 && *groups == "":
	case *uid < 0 || *gid < 0 || *uid > math.MaxUint32 || *gid > math.MaxUint32:
		return c, nil, errors.New("--uid and --gid: both, or neither, each a user or group id")
	default:
		c.User = &Credential{UID: uint32(*uid), GID: uint32(*gid), Groups: []uint32{}}
		for g := range strings.SplitSeq(*groups, ",") {
			if g == "" {
				continue
			}
			n, err := strconv.ParseUint(g, 10, 32)
			if err != nil {
				return c, nil, fmt.Errorf("--groups: %q: not a group id", g)
			}
			c.User.Groups = append(c.User.Groups, uint32(n))
		}
	}
	return c, rest[2:], nil
}

// ShimMain is the shim's command (toposched agent rank-exec): it reads
// its command line and runs RunShim.
func ShimMain(args []string) int {
	cfg, argv, err := ParseShimArgs(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rank-exec: %v\n", err)
		return 2
	}
	return RunShim(cfg, argv)
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
	if cfg.GateFD > 0 && !passGate(cfg.GateFD) {
		fmt.Fprintln(os.Stderr, "rank-exec: the agent ended before it recorded the rank: not started")
		return 125
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err := asUser(cmd, cfg.User)
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
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

// passGate reads one byte from fd, the agent's word that the rank is
// recorded, and closes it (the rank must not inherit it). EOF: the agent
// ended first.
func passGate(fd int) bool {
	f := os.NewFile(uintptr(fd), "gate")
	if f == nil {
		return false
	}
	defer func() { _ = f.Close() }() // read from only
	var b [1]byte
	n, _ := io.ReadFull(f, b[:])
	return n == 1
}

// asUser makes cmd run as u (nil: as this process), entering its
// directory (cmd.Dir, else this process's working directory) by its path
// as u: a directory u could not reach is no way in for the rank.
func asUser(cmd *exec.Cmd, u *Credential) error {
	if u == nil {
		return nil
	}
	if cmd.Dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		cmd.Dir = wd
	}
	return setCredential(cmd, u)
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
