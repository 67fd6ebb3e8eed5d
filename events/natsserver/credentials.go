package natsserver

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Role is a user EnsureCredentials keeps a key for.
type Role struct {
	// Name is the role and the name of its seed file, <Name>.nk.
	Name string
	// Permissions bound what the role may publish and subscribe; nil
	// allows everything.
	Permissions *server.Permissions
}

// SeedFileSuffix ends the name of every seed file.
const SeedFileSuffix = ".nk"

// roleName is a role's shape: a lower-case kind, and for a node's or a
// tenant's role its name after a dash, escaped (RoleFor).
var roleName = regexp.MustCompile(`^[a-z][a-z0-9-]*(-[A-Za-z0-9_%-]+)?$`)

// maxRoleName keeps a seed file's name (role, SeedFileSuffix and the
// temporary file's decoration) within the 255 bytes file systems allow
// (events.MaxRoleName).
const maxRoleName = 200

// Credentials are nkey users whose seeds are kept in files, one per role,
// readable by their owner only. The server knows only the public keys; a
// client signs in with the seed file (nats.go's NkeyOptionFromSeed,
// topoctl --nats-nkey FILE, nats --nkey FILE).
type Credentials struct {
	// Dir holds the seed files.
	Dir   string
	users []credUser
}

type credUser struct {
	role    Role
	pub     string
	file    string
	created bool
}

// EnsureCredentials reads each role's seed from dir/<role>.nk, or
// generates a new user nkey and writes it there (mode 0600, dir 0700) if
// the file does not exist yet. A file or directory that others may read is
// made private again. Keys are never logged.
func EnsureCredentials(dir string, roles []Role) (*Credentials, error) {
	if len(roles) == 0 {
		return nil, errors.New("credentials: no roles")
	}
	if err := privateDir(dir); err != nil {
		return nil, err
	}
	c := &Credentials{Dir: dir}
	seen := map[string]bool{}
	for _, r := range roles {
		if !roleName.MatchString(r.Name) || len(r.Name) > maxRoleName || seen[r.Name] {
			return nil, fmt.Errorf("credentials: role %q: want a unique lower-case name", r.Name)
		}
		seen[r.Name] = true
		file := filepath.Join(dir, r.Name+SeedFileSuffix)
		pub, created, err := ensureSeed(file, r.Name, true)
		if err != nil {
			return nil, err
		}
		c.users = append(c.users, credUser{role: r, pub: pub, file: file, created: created})
	}
	return c, nil
}

func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("credentials dir %s: %w", dir, err)
	}
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("credentials dir %s: %w", dir, err)
	}
	if !st.IsDir() {
		return fmt.Errorf("credentials dir %s: not a directory", dir)
	}
	if st.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("credentials dir %s: make it private: %w", dir, err)
		}
	}
	return nil
}

// ensureSeed returns the public key of the seed in file, writing a new one
// first if the file does not exist and create is set.
func ensureSeed(file, role string, create bool) (pub string, created bool, err error) {
	st, err := os.Lstat(file)
	switch {
	case errors.Is(err, fs.ErrNotExist) && create:
		pub, err := writeSeed(file, role)
		return pub, true, err
	case err != nil:
		return "", false, fmt.Errorf("credentials %s: %w", file, err)
	case !st.Mode().IsRegular():
		return "", false, fmt.Errorf("credentials %s: not a regular file", file)
	}
	if st.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(file, 0o600); err != nil {
			return "", false, fmt.Errorf("credentials %s: make it private: %w", file, err)
		}
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return "", false, fmt.Errorf("credentials %s: %w", file, err)
	}
	defer clear(data)
	kp, err := nkeys.ParseDecoratedUserNKey(data)
	if err != nil {
		return "", false, fmt.Errorf("credentials %s: no user nkey seed in it (remove it to generate a new one): %w", file, err)
	}
	defer kp.Wipe()
	pub, err = kp.PublicKey()
	if err != nil {
		return "", false, fmt.Errorf("credentials %s: %w", file, err)
	}
	return pub, false, nil
}

