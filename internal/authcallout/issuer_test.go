package authcallout

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
)

// The issuer seed is made once, private, and read back the same; a user
// seed is no issuer; roles conf takes the public key or the seed's file.
func TestEnsureIssuer(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "creds")
	file := filepath.Join(dir, IssuerFile)
	pub, created, err := EnsureIssuer(file)
	if err != nil || !created || !nkeys.IsValidPublicAccountKey(pub) {
		t.Fatalf("first: %s %v %v", pub, created, err)
	}
	st, err := os.Stat(file)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("seed file mode %v, %v; want 0600", st.Mode(), err)
	}
	again, created, err := EnsureIssuer(file)
	if err != nil || created || again != pub {
		t.Fatalf("second: %s %v %v; want %s kept", again, created, err, pub)
	}
	if got, err := IssuerPublicKey(file); err != nil || got != pub {
		t.Fatalf("public key of the file: %s %v", got, err)
	}
	if got, err := IssuerPublicKey(pub); err != nil || got != pub {
		t.Fatalf("public key given: %s %v", got, err)
	}
	body, _ := os.ReadFile(file)
	if !strings.Contains(string(body), pub) {
		t.Fatalf("the seed file does not name its public key:\n%s", body)
	}

	user, _ := nkeys.CreateUser()
	seed, _ := user.Seed()
	userFile := filepath.Join(dir, "user.nk")
	if err := os.WriteFile(userFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := EnsureIssuer(userFile); err == nil || !strings.Contains(err.Error(), "no account key") {
		t.Fatalf("a user seed as issuer: %v", err)
	}
	userPub, _ := user.PublicKey()
	if _, err := IssuerPublicKey(userPub); err == nil {
		t.Fatal("a user's public key taken as the issuer")
	}
}
