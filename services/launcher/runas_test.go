package launcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/schemas"
)

// selfAllow is --run-as-allow for agents under test: the user the test
// runs as, so that an agent started by a root test may run (as root).
func selfAllow(t *testing.T) []string {
	t.Helper()
	self, err := currentAccount()
	if err != nil {
		t.Fatal(err)
	}
	return []string{self.name}
}

// fakeUsers is a lookup over a fixed set of users.
func fakeUsers(users ...*account) func(string) (*account, error) {
	return func(name string) (*account, error) {
		for _, u := range users {
			if u.name == name {
				return u, nil
			}
		}
		if name == "broken" {
			return nil, errors.New("nss: ldap server unreachable")
		}
		return nil, user.UnknownUserError(name)
	}
}

var (
	rootUser  = &account{name: "root", uid: 0, gid: 0, groups: []uint32{0}, home: "/root"}
	aliceUser = &account{name: "alice", uid: 1000, gid: 1000, groups: []uint32{1000, 27}, home: "/home/alice"}
	bobUser   = &account{name: "bob", uid: 1001, gid: 1001, groups: []uint32{1001}, home: "/home/bob"}
	svcUser   = &account{name: "svc", uid: 999, gid: 999, groups: []uint32{999}, home: "/var/lib/svc"}
)

