package natsflags

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/spf13/pflag"
)

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		f       Flags
		wantErr string
	}{
		{"none", Flags{}, ""},
		{"user", Flags{User: "u", Password: "p"}, ""},
		{"tls", Flags{TLSCA: file, TLSCert: file, TLSKey: file}, ""},
		{"two credentials", Flags{Creds: file, User: "u"}, "choose one"},
		{"cert without key", Flags{TLSCert: file}, "give both"},
		{"missing file", Flags{TLSCA: filepath.Join(dir, "nope")}, "--nats-tls-ca"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.f.Validate()
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestRegisterReadsEnvironment(t *testing.T) {
	t.Setenv("TOPOSCHED_NATS_USER", "launcher")
	t.Setenv("TOPOSCHED_NATS_PASSWORD", "secret")
	var f Flags
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	f.Register(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	opts, err := f.Options()
	if err != nil || f.User != "launcher" || len(opts) != 1 {
		t.Fatalf("user %q, %d options, err %v", f.User, len(opts), err)
	}
}

// Without credentials given, a command signs in with its role's seed in
// serve's credentials directory; where there is none, a refused connection
// says which file was looked for.
func TestDefaultSeed(t *testing.T) {
	data := t.TempDir()
	t.Setenv("TOPOSCHED_DATA_DIR", data)
	f := Flags{Role: "agent-n1"}
	if f.DefaultSeed() != "" {
		t.Fatal("a seed found in an empty directory")
	}
	refused := fmt.Errorf("connect: %w", nats.ErrAuthorization)
	if err := f.Explain(refused); !strings.Contains(err.Error(), filepath.Join(data, "credentials", "agent-n1.nk")) || !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("explained: %v, want the path looked for", err)
	}
	if err := (&Flags{Role: "agent-n1", NKey: "x"}).Explain(refused); err != refused { //nolint:errorlint // the same error value, not one wrapping it
		t.Fatalf("with credentials given: %v, want the error as it was", err)
	}
	if err := os.MkdirAll(CredentialsDir(data), 0o700); err != nil {
		t.Fatal(err)
	}
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	if err := os.WriteFile(filepath.Join(CredentialsDir(data), "agent-n1.nk"), seed, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := f.DefaultSeed(); got != filepath.Join(data, "credentials", "agent-n1.nk") {
		t.Fatalf("seed %q", got)
	}
	if opts, err := f.Options(); err != nil || len(opts) != 1 {
		t.Fatalf("%d options, %v; want the seed's", len(opts), err)
	}
}

// --nats-token-file sends the file's token at each connect, read anew each
// time (a projected ServiceAccount token is rewritten by the kubelet), and
// is one credential among the others; a seed in the data dir is then not
// used.
func TestTokenFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("old-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := &server.Options{Host: "127.0.0.1", Port: -1, Authorization: "new-token", NoLog: true, NoSigs: true}
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}

	// The agent's seed where it would look without a token file.
	data := t.TempDir()
	t.Setenv("TOPOSCHED_DATA_DIR", data)
	if err := os.MkdirAll(CredentialsDir(data), 0o700); err != nil {
		t.Fatal(err)
	}
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	if err := os.WriteFile(filepath.Join(CredentialsDir(data), "agent-n1.nk"), seed, 0o600); err != nil {
		t.Fatal(err)
	}
	f := Flags{Role: "agent-n1"}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	f.RegisterTokenFile(fs)
	if err := fs.Parse([]string{"--nats-token-file", file}); err != nil {
		t.Fatal(err)
	}
	if f.DefaultSeed() != "" {
		t.Fatal("a default seed with a token file")
	}
	nopts, err := f.Options()
	if err != nil {
		t.Fatal(err)
	}
	_, err = nats.Connect(ns.ClientURL(), nopts...)
	if !errors.Is(err, nats.ErrAuthorization) || !strings.Contains(f.Explain(err).Error(), file) {
		t.Fatalf("the old token: %v (explained: %v), want refused, naming the token file", err, f.Explain(err))
	}
	if err := os.WriteFile(file, []byte("new-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(ns.ClientURL(), nopts...)
	if err != nil {
		t.Fatalf("the token rewritten, with the same options: %v", err)
	}
	nc.Close()

	for _, tc := range []struct {
		f       Flags
		wantErr string
	}{
		{Flags{TokenFile: file, NKey: file}, "choose one"},
		{Flags{TokenFile: filepath.Join(dir, "nope")}, "--nats-token-file"},
	} {
		if err := tc.f.Validate(); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%+v: %v, want %q", tc.f, err, tc.wantErr)
		}
	}
}
