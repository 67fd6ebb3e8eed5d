package launcher

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// envShim makes the test binary the rank shim, with the ShimConfig (JSON)
// it holds and the rank's argv as arguments: the shim kills its own
// process group, which must not be the test's.
const envShim = "TOPOSCHED_TEST_RANK_SHIM"

// envAgentShim makes the test binary the shim as the agent runs it, with
// the command line ShimConfig.Args writes (testShim).
const envAgentShim = "TOPOSCHED_TEST_AGENT_SHIM"

// testShim is Config.Shim for agents under test: this binary, as the shim.
func testShim() []string { return []string{"/usr/bin/env", envAgentShim + "=1", os.Args[0]} }

func TestMain(m *testing.M) {
	if os.Getenv(envAgentShim) != "" {
		os.Exit(ShimMain(os.Args[1:]))
	}
	if cfg := os.Getenv(envShim); cfg != "" {
		var c ShimConfig
		if err := json.Unmarshal([]byte(cfg), &c); err != nil {
			panic(err)
		}
		os.Exit(RunShim(c, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// startShim starts the test binary as a shim in a process group of its
// own, as the agent does.
func startShim(t *testing.T, cfg ShimConfig, argv ...string) *exec.Cmd {
	t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], argv...)
	cmd.Env = append(os.Environ(), envShim+"="+string(b))
	cmd.Stderr = os.Stderr
	detach(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = signalGroup(cmd.Process.Pid, sigKill) })
	return cmd
}

func TestRunShim(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		argv     []string
		wantCode int
		want     shimExit
	}{
		{"exit 0", []string{"sh", "-c", "exit 0"}, 0, shimExit{ExitCode: 0}},
		{"exit 3", []string{"sh", "-c", "exit 3"}, 3, shimExit{ExitCode: 3}},
		{"killed by a signal", []string{"sh", "-c", "kill -TERM $$"}, 128 + 15, shimExit{ExitCode: -1, Signal: "terminated"}},
		{"no such program", []string{"/no/such/program"}, 127, shimExit{ExitCode: 127}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			file := filepath.Join(t.TempDir(), "rank-0.exit")
			if code := RunShim(ShimConfig{ExitFile: file}, tc.argv); code != tc.wantCode {
				t.Errorf("RunShim = %d, want %d", code, tc.wantCode)
			}
			got, ok := readShimExit(file)
			if !ok || got != tc.want {
				t.Errorf("exit file %+v (%v), want %+v", got, ok, tc.want)
			}
		})
	}
}

// TestRunShimAgentSilent: a shim whose agent's alive file stands still
// stops its rank and what the rank started, and says why in its file; one
// whose agent keeps it fresh lets the rank run to its end.
func TestRunShimAgentSilent(t *testing.T) {
	t.Parallel()
	t.Run("silent agent: the rank and its children are killed", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		aliveFile := filepath.Join(dir, "agent.alive")
		if err := os.WriteFile(aliveFile, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		// Fresh until the rank has started its child.
		setMtime(t, aliveFile, time.Now().Add(time.Hour))
		cfg := ShimConfig{ExitFile: filepath.Join(dir, "rank-0.exit"), AliveFile: aliveFile, Silence: 50 * time.Millisecond, Grace: 100 * time.Millisecond}
		// The rank ignores SIGTERM, so only the SIGKILL after the grace
		// ends it, and leaves a child of its own behind.
		child := filepath.Join(dir, "child")
		script := `trap "" TERM; sleep 300 & echo $! > "$1.tmp"; mv "$1.tmp" "$1"; wait`
		shim := startShim(t, cfg, "sh", "-c", script, "sh", child)
		var pid int
		for tick := time.NewTicker(10 * time.Millisecond); pid == 0; <-tick.C {
			if b, err := os.ReadFile(child); err == nil {
				if pid, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
					t.Fatal(err)
				}
			}
		}
		setMtime(t, aliveFile, time.Now().Add(-time.Hour))
		err := shim.Wait()
		if ws, ok := shim.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Errorf("shim ended with %v, want killed by its own group's SIGKILL", err)
		}
		got, ok := readShimExit(cfg.ExitFile)
		if want := (shimExit{ExitCode: -1, Signal: "killed", AgentSilent: true}); !ok || got != want {
			t.Errorf("exit file %+v (%v), want %+v", got, ok, want)
		}
		// The child was in the group the shim killed: gone, or a zombie
		// waiting for init. The SIGKILL the group got is pending on the
		// child until the kernel schedules it, which on a busy machine
		// can be after the shim's own end, so wait for it to take
		// effect; a child that outlived the kill would run its full 300 s.
		deadline := time.Now().Add(30 * time.Second)
		for tick := time.NewTicker(10 * time.Millisecond); alive(pid, 0) && !zombie(pid); <-tick.C {
			if time.Now().After(deadline) {
				t.Errorf("the rank's child %d still runs 30 s after the group's SIGKILL", pid)
				break
			}
		}
	})
	t.Run("live agent: the rank runs to its end", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		alive := filepath.Join(dir, "agent.alive")
		if err := os.WriteFile(alive, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		defer close(done)
		go func() {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-done:
					return
				case now := <-tick.C:
					_ = os.Chtimes(alive, now, now)
				}
			}
		}()
		cfg := ShimConfig{ExitFile: filepath.Join(dir, "rank-0.exit"), AliveFile: alive, Silence: 500 * time.Millisecond, Grace: time.Second}
		// Three silences long: the shim looks many times.
		shim := startShim(t, cfg, "sh", "-c", "sleep 1.5; exit 4")
		_ = shim.Wait()
		if code := shim.ProcessState.ExitCode(); code != 4 {
			t.Errorf("shim exit %d, want the rank's 4", code)
		}
		got, ok := readShimExit(cfg.ExitFile)
		if want := (shimExit{ExitCode: 4}); !ok || got != want {
			t.Errorf("exit file %+v (%v), want %+v", got, ok, want)
		}
	})
}

