// Package natsflags holds the command-line flags that say how a toposched
// binary authenticates to NATS and secures the connection: credentials
// (a .creds file, an nkey seed, or a user and password; for a node's agent
// also a token file, its pod's Kubernetes ServiceAccount token) and TLS (a
// CA to trust, a client certificate for mutual TLS). toposched and topoctl
// register the same flags, so a deployment configures both the same way.
package natsflags

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
)

// Flags are the connection's security settings.
type Flags struct {
	Creds    string // a NATS .creds file (JWT and nkey seed)
	NKey     string // a file holding an nkey seed (SU...)
	User     string
	Password string
	TLSCA    string // PEM CA bundle the server's certificate must chain to
	TLSCert  string // client certificate (mutual TLS)
	TLSKey   string // its key
	// TokenFile holds a token sent at each connect, read anew each time:
	// a projected ServiceAccount token, which the kubelet rewrites before
	// it expires (internal/authcallout checks it).
	TokenFile string
	// Role is the role whose seed file in CredentialsDir signs in when
	// no credentials are given: what toposched serve generates for this
	// host (launcher for topoctl, agent-<node> for a node's agent).
	Role string
}

// DefaultDataDir is toposched serve's data directory unless
// TOPOSCHED_DATA_DIR or --data-dir says otherwise.
const DefaultDataDir = "toposched-data"

// DataDir is serve's data directory as this environment has it:
// TOPOSCHED_DATA_DIR, else DefaultDataDir.
func DataDir() string {
	if d := os.Getenv("TOPOSCHED_DATA_DIR"); d != "" {
		return d
	}
	return DefaultDataDir
}

// CredentialsDir is where serve keeps the seed files of its users, in its
// data directory.
func CredentialsDir(dataDir string) string { return filepath.Join(dataDir, "credentials") }

// DefaultSeed is the seed file a command signs in with when no credentials
// are given: its Role's in serve's credentials directory, "" when there is
// none (a server that needs none, or another host's).
func (f *Flags) DefaultSeed() string {
	p := f.seedPath()
	if p == "" {
		return ""
	}
	if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() {
		return ""
	}
	return p
}

func (f *Flags) seedPath() string {
	if f.Role == "" || f.TokenFile != "" {
		return ""
	}
	return filepath.Join(CredentialsDir(DataDir()), f.Role+".nk")
}

// Explain adds to a connection error what the flags tried, where the server
// refused a client without credentials: which seed file was looked for and
// not found.
func (f *Flags) Explain(err error) error {
	if err == nil || !errors.Is(err, nats.ErrAuthorization) || f.Creds != "" || f.NKey != "" || f.User != "" {
		return err
	}
	if f.TokenFile != "" {
		return fmt.Errorf("%w (signed in with the token of %s: the servers' auth callout, toposched kube, logs why it refused it)", err, f.TokenFile)
	}
	p := f.seedPath()
	if p == "" || f.DefaultSeed() != "" {
		return err
	}
	return fmt.Errorf("%w (no credentials given, and no %s seed at %s: toposched roles issue writes it, TOPOSCHED_DATA_DIR says where serve keeps it)", err, f.Role, p)
}

// Register adds the flags to fs. Defaults come from the environment
// (TOPOSCHED_NATS_CREDS, _NKEY, _USER, _PASSWORD, _TLS_CA, _TLS_CERT,
// _TLS_KEY), so that a password need not be on a command line.
func (f *Flags) Register(fs *pflag.FlagSet) {
	fs.StringVar(&f.Creds, "nats-creds", os.Getenv("TOPOSCHED_NATS_CREDS"), "NATS credentials file (.creds: JWT and nkey seed) (env TOPOSCHED_NATS_CREDS)")
	fs.StringVar(&f.NKey, "nats-nkey", os.Getenv("TOPOSCHED_NATS_NKEY"), "file holding an nkey seed to sign in with (env TOPOSCHED_NATS_NKEY)")
	fs.StringVar(&f.User, "nats-user", os.Getenv("TOPOSCHED_NATS_USER"), "NATS user name (env TOPOSCHED_NATS_USER); the password comes from TOPOSCHED_NATS_PASSWORD")
	fs.StringVar(&f.Password, "nats-password", "", "NATS password; prefer the environment variable TOPOSCHED_NATS_PASSWORD")
	fs.StringVar(&f.TLSCA, "nats-tls-ca", os.Getenv("TOPOSCHED_NATS_TLS_CA"), "PEM CA file the NATS server's certificate must chain to; turns TLS on (env TOPOSCHED_NATS_TLS_CA)")
	fs.StringVar(&f.TLSCert, "nats-tls-cert", os.Getenv("TOPOSCHED_NATS_TLS_CERT"), "client certificate for mutual TLS (env TOPOSCHED_NATS_TLS_CERT)")
	fs.StringVar(&f.TLSKey, "nats-tls-key", os.Getenv("TOPOSCHED_NATS_TLS_KEY"), "key of --nats-tls-cert (env TOPOSCHED_NATS_TLS_KEY)")
}

