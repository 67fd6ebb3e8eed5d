package launcher

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
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

func TestMain(m *testing.M) {
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
