package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/natsserver"
	"github.com/toposched/toposched/internal/authcallout"
)

// roles runs toposched roles with args and returns its output and error
// output.
func rolesCmd(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	cmd := newRoles(&globals{prefix: events.DefaultPrefix})
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), errOut.String(), err
}

// confOptions reads text, a roles conf output, as nats-server reads its
// configuration.
func confOptions(t *testing.T, text string) *server.Options {
	t.Helper()
	file := filepath.Join(t.TempDir(), "roles.conf")
	if err := os.WriteFile(file, []byte("jetstream {store_dir: $NATS_STORE_DIR}\n"+text), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NATS_SYS_PASSWORD", "pw")
	t.Setenv("NATS_STORE_DIR", t.TempDir())
	opts, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	return opts
}

// roles issue --auth-callout writes the responder's seed and the issuer's
// account seed; roles conf --auth-callout-issuer puts the responder in an
// account of its own and turns the callout on, every user of the
// directory (and the system account's) an auth user, each user with its
// role's permissions as before.
func TestRolesConfAuthCallout(t *testing.T) {
	dir := t.TempDir()
	out, _, err := rolesCmd(t, "issue", "--dir", dir, "--services", "--agent", "gpu-001", "--tenant", "research", "--auth-callout")
	if err != nil {
		t.Fatal(err)
	}
	issuerFile := filepath.Join(dir, authcallout.IssuerFile)
	pub, err := authcallout.IssuerPublicKey(issuerFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, pub) || !strings.Contains(out, roleAuthCallout) {
		t.Fatalf("roles issue does not print the issuer's public key and the responder:\n%s", out)
	}
	if list, _, err := rolesCmd(t, "list", "--dir", dir); err != nil || !strings.Contains(list, pub) {
		t.Fatalf("roles list does not name the issuer (%v):\n%s", err, list)
	}
	creds, errs := natsserver.ReadCredentials(dir, roles{events.DefaultPrefix}.permissions)
	if len(errs) > 0 {
		t.Fatalf("the credentials directory: %v (the issuer's seed is no user)", errs)
	}

	for _, given := range []string{pub, issuerFile} {
		text, _, err := rolesCmd(t, "conf", "--dir", dir, "--auth-callout-issuer", given)
		if err != nil {
			t.Fatal(err)
		}
		opts := confOptions(t, text)
		ac := opts.AuthCallout
		if ac == nil || ac.Issuer != pub || ac.Account != "TOPOSCHED_AUTH" {
			t.Fatalf("auth_callout %+v, want issuer %s in account TOPOSCHED_AUTH", ac, pub)
		}
		// The callout's own user is its one auth user, its account the one
		// delegated: every other user signs in as before, and the block
		// stays the same when users are added (nats-server reloads no
		// changed auth_callout).
		if !slices.Equal(ac.AuthUsers, []string{creds.PublicKey(roleAuthCallout)}) || !slices.Equal(ac.AllowedAccounts, []string{"TOPOSCHED_AUTH"}) {
			t.Errorf("auth users %v, allowed accounts %v; want the responder's alone and TOPOSCHED_AUTH", ac.AuthUsers, ac.AllowedAccounts)
		}
		r := roles{events.DefaultPrefix}
		if len(opts.Nkeys) != len(creds.Roles()) {
			t.Fatalf("%d nkey users, want %d", len(opts.Nkeys), len(creds.Roles()))
		}
		for _, u := range opts.Nkeys {
			i := slices.IndexFunc(creds.Roles(), func(role string) bool { return creds.PublicKey(role) == u.Nkey })
			if i < 0 {
				t.Fatalf("user %s: of no seed", u.Nkey)
			}
			role := creds.Roles()[i]
			want, _ := r.permissions(role)
			if !samePermissions(want, u.Permissions) {
				t.Errorf("%s: permissions %+v, want %+v", role, u.Permissions, want)
			}
			wantAccount := "TOPOSCHED"
			if role == roleAuthCallout {
				wantAccount = "TOPOSCHED_AUTH"
			}
			if u.Account == nil || u.Account.Name != wantAccount {
				t.Errorf("%s: in account %v, want %s", role, u.Account, wantAccount)
			}
		}
	}

	// A tenant added: its user is added, the callout block the same.
	before, _, err := rolesCmd(t, "conf", "--dir", dir, "--auth-callout-issuer", pub)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := rolesCmd(t, "issue", "--dir", dir, "--tenant", "ads"); err != nil {
		t.Fatal(err)
	}
	after, _, err := rolesCmd(t, "conf", "--dir", dir, "--auth-callout-issuer", pub)
	if err != nil {
		t.Fatal(err)
	}
	if b, a := confOptions(t, before), confOptions(t, after); !reflect.DeepEqual(b.AuthCallout, a.AuthCallout) || len(a.Nkeys) != len(b.Nkeys)+1 {
		t.Errorf("a tenant added: auth_callout %+v -> %+v, %d -> %d users", b.AuthCallout, a.AuthCallout, len(b.Nkeys), len(a.Nkeys))
	}
	creds, _ = natsserver.ReadCredentials(dir, roles{events.DefaultPrefix}.permissions)

	// Without the flag the callout is off and its responder left out.
	text, warn, err := rolesCmd(t, "conf", "--dir", dir)
	if err != nil {
		t.Fatal(err)
	}
	if opts := confOptions(t, text); opts.AuthCallout != nil || len(opts.Nkeys) != len(creds.Roles())-1 {
		t.Fatalf("without --auth-callout-issuer: auth_callout %+v, %d users", opts.AuthCallout, len(opts.Nkeys))
	}
	if !strings.Contains(warn, "auth-callout.nk is left out") {
		t.Errorf("no warning that the responder is left out: %q", warn)
	}

	// A directory without the responder's seed, or password users: refused.
	bare := t.TempDir()
	if _, _, err := rolesCmd(t, "issue", "--dir", bare); err != nil {
		t.Fatal(err)
	}
	if _, _, err := rolesCmd(t, "conf", "--dir", bare, "--auth-callout-issuer", pub); err == nil || !strings.Contains(err.Error(), "auth-callout.nk") {
		t.Errorf("no responder's seed: %v", err)
	}
	if _, _, err := rolesCmd(t, "conf", "--passwords", "--auth-callout-issuer", pub); err == nil {
		t.Error("--passwords with --auth-callout-issuer accepted")
	}
	if _, _, err := rolesCmd(t, "conf", "--dir", dir, "--auth-callout-issuer", creds.PublicKey(roleLauncher)); err == nil {
		t.Error("a user's public key accepted as the issuer")
	}
	// Issued again, the issuer is kept.
	if _, _, err := rolesCmd(t, "issue", "--dir", dir, "--auth-callout"); err != nil {
		t.Fatal(err)
	}
	if again, err := authcallout.IssuerPublicKey(issuerFile); err != nil || again != pub {
		t.Fatalf("issuer after a second issue: %s %v, want %s", again, err, pub)
	}
}

// The auth callout's responder reads the requests and answers them, and
// may do nothing else: no event, no stream, no reply but to the servers.
func TestAuthCalloutRole(t *testing.T) {
	p, ok := roles{events.DefaultPrefix}.permissions(roleAuthCallout)
	if !ok {
		t.Fatal("no role auth-callout")
	}
	subj := events.NewSubjects(events.DefaultPrefix)
	for _, s := range []string{subj.Of(events.NameJobSubmitted), "$JS.API.INFO", authcallout.Subject, "_INBOX.x"} {
		if may(p, s) {
			t.Errorf("auth-callout may publish %s", s)
		}
	}
	if !may(p, "$SYS._INBOX.abcdef.12345") {
		t.Error("auth-callout may not answer the servers' requests")
	}
	if !slices.Equal(p.Subscribe.Allow, []string{authcallout.Subject}) {
		t.Errorf("auth-callout subscribes %v", p.Subscribe.Allow)
	}
}