// RegisterTokenFile adds --nats-token-file to fs (default
// TOPOSCHED_NATS_TOKEN_FILE): the node agent's, which alone signs in by
// token.
func (f *Flags) RegisterTokenFile(fs *pflag.FlagSet) {
	fs.StringVar(&f.TokenFile, "nats-token-file", os.Getenv("TOPOSCHED_NATS_TOKEN_FILE"),
		"file holding a token to sign in with, read anew at each connect: the pod's projected Kubernetes ServiceAccount token, "+
			"which the servers' auth callout (toposched kube) turns into this node's agent role (env TOPOSCHED_NATS_TOKEN_FILE)")
}

// Validate reports every inconsistent combination at once.
func (f *Flags) Validate() error {
	var errs []error
	n := 0
	for _, set := range []bool{f.Creds != "", f.NKey != "", f.User != "", f.TokenFile != ""} {
		if set {
			n++
		}
	}
	if n > 1 {
		errs = append(errs, errors.New("--nats-creds, --nats-nkey, --nats-user and --nats-token-file: choose one"))
	}
	if (f.TLSCert == "") != (f.TLSKey == "") {
		errs = append(errs, errors.New("--nats-tls-cert and --nats-tls-key: give both or neither"))
	}
	for flag, path := range map[string]string{"--nats-creds": f.Creds, "--nats-nkey": f.NKey, "--nats-token-file": f.TokenFile,
		"--nats-tls-ca": f.TLSCA, "--nats-tls-cert": f.TLSCert, "--nats-tls-key": f.TLSKey} {
		if path == "" {
			continue
		}
		if _, err := os.Stat(path); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", flag, err))
		}
	}
	return errors.Join(errs...)
}

// Options are the nats.go options the flags ask for.
func (f *Flags) Options() ([]nats.Option, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	var opts []nats.Option
	switch {
	case f.Creds != "":
		opts = append(opts, nats.UserCredentials(f.Creds))
	case f.NKey != "":
		o, err := nats.NkeyOptionFromSeed(f.NKey)
		if err != nil {
			return nil, fmt.Errorf("--nats-nkey %s: %w", f.NKey, err)
		}
		opts = append(opts, o)
	case f.User != "":
		pw := f.Password
		if pw == "" {
			pw = os.Getenv("TOPOSCHED_NATS_PASSWORD")
		}
		opts = append(opts, nats.UserInfo(f.User, pw))
	case f.TokenFile != "":
		file := f.TokenFile
		opts = append(opts, nats.TokenHandler(func() string { return readToken(file) }),
			// The token is read again at each reconnect, so a refusal
			// (the callout not answering yet, a token not yet refreshed)
			// is worth retrying, not the end of the connection.
			nats.IgnoreAuthErrorAbort())
	default:
		if seed := f.DefaultSeed(); seed != "" {
			o, err := nats.NkeyOptionFromSeed(seed)
			if err != nil {
				return nil, fmt.Errorf("%s (the %s credentials serve generated): %w", seed, f.Role, err)
			}
			opts = append(opts, o)
		}
	}
	if f.TLSCA != "" {
		opts = append(opts, nats.RootCAs(f.TLSCA))
	}
	if f.TLSCert != "" {
		opts = append(opts, nats.ClientCert(f.TLSCert, f.TLSKey))
	}
	return opts, nil
}

// readToken is the token in file, without surrounding white space. A file
// that cannot be read gives no token: the server refuses the connection,
// and the next reconnect reads the file again.
func readToken(file string) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