func setMtime(t *testing.T, path string, at time.Time) {
	t.Helper()
	if err := os.Chtimes(path, at, at); err != nil {
		t.Fatal(err)
	}
}

func TestShimArgs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  ShimConfig
		want []string
	}{
		{"exit file only", ShimConfig{ExitFile: "/s/x.exit"}, []string{"/s/x.exit", "--", "sh", "-c", "exit 0"}},
		{"everything", ShimConfig{ExitFile: "/s/x.exit", AliveFile: "/s/agent.alive", Silence: 15 * time.Second, Grace: time.Second,
			GateFD: 3, User: &Credential{UID: 65534, GID: 65534, Groups: []uint32{65534, 27}}},
			[]string{"--alive", "/s/agent.alive", "--silence", "15s", "--grace", "1s", "--gate-fd", "3",
				"--uid", "65534", "--gid", "65534", "--groups=65534,27", "/s/x.exit", "--", "sh", "-c", "exit 0"}},
		{"a user without supplementary groups", ShimConfig{ExitFile: "/s/x.exit", User: &Credential{UID: 1, GID: 2, Groups: []uint32{}}},
			[]string{"--uid", "1", "--gid", "2", "--groups=", "/s/x.exit", "--", "sh", "-c", "exit 0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			argv := []string{"sh", "-c", "exit 0"}
			got := tc.cfg.Args(argv)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Args = %q, want %q", got, tc.want)
			}
			cfg, rest, err := ParseShimArgs(got)
			if err != nil {
				t.Fatal(err)
			}
			want := tc.cfg
			if want.Grace == 0 {
				want.Grace = DefaultGrace
			}
			if !reflect.DeepEqual(cfg, want) || !slices.Equal(rest, argv) {
				t.Errorf("ParseShimArgs = %+v %q, want %+v %q", cfg, rest, want, argv)
			}
		})
	}
	for _, args := range [][]string{
		nil,
		{"/s/x.exit"},
		{"/s/x.exit", "sh"},
		{"/s/x.exit", "--"},
		{"--uid", "1", "/s/x.exit", "--", "sh"},
		{"--uid", "1", "--gid", "-2", "/s/x.exit", "--", "sh"},
		{"--uid", "1", "--gid", "1", "--groups", "a", "/s/x.exit", "--", "sh"},
		{"--uid", "4294967296", "--gid", "1", "/s/x.exit", "--", "sh"},
		{"--no-such-flag", "/s/x.exit", "--", "sh"},
	} {
		if cfg, rest, err := ParseShimArgs(args); err == nil {
			t.Errorf("ParseShimArgs(%q) = %+v %q, want an error", args, cfg, rest)
		}
	}
}

// TestShimGate: the shim starts its rank once the agent writes a byte on
// the gate; an agent that ends first (the pipe closed, nothing written)
// leaves no rank started.
func TestShimGate(t *testing.T) {
	t.Parallel()
	for _, open := range []bool{true, false} {
		t.Run(fmt.Sprintf("opened %v", open), func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			mark := filepath.Join(dir, "started")
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			cfg := ShimConfig{ExitFile: filepath.Join(dir, "rank-0.exit"), GateFD: 3}
			argv := append(testShim(), cfg.Args([]string{"sh", "-c", `touch "$0"`, mark})...)
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.ExtraFiles = []*os.File{r}
			cmd.Stderr = os.Stderr
			detach(cmd)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = signalGroup(cmd.Process.Pid, sigKill) })
			_ = r.Close()
			if open {
				_, err = w.Write([]byte{0})
			}
			_ = w.Close()
			if err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			_, statErr := os.Stat(mark)
			if started := statErr == nil; started != open {
				t.Errorf("rank started: %v, want %v", started, open)
			}
			code := cmd.ProcessState.ExitCode()
			_, wrote := readShimExit(cfg.ExitFile)
			switch {
			case open && (code != 0 || !wrote):
				t.Errorf("gate opened: shim exit %d, exit file written %v; want 0, written", code, wrote)
			case !open && (code != 125 || wrote):
				t.Errorf("gate closed: shim exit %d, exit file written %v; want 125, none", code, wrote)
			}
		})
	}
}
