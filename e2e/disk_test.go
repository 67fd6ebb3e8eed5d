package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestServeFailsFastOnABadDataDir starts serve on a data dir it cannot
// create and on a read-only one: it exits at once with an error naming the
// path (it used to wait 30 s for its embedded server and say only "not
// ready after 30s").
func TestServeFailsFastOnABadDataDir(t *testing.T) {
	needBinaries(t)
	t.Parallel()
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		dir  func(t *testing.T) string
		want string
	}{
		{"uncreatable", func(*testing.T) string { return filepath.Join(file, "data") }, "cannot create"},
		{"read-only", func(t *testing.T) string {
			if os.Geteuid() != 0 {
				dir := filepath.Join(t.TempDir(), "ro")
				if err := os.Mkdir(dir, 0o500); err != nil {
					t.Fatal(err)
				}
				return dir
			}
			return mountTmpfs(t, "1m", true) // root writes through mode bits
		}, "not writable"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := c.dir(t)
			began := time.Now()
			r := runCmd(t, 25*time.Second, childEnv(), bins.toposched, "serve", "--cluster", testdata(t, "two-nodes.yaml"),
				"--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--data-dir", dir)
			took := time.Since(began)
			if r.code == 0 {
				t.Fatalf("serve on data dir %s exited 0", dir)
			}
			if !strings.Contains(r.stderr, dir) || !strings.Contains(r.stderr, c.want) {
				t.Errorf("serve on %s: error does not name the path and say %q:\n%s", dir, c.want, r.stderr)
			}
			if took > 10*time.Second {
				t.Errorf("serve took %s to give up on %s, want at once", took.Round(time.Millisecond), dir)
			}
		})
	}
}