// writeSeed generates a user nkey and writes its seed to file, through a
// private temporary file renamed into place.
func writeSeed(file, role string) (string, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", fmt.Errorf("credentials %s: generate an nkey: %w", file, err)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil {
		return "", fmt.Errorf("credentials %s: %w", file, err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return "", fmt.Errorf("credentials %s: %w", file, err)
	}
	defer clear(seed)
	body := fmt.Appendf(nil, "# toposched NATS user %q (public key %s): its nkey seed.\n"+
		"# Keep it secret: whoever holds it connects as %s.\n"+
		"# Use it with topoctl --nats-nkey FILE, toposched --nats-nkey FILE or nats --nkey FILE.\n", role, pub, role)
	body = append(append(body, seed...), '\n')
	defer clear(body)
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".tmp-*") // mode 0600
	if err != nil {
		return "", fmt.Errorf("credentials %s: %w", file, err)
	}
	_, werr := tmp.Write(body)
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		_ = os.Remove(tmp.Name()) // the write failed already; a stray temp file is harmless
		return "", fmt.Errorf("credentials %s: %w", file, err)
	}
	if err := os.Rename(tmp.Name(), file); err != nil {
		_ = os.Remove(tmp.Name()) // as above
		return "", fmt.Errorf("credentials %s: %w", file, err)
	}
	return pub, nil
}

// File is the seed file of a role, "" for an unknown role.
func (c *Credentials) File(role string) string {
	for _, u := range c.users {
		if u.role.Name == role {
			return u.file
		}
	}
	return ""
}

// Created lists the roles whose key EnsureCredentials generated (the
// others were read back from their files).
func (c *Credentials) Created() []string {
	var out []string
	for _, u := range c.users {
		if u.created {
			out = append(out, u.role.Name)
		}
	}
	return out
}

// Option is the connection option that signs in as role.
func (c *Credentials) Option(role string) (nats.Option, error) {
	file := c.File(role)
	if file == "" {
		return nil, fmt.Errorf("credentials: no role %q", role)
	}
	o, err := nats.NkeyOptionFromSeed(file)
	if err != nil {
		return nil, fmt.Errorf("credentials %s: %w", file, err)
	}
	return o, nil
}

// nkeyUsers are the server's users for these credentials.
func (c *Credentials) nkeyUsers() []*server.NkeyUser {
	out := make([]*server.NkeyUser, 0, len(c.users))
	for _, u := range c.users {
		out = append(out, &server.NkeyUser{Nkey: u.pub, Permissions: u.role.Permissions})
	}
	return out
}

// ReadCredentials reads every seed file in dir (<role>.nk) whose role
// permissions knows: permissions gives the role's permissions (nil: all),
// or ok false for a file that is no role of this deployment's, which is
// reported in errs and left out, as is a file that cannot be read. So a
// directory is the list of who may sign in: a file added is a user added,
// a file removed one removed (Server.SetCredentials). Files that others
// may read are made private again, as EnsureCredentials does.
func ReadCredentials(dir string, permissions func(role string) (perms *server.Permissions, ok bool)) (*Credentials, []error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, []error{fmt.Errorf("credentials dir %s: %w", dir, err)}
	}
	c := &Credentials{Dir: dir}
	var errs []error
	for _, e := range entries {
		role, ok := strings.CutSuffix(e.Name(), SeedFileSuffix)
		if !ok || strings.HasPrefix(e.Name(), ".") {
			continue // temporary files of writeSeed, and anything else
		}
		file := filepath.Join(dir, e.Name())
		perms, known := permissions(role)
		if !known || !roleName.MatchString(role) {
			errs = append(errs, fmt.Errorf("credentials %s: %q is no role of this deployment: not a user", file, role))
			continue
		}
		pub, _, err := ensureSeed(file, role, false)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		c.users = append(c.users, credUser{role: Role{Name: role, Permissions: perms}, pub: pub, file: file})
	}
	if len(c.users) == 0 {
		errs = append(errs, fmt.Errorf("credentials dir %s: no seed file of a known role", dir))
		return nil, errs
	}
	return c, errs
}

// Roles lists the roles, in the order read.
func (c *Credentials) Roles() []string {
	out := make([]string, len(c.users))
	for i, u := range c.users {
		out[i] = u.role.Name
	}
	return out
}

// Equal reports whether c and o let in the same users with the same roles
// (not the same permissions: those follow from the roles).
func (c *Credentials) Equal(o *Credentials) bool {
	key := func(c *Credentials) []string {
		var out []string
		for _, u := range c.users {
			out = append(out, u.role.Name+"="+u.pub)
		}
		slices.Sort(out)
		return out
	}
	return slices.Equal(key(c), key(o))
}

// PublicKey is the public nkey of a role's user, "" for an unknown role.
func (c *Credentials) PublicKey(role string) string {
	for _, u := range c.users {
		if u.role.Name == role {
			return u.pub
		}
	}
	return ""
}