// TestRunAsPolicy is the decision table: who the agent is, its flags, the
// job's run_as; whether the agent starts, and as whom the ranks run.
func TestRunAsPolicy(t *testing.T) {
	t.Parallel()
	lookup := fakeUsers(rootUser, aliceUser, bobUser, svcUser)
	for _, tc := range []struct {
		name    string
		self    *account
		allow   []string
		def     string
		startIs string // "" the agent starts, else in its error
		runAs   string
		want    string // the user the ranks switch to, "" none (the agent's own)
		wantErr string // the launch error's message, "" none
	}{
		// An agent running as root.
		{name: "root without a list does not start", self: rootUser, startIs: "--run-as-allow: required for an agent running as root"},
		{name: "root with an empty list does not start", self: rootUser, allow: []string{}, startIs: "--run-as-allow: required"},
		{name: "root, a listed user", self: rootUser, allow: []string{"alice", "bob"}, runAs: "alice", want: "alice"},
		{name: "root, an unlisted user", self: rootUser, allow: []string{"alice"}, runAs: "bob",
			wantErr: "run_as: bob: not a user this agent may run ranks as"},
		{name: "root, root unlisted", self: rootUser, allow: []string{"alice"}, runAs: "root",
			wantErr: "run_as: root: not a user this agent may run ranks as"},
		{name: "root, no run_as, no default, root unlisted", self: rootUser, allow: []string{"alice"},
			wantErr: "run_as: the job names none, and this agent runs ranks only as the users it allows: name one"},
		{name: "root, no run_as, root listed: the explicit opt-in", self: rootUser, allow: []string{"root"}, want: ""},
		{name: "root, run_as root listed", self: rootUser, allow: []string{"root", "alice"}, runAs: "root", want: ""},
		{name: "root, no run_as, the default", self: rootUser, allow: []string{"alice", "bob"}, def: "bob", want: "bob"},
		{name: "root, run_as beats the default", self: rootUser, allow: []string{"alice", "bob"}, def: "bob", runAs: "alice", want: "alice"},
		{name: "root, listed but unknown here", self: rootUser, allow: []string{"carol"}, runAs: "carol",
			wantErr: "run_as: carol: no such user on this node"},
		{name: "root, the lookup fails", self: rootUser, allow: []string{"broken"}, runAs: "broken",
			wantErr: "run_as: broken: the agent could not look the user up (the agent's log says why)"},
		{name: "root, not a user name", self: rootUser, allow: []string{"alice"}, runAs: "-alice",
			wantErr: "run_as: -alice: not a user name"},
		{name: "root, a NUL", self: rootUser, allow: []string{"alice"}, runAs: "alice\x00",
			wantErr: `run_as: "alice\x00": not a user name`},
		{name: "root, a default not listed", self: rootUser, allow: []string{"alice"}, def: "bob", startIs: "--run-as-default bob: not in --run-as-allow"},
		{name: "root, a default unknown", self: rootUser, allow: []string{"carol"}, def: "carol", startIs: "--run-as-default carol: user: unknown user carol"},
		{name: "root, a list entry not a name", self: rootUser, allow: []string{"alice", "a b"}, startIs: "--run-as-allow: a b: not a user name"},

		// An agent not running as root.
		{name: "user, no list, no run_as", self: svcUser, want: ""},
		{name: "user, run_as itself", self: svcUser, runAs: "svc", want: ""},
		{name: "user, run_as another", self: svcUser, runAs: "alice",
			wantErr: "run_as: alice: this agent does not run as root, so it runs ranks only as its own user"},
		{name: "user, run_as root", self: svcUser, runAs: "root",
			wantErr: "run_as: root: this agent does not run as root, so it runs ranks only as its own user"},
		{name: "user, a list holding it", self: svcUser, allow: []string{"svc"}, want: ""},
		{name: "user, a list without it", self: svcUser, allow: []string{"alice"},
			wantErr: "run_as: the job names none, and this agent runs ranks only as the users it allows"},
		{name: "user, a listed other user", self: svcUser, allow: []string{"alice", "svc"}, runAs: "alice",
			wantErr: "run_as: alice: this agent does not run as root"},
		{name: "user, a default of another user", self: svcUser, def: "alice", startIs: "--run-as-default alice: this agent runs as svc, not root, and can run ranks only as itself"},
		{name: "user, a default of itself", self: svcUser, def: "svc", want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := newRunAsPolicy(tc.self, tc.allow, tc.def, lookup)
			if tc.startIs != "" {
				if err == nil || !strings.Contains(err.Error(), tc.startIs) {
					t.Fatalf("newRunAsPolicy: %v, want %q", err, tc.startIs)
				}
				return
			}
			if err != nil {
				t.Fatalf("newRunAsPolicy: %v", err)
			}
			got, err := p.resolve(tc.runAs)
			if tc.wantErr != "" {
				var le *launchError
				if !errors.As(err, &le) || le.field != "run_as" || !strings.HasPrefix(err.Error(), tc.wantErr) {
					t.Fatalf("resolve(%q) = %v, %v; want a run_as error %q", tc.runAs, got, err, tc.wantErr)
				}
				// The agent's list is its own.
				if len(tc.allow) > 1 && strings.Contains(err.Error(), strings.Join(tc.allow, " ")) {
					t.Errorf("the error %q shows the agent's list", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("resolve(%q): %v", tc.runAs, err)
			}
			name := ""
			if got != nil {
				name = got.name
			}
			if name != tc.want {
				t.Errorf("resolve(%q) = %q, want %q", tc.runAs, name, tc.want)
			}
		})
	}
}

// TestRunAsPattern: the agent reads user names as the schema does.
func TestRunAsPattern(t *testing.T) {
	t.Parallel()
	b, err := schemas.FS.ReadFile("v1/jobs.submitted.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Properties map[string]struct {
			Pattern string `json:"pattern"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if got := s.Properties["run_as"].Pattern; got != userName.String() {
		t.Errorf("schema's run_as pattern %q, the agent's %q", got, userName)
	}
}

// TestPlanRunAs: a rank run as another user has that user's identity and
// home in its environment, and its credential.
func TestPlanRunAs(t *testing.T) {
	t.Parallel()
	job := &events.JobSubmitted{JobID: "j1", GPUs: 4, Command: "/bin/sh", RunAs: "alice"}
	p, err := makePlan(planInput{node: "a", job: job, decision: twoNodes(), masterAddr: "m",
		baseEnv: []string{"PATH=/usr/bin", "HOME=/root", "USER=root", "LOGNAME=root"}, user: aliceUser})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range p.ranks {
		env := envMap(r.env)
		if env["HOME"] != "/home/alice" || env["USER"] != "alice" || env["LOGNAME"] != "alice" {
			t.Errorf("rank %d: HOME=%s USER=%s LOGNAME=%s, want alice's", r.rank.Rank, env["HOME"], env["USER"], env["LOGNAME"])
		}
		if u := r.user; u == nil || u.UID != 1000 || u.GID != 1000 || fmt.Sprint(u.Groups) != "[1000 27]" {
			t.Errorf("rank %d: credential %+v, want alice's", r.rank.Rank, u)
		}
	}
}

// TestNewRefusesRootWithoutList: an agent running as root does not start
// without --run-as-allow.
func TestNewRefusesRootWithoutList(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("the test does not run as root: TestRunAsPolicy covers a root agent")
	}
	_, err := New(Config{Node: "a", StateDir: t.TempDir()}, Deps{Log: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), "--run-as-allow") {
		t.Fatalf("New as root without a list: %v, want an error naming --run-as-allow", err)
	}
	if _, err := New(Config{Node: "a", StateDir: t.TempDir(), RunAsAllow: []string{"root"}}, Deps{Log: slog.New(slog.DiscardHandler)}); err != nil {
		t.Fatalf("New as root with --run-as-allow root: %v", err)
	}
}

// TestAgentRunAs: an agent running as root runs a job's rank as its
// run_as user (nobody): that uid, gid and groups, its home, in a
// directory entered as that user; the rank cannot write into the state
// directory, while its shim (the agent's identity) still records its end.
// A user not on the list is refused, naming run_as.
func TestAgentRunAs(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("the test does not run as root, so it cannot start a rank as another user (CI runs it as root)")
	}
	nobody, err := lookupAccount("nobody")
	if err != nil {
		t.Skipf("no user nobody on this machine: %v", err)
	}
	e := newAgentEnv(t)
	out := t.TempDir()
	// The rank, as nobody, writes in out and nowhere else; the state
	// directory is open to read, as the agent's default is.
	for dir, mode := range map[string]os.FileMode{filepath.Dir(out): 0o711, filepath.Dir(e.state): 0o711, out: 0o777, e.state: 0o755} {
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, withShim := range []bool{true, false} {
		t.Run(fmt.Sprintf("shim %v", withShim), func(t *testing.T) {
			id := "as-nobody-" + strconv.FormatBool(withShim)
			cfg := Config{RunAsAllow: []string{"nobody"}}
			if !withShim {
				cfg.Shim = []string{}
			}
			a := e.start(t, cfg)
			defer a.stop()
			script := `dir="$OUT/` + id + `"; mkdir "$dir"; id -u > "$dir/uid"; id -g > "$dir/gid"; id -G > "$dir/groups"; pwd > "$dir/pwd"; echo "$HOME" > "$dir/home"; ` +
				`if touch "$STATE/jobs/x" 2>/dev/null || touch "$STATE/agent.alive" 2>/dev/null; then echo yes > "$dir/wrote-state"; fi`
			e.submit(t, &events.JobSubmitted{JobID: id, Command: "sh", Args: []string{"-c", script}, Workdir: out,
				Env: []string{"OUT=" + out, "STATE=" + e.state}, RunAs: "nobody"}, 0)
			waitUntil(t, 30*time.Second, func() (bool, string) {
				return e.finished(t)[id] != nil, fmt.Sprintf("%s has not finished:\n%s", id, a.log)
			})
			if f := e.finished(t)[id]; f.Status != events.StatusSucceeded {
				t.Fatalf("%s finished %s (%s: %s), want succeeded", id, f.Status, f.Reason, f.Message)
			}
			read := func(name string) string {
				b, err := os.ReadFile(filepath.Join(out, id, name))
				if err != nil {
					t.Fatal(err)
				}
				return strings.TrimSpace(string(b))
			}
			var groups []string
			for _, g := range nobody.groups {
				groups = append(groups, strconv.FormatUint(uint64(g), 10))
			}
			for name, want := range map[string]string{
				"uid": strconv.FormatUint(uint64(nobody.uid), 10), "gid": strconv.FormatUint(uint64(nobody.gid), 10),
				"groups": strings.Join(groups, " "), "pwd": out, "home": nobody.home,
			} {
				if got := read(name); got != want {
					t.Errorf("rank's %s: %q, want %q (nobody's)", name, got, want)
				}
			}
			if _, err := os.Stat(filepath.Join(out, id, "wrote-state")); err == nil {
				t.Errorf("the rank, as nobody, wrote into the agent's state directory")
			}
		})
	}

	// The agent enters the workdir as root; the rank enters it again, by
	// its path, as its user: one nobody cannot reach is no way in.
	t.Run("a workdir the user cannot reach", func(t *testing.T) {
		closed := filepath.Join(out, "closed")
		open := filepath.Join(closed, "open")
		if err := os.MkdirAll(open, 0o777); err != nil {
			t.Fatal(err)
		}
		for dir, mode := range map[string]os.FileMode{closed: 0o700, open: 0o777} {
			if err := os.Chmod(dir, mode); err != nil {
				t.Fatal(err)
			}
		}
		a := e.start(t, Config{RunAsAllow: []string{"nobody"}})
		defer a.stop()
		e.submit(t, &events.JobSubmitted{JobID: "closed-workdir", Command: "sh", Args: []string{"-c", "touch ran"}, Workdir: open, RunAs: "nobody"}, 3)
		waitUntil(t, 30*time.Second, func() (bool, string) {
			return e.finished(t)["closed-workdir"] != nil, fmt.Sprintf("the job has not finished:\n%s", a.log)
		})
		if f := e.finished(t)["closed-workdir"]; f.Status != events.StatusFailed || !strings.Contains(f.Message, "rank 0 exited with status 127") {
			t.Errorf("finished %s (%s): %q, want failed: rank 0 exited with status 127", f.Status, f.Reason, f.Message)
		}
		if _, err := os.Stat(filepath.Join(open, "ran")); err == nil {
			t.Errorf("the rank ran in a directory its user cannot reach")
		}
	})

	t.Run("a user not on the list", func(t *testing.T) {
		a := e.start(t, Config{RunAsAllow: []string{"nobody"}})
		defer a.stop()
		e.submit(t, &events.JobSubmitted{JobID: "as-root", Command: "sh", Args: []string{"-c", "true"}, RunAs: "root"}, 1)
		e.submit(t, &events.JobSubmitted{JobID: "as-none", Command: "sh", Args: []string{"-c", "true"}}, 2)
		waitUntil(t, 30*time.Second, func() (bool, string) {
			fin := e.finished(t)
			return fin["as-root"] != nil && fin["as-none"] != nil, fmt.Sprintf("jobs finished: %v", fin)
		})
		for id, want := range map[string]string{
			"as-root": "a: run_as: root: not a user this agent may run ranks as",
			"as-none": "a: run_as: the job names none, and this agent runs ranks only as the users it allows: name one",
		} {
			if f := e.finished(t)[id]; f.Status != events.StatusFailed || f.Reason != events.ReasonLaunchFailed || f.Message != want {
				t.Errorf("%s finished %s (%s): %q, want failed (launch_failed): %q", id, f.Status, f.Reason, f.Message, want)
			}
		}
	})
}
