package e2e

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// `toposched serve` requires credentials on loopback too: the clients of
// each serve the tests start sign in with the seeds serve keeps in its
// data dir (DATA_DIR/credentials/<role>.nk), as a user on that host does.
// startServe records each serve's address and data dir here, and the
// helpers that talk to a server (topoctl, natsCLI, jsConnect, the agents)
// find the right seed for its URL: topoctl through TOPOSCHED_DATA_DIR,
// where it looks itself (launcher.nk, tenant-<t>.nk with --tenant,
// policy-admin.nk for pushes); the nats CLI and nats.go, which read the
// streams below the services' permissions, with operator.nk. A server the
// tests do not know (natsServer, a secured nats-server) gets none.
var served struct {
	sync.Mutex
	// dataDirs maps a serve's host:port to its data dir.
	dataDirs map[string]string
}

// Roles whose seeds serve writes on its first start.
const (
	roleOperator = "operator"
	roleLauncher = "launcher"
)

// registerServe records that the serve listening on addr (host:port) keeps
// its credentials under dataDir, until the test ends.
func registerServe(t testing.TB, addr, dataDir string) {
	t.Helper()
	served.Lock()
	defer served.Unlock()
	if served.dataDirs == nil {
		served.dataDirs = map[string]string{}
	}
	served.dataDirs[addr] = dataDir
	t.Cleanup(func() {
		served.Lock()
		defer served.Unlock()
		if served.dataDirs[addr] == dataDir {
			delete(served.dataDirs, addr)
		}
	})
}

// servedDataDir is the data dir of the serve at url, "" when the URL is
// not one serve the tests started with credentials.
func servedDataDir(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || strings.Contains(rawURL, ",") {
		return ""
	}
	served.Lock()
	defer served.Unlock()
	return served.dataDirs[u.Host]
}

// credentialsDir is serve's credentials directory in its data dir.
func credentialsDir(dataDir string) string { return filepath.Join(dataDir, "credentials") }

// seedOf is the seed file of role in the credentials of the serve at url;
// the test fails if there is none.
func seedOf(t testing.TB, url, role string) string {
	t.Helper()
	data := servedDataDir(url)
	if data == "" {
		t.Fatalf("%s is no serve started by this test with credentials: no %s seed", url, role)
	}
	return seedIn(t, credentialsDir(data), role)
}

// seedIn is role's seed file in a credentials directory; the test fails
// if it is not there.
func seedIn(t testing.TB, dir, role string) string {
	t.Helper()
	p := filepath.Join(dir, role+".nk")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the %s seed: %v", role, err)
	}
	return p
}

// nkeyOption signs a nats.go connection in with a seed file.
func nkeyOption(t testing.TB, seed string) nats.Option {
	t.Helper()
	o, err := nats.NkeyOptionFromSeed(seed)
	if err != nil {
		t.Fatalf("seed %s: %v", seed, err)
	}
	return o
}

// operatorOptions are the nats.go options that sign in to the server at
// url as its operator, where it needs it.
func operatorOptions(t testing.TB, url string) []nats.Option {
	t.Helper()
	if servedDataDir(url) == "" {
		return nil
	}
	return []nats.Option{nkeyOption(t, seedOf(t, url, roleOperator))}
}

// clientEnv is the environment of a toposched or topoctl client of url:
// where it is a serve's, TOPOSCHED_DATA_DIR points the client at serve's
// credentials, where it finds its role's seed by itself.
func clientEnv(url string, extra ...string) []string {
	if data := servedDataDir(url); data != "" {
		extra = append([]string{"TOPOSCHED_DATA_DIR=" + data}, extra...)
	}
	return childEnv(extra...)
}

// natsCLIAuth are the nats CLI's flags that sign in to url as the
// operator, unless args already sign in.
func natsCLIAuth(t *testing.T, url string, args []string) []string {
	t.Helper()
	if servedDataDir(url) == "" || slices.ContainsFunc(args, func(a string) bool {
		return a == "--nkey" || a == "--user" || a == "--creds"
	}) {
		return nil
	}
	return []string{"--nkey", seedOf(t, url, roleOperator)}
}

// issueRoles runs the real `toposched roles issue --dir dir` with args
// (--agent NODE, --tenant T) and returns its output.
func issueRoles(t testing.TB, dir string, args ...string) string {
	t.Helper()
	r := runCmd(t, 30*time.Second, childEnv(), bins.toposched, append([]string{"roles", "issue", "--dir", dir}, args...)...)
	if r.code != 0 {
		t.Fatalf("toposched roles issue --dir %s %s: exit %d\nstdout:\n%s\nstderr:\n%s", dir, strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// rolesConf is the nats-server users of the credentials directory dir:
// the real `toposched roles conf --dir`'s output.
func rolesConf(t *testing.T, dir string) string {
	t.Helper()
	r := runCmd(t, 30*time.Second, childEnv(), bins.toposched, "roles", "conf", "--dir", dir)
	if r.code != 0 {
		t.Fatalf("toposched roles conf --dir %s: exit %d\nstdout:\n%s\nstderr:\n%s", dir, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// rolesLine finds the roles of serve's users in its log lines
// ("embedded NATS requires credentials" at its start, "credentials
// changed" after).
var rolesLine = regexp.MustCompile(`msg="(?:embedded NATS requires credentials|credentials changed)[^"]*".* roles="?\[([^\]]*)\]`)

// waitServeTakesRoles waits until serve's log says its server lets the
// roles in (it reads its credentials directory once a second).
func waitServeTakesRoles(t *testing.T, serve *proc, roles ...string) {
	t.Helper()
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		ms := rolesLine.FindAllStringSubmatch(serve.output(), -1)
		if len(ms) == 0 {
			return false, "serve's log names no users"
		}
		have := strings.Fields(ms[len(ms)-1][1])
		for _, r := range roles {
			if !slices.Contains(have, r) {
				return false, fmt.Sprintf("serve's users are %v, without %s", have, r)
			}
		}
		return true, ""
	})
}