// TestDiskFullStoreIsReportedAndFreed fills the embedded server's
// JetStream store, once through a tiny max_file_store in --nats-config and
// once on a 3 MB filesystem (root only: it mounts a tmpfs), where serve
// must size its store from the free space instead of claiming 8 GB. Full,
// topoctl submit fails at once saying "JetStream storage full" (on the
// small disk it used to time out: the server's writes failed and it
// disabled JetStream) and /readyz answers 503 about the storage; purged,
// both work again.
func TestDiskFullStoreIsReportedAndFreed(t *testing.T) {
	needBinaries(t)
	t.Parallel()
	for _, c := range []struct {
		name  string
		setup func(t *testing.T) (dataDir string, extra []string)
	}{
		{"tiny max_file_store", func(t *testing.T) (string, []string) {
			// The config's users are the roles' nkeys, as a site writes
			// them (toposched roles conf), and serve signs in as the
			// operator. The system account's password is set in the
			// file: nats-server reads an include's variables from the
			// environment only, which childEnv clears of NATS_*.
			data := t.TempDir()
			creds := credentialsDir(data)
			issueRoles(t, creds)
			conf := filepath.Join(t.TempDir(), "nats.conf")
			body := "NATS_SYS_PASSWORD: \"sys-pw\"\njetstream { max_file_store: 2MB }\n" + rolesConf(t, creds)
			if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			return data, []string{"--nats-config", conf, "--nats-nkey", seedIn(t, creds, roleOperator)}
		}},
		{"3 MB filesystem", func(t *testing.T) (string, []string) {
			return mountTmpfs(t, "3m", false), nil
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dataDir, extra := c.setup(t)
			port, metrics := freePort(t), fmt.Sprintf("127.0.0.1:%d", freePort(t))
			url := fmt.Sprintf("nats://127.0.0.1:%d", port)
			serve := startServe(t, "serve", testdata(t, "two-nodes.yaml"), port, dataDir,
				append(extra, "--metrics-listen", metrics, "--poll", "0")...)
			maxStore := loggedMaxStore(t, serve)
			if maxStore > 3<<20 {
				t.Errorf("serve claims %d bytes of JetStream storage, want at most 3 MB", maxStore)
			}
			waitReadyz(t, metrics, http.StatusOK, []string{"ready"}, serve)

			// Fill the jobs stream with a subject no service reads.
			js := jsConnect(t, url)
			filler := "toposched.jobs.filler"
			body := make([]byte, 64<<10)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var full error
			for i := 0; full == nil && i < 2*int(maxStore)/len(body); i++ {
				_, full = js.Publish(ctx, filler, body)
			}
			var apiErr *jetstream.APIError
			if !errors.As(full, &apiErr) || apiErr.Code != http.StatusServiceUnavailable {
				t.Fatalf("filling a %d-byte store: %v, want JetStream's 'insufficient resources'", maxStore, full)
			}

			began := time.Now()
			r := topoctl(t, url, "submit", writeJob(t, t.TempDir(), "full-1", 8))
			if r.code == 0 || !strings.Contains(r.stderr, "JetStream storage full") {
				t.Errorf("topoctl submit on a full store: exit %d, want 'JetStream storage full'\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
			}
			if took := time.Since(began); took > 15*time.Second {
				t.Errorf("topoctl submit took %s to fail, want at once", took.Round(time.Millisecond))
			}
			waitReadyz(t, metrics, http.StatusServiceUnavailable, []string{"JetStream storage full"}, serve)

			natsCLI(t, url, "stream", "purge", streamJobs, "--subject", filler, "-f")
			waitReadyz(t, metrics, http.StatusOK, []string{"ready"}, serve)
			submitWaitDecided(t, url, writeJob(t, t.TempDir(), "full-2", 8), "full-2")
			mustBeAlive(t, serve)
		})
	}
}

var maxStoreLine = regexp.MustCompile(`JetStream file storage.* max_store=(\d+)`)

// loggedMaxStore is the JetStream storage limit serve's log states.
func loggedMaxStore(t *testing.T, p *proc) int64 {
	t.Helper()
	m := maxStoreLine.FindStringSubmatch(p.output())
	if m == nil {
		t.Fatalf("serve's log does not state its JetStream storage limit:\n%s", p.output())
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDiskFullHealsWithoutARestart runs serve on a small tmpfs (root only)
// and makes its store full twice, then gives the room back without
// restarting serve: submissions are taken again and /readyz answers 200.
// Before, serve kept the limit it sized at start and stayed "storage full"
// until restarted.
//
//   - enlarged: the 3 MB filesystem filled to "insufficient resources",
//     then remounted at 16 MB;
//   - freed: a file that is not JetStream's fills a 16 MB filesystem
//     while serve runs; JetStream is limited below what it claimed at
//     start, so it fills up as "storage full" rather than write into a
//     full disk and switch itself off; the file removed, the limit is
//     lifted.
func TestDiskFullHealsWithoutARestart(t *testing.T) {
	needBinaries(t)
	t.Parallel()
	for _, c := range []struct {
		name, size string
		// fillUp leaves the store's filesystem with little room, before
		// the store is filled; makeRoom gives room back.
		fillUp, makeRoom func(t *testing.T, dataDir string, serve *proc)
		// refused is the JetStream error code of a publish into the
		// full store; healed, what serve logs when the room is back.
		refused jetstream.ErrorCode
		healed  string
	}{
		{name: "enlarged", size: "3m",
			fillUp:   func(*testing.T, string, *proc) {},
			makeRoom: func(t *testing.T, dataDir string, _ *proc) { resizeTmpfs(t, dataDir, "16m") },
			refused:  10023, healed: "JetStream file storage limit raised"},
		{name: "freed", size: "16m",
			fillUp: func(t *testing.T, dataDir string, serve *proc) {
				if err := os.WriteFile(filepath.Join(dataDir, "ballast"), make([]byte, 12<<20), 0o600); err != nil {
					t.Fatal(err)
				}
				waitFor(t, 30*time.Second, func() (bool, string) {
					mustBeAlive(t, serve)
					return strings.Contains(serve.output(), "JetStream file storage limited below its limit"),
						"serve has not limited its storage to what the filesystem has left"
				})
			},
			makeRoom: func(t *testing.T, dataDir string, _ *proc) {
				if err := os.Remove(filepath.Join(dataDir, "ballast")); err != nil {
					t.Fatal(err)
				}
			},
			refused: 10002, healed: "JetStream file storage back to its limit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dataDir := mountTmpfs(t, c.size, false)
			port, metrics := freePort(t), fmt.Sprintf("127.0.0.1:%d", freePort(t))
			url := fmt.Sprintf("nats://127.0.0.1:%d", port)
			serve := startServe(t, "serve", testdata(t, "two-nodes.yaml"), port, dataDir, "--metrics-listen", metrics, "--poll", "0")
			waitReadyz(t, metrics, http.StatusOK, []string{"ready"}, serve)
			c.fillUp(t, dataDir, serve)

			// Filled with ever smaller bodies: an account's limit refuses
			// a body that would pass it, and takes a smaller one.
			js := jsConnect(t, url)
			filler := "toposched.jobs.filler"
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			for _, size := range []int{64 << 10, 4 << 10, 64} {
				body := make([]byte, size)
				var full error
				for i := 0; full == nil && i < 2*(16<<20)/size; i++ {
					_, full = js.Publish(ctx, filler, body)
				}
				var apiErr *jetstream.APIError
				if !errors.As(full, &apiErr) || apiErr.ErrorCode != c.refused {
					t.Fatalf("filling the store with %d-byte bodies: %v, want JetStream's refusal %d", size, full, c.refused)
				}
			}
			r := topoctl(t, url, "submit", writeJob(t, t.TempDir(), "heal-1", 8))
			if r.code == 0 || !strings.Contains(r.stderr, "JetStream storage full") {
				t.Errorf("topoctl submit on a full store: exit %d, want 'JetStream storage full'\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
			}
			waitReadyz(t, metrics, http.StatusServiceUnavailable, []string{"JetStream storage full"}, serve)

			c.makeRoom(t, dataDir, serve)
			waitReadyz(t, metrics, http.StatusOK, []string{"ready"}, serve)
			submitWaitDecided(t, url, writeJob(t, t.TempDir(), "heal-2", 8), "heal-2")
			out := serve.output()
			if !strings.Contains(out, c.healed) {
				t.Errorf("serve's log does not say %q:\n%s", c.healed, out)
			}
			for _, off := range []string{"will be DISABLED", "JetStream started again"} {
				if strings.Contains(out, off) {
					t.Errorf("JetStream switched itself off (%q in serve's log):\n%s", off, out)
				}
			}
			mustBeAlive(t, serve)
		})
	}
}
