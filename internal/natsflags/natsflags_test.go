package natsflags

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
