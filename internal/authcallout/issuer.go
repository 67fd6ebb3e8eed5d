package authcallout

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nats-io/nkeys"
)

// IssuerFile is the issuer seed's file name in a credentials directory.
// It does not end in .nk: it is an account key that signs users, not a
// user who may sign in, and the directory's .nk files are its users.
const IssuerFile = "auth-callout-issuer.seed"

// EnsureIssuer returns the public key of the account seed in file,
// generating one and writing it there first (mode 0600, through a private
// temporary file) when the file does not exist. The seed is never logged.
func EnsureIssuer(file string) (pub string, created bool, err error) {
	kp, err := ReadIssuer(file)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		pub, err := writeIssuer(file)
		return pub, err == nil, err
	case err != nil:
		return "", false, err
	}
	defer kp.Wipe()
	pub, err = kp.PublicKey()
	if err != nil {
		return "", false, fmt.Errorf("auth callout issuer %s: %w", file, err)
	}
	return pub, false, nil
}

// ReadIssuer reads the account seed in file: the key the responder signs
// user JWTs with, whose public key is the servers' auth_callout issuer.
func ReadIssuer(file string) (nkeys.KeyPair, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("auth callout issuer %s: %w", file, err)
	}
	defer clear(data)
	seed, err := nkeys.ParseDecoratedNKey(data)
	if err != nil {
		return nil, fmt.Errorf("auth callout issuer %s: no nkey seed in it: %w", file, err)
	}
	pub, err := seed.PublicKey()
	if err != nil {
		seed.Wipe()
		return nil, fmt.Errorf("auth callout issuer %s: %w", file, err)
	}
	if !nkeys.IsValidPublicAccountKey(pub) {
		seed.Wipe()
		return nil, fmt.Errorf("auth callout issuer %s: the seed of %s is no account key (want a seed starting SA)", file, pub)
	}
	return seed, nil
}

// IssuerPublicKey is the issuer's public key given as itself (A...) or as
// its seed file.
func IssuerPublicKey(keyOrFile string) (string, error) {
	if nkeys.IsValidPublicAccountKey(keyOrFile) {
		return keyOrFile, nil
	}
	kp, err := ReadIssuer(keyOrFile)
	if err != nil {
		return "", fmt.Errorf("%w (want a public account key, A..., or the issuer's seed file)", err)
	}
	defer kp.Wipe()
	return kp.PublicKey()
}

func writeIssuer(file string) (string, error) {
	kp, err := nkeys.CreateAccount()
	if err != nil {
		return "", fmt.Errorf("auth callout issuer %s: generate an account key: %w", file, err)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil {
		return "", fmt.Errorf("auth callout issuer %s: %w", file, err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return "", fmt.Errorf("auth callout issuer %s: %w", file, err)
	}
	defer clear(seed)
	body := fmt.Appendf(nil, "# toposched's NATS auth callout issuer (public account key %s): its seed.\n"+
		"# Keep it secret: whoever holds it signs in as any node's agent.\n"+
		"# Give it to toposched kube (--auth-callout-issuer-seed) and to no one else.\n", pub)
	body = append(append(body, seed...), '\n')
	defer clear(body)
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return "", fmt.Errorf("auth callout issuer %s: %w", file, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".tmp-*") // mode 0600
	if err != nil {
		return "", fmt.Errorf("auth callout issuer %s: %w", file, err)
	}
	_, werr := tmp.Write(body)
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		_ = os.Remove(tmp.Name()) // the write failed already; a stray temp file is harmless
		return "", fmt.Errorf("auth callout issuer %s: %w", file, err)
	}
	// Link, not rename: a file written meanwhile by another issue is kept.
	if err := os.Link(tmp.Name(), file); err != nil {
		_ = os.Remove(tmp.Name()) // as above
		return "", fmt.Errorf("auth callout issuer %s: %w", file, err)
	}
	_ = os.Remove(tmp.Name()) // the link holds the seed
	return pub, nil
}
