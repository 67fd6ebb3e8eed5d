package launcher

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"regexp"
	"slices"
	"strconv"
)

// Who a job's ranks run as.
//
// An agent running as root runs each rank as its job's user: the job's
// run_as, or Config.RunAsDefault for a job that names none, and only a user
// on Config.RunAsAllow. Without that list a root agent does not start: it
// would run every job's command as root, for anyone who can submit one
// (--run-as-allow root is the explicit way to allow that). The rank gets
// the user's uid, gid and supplementary groups; its shim keeps the agent's
// identity, to write into the state directory, where the rank writes only
// through the output descriptors it is given.
//
// An agent that does not run as root can run ranks only as itself: a job
// naming another user fails (launch_failed, field run_as). A list, where
// it is given, still says who may be run as, so it must hold the agent's
// own user for the jobs that name none.

// userName is the shape the jobs.submitted schema gives run_as.
var userName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.@-]{0,255}$`)

// account is a user ranks may run as.
type account struct {
	name     string
	uid, gid uint32
	groups   []uint32
	home     string
}

// credential is what a rank started as a runs with.
func (a *account) credential() *Credential {
	return &Credential{UID: a.uid, GID: a.gid, Groups: slices.Clone(a.groups)}
}

func accountOf(u *user.User) (*account, error) {
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: uid %q: %w", u.Username, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: gid %q: %w", u.Username, u.Gid, err)
	}
	a := &account{name: u.Username, uid: uint32(uid), gid: uint32(gid), home: u.HomeDir, groups: []uint32{}}
	ids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("user %s: groups: %w", u.Username, err)
	}
	for _, id := range ids {
		g, err := strconv.ParseUint(id, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("user %s: group id %q: %w", u.Username, id, err)
		}
		a.groups = append(a.groups, uint32(g))
	}
	return a, nil
}

// lookupAccount finds a user by name (os/user: the C library's NSS where
// built with cgo, /etc/passwd and /etc/group else).
func lookupAccount(name string) (*account, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, err
	}
	return accountOf(u)
}

// currentAccount is the agent's own user; one without a passwd entry (a
// container's uid) is named by its number.
func currentAccount() (*account, error) {
	uid := os.Geteuid()
	u, err := user.LookupId(strconv.Itoa(uid))
	var unknown user.UnknownUserIdError
	if errors.As(err, &unknown) {
		return &account{name: strconv.Itoa(uid), uid: uint32(uid), gid: uint32(os.Getegid()), groups: []uint32{}}, nil
	}
	if err != nil {
		return nil, err
	}
	return accountOf(u)
}

// CheckRunAs checks cfg's run_as settings against the user this process
// runs as, as New does: for a command to refuse them before it connects.
func CheckRunAs(cfg Config) error {
	self, err := currentAccount()
	if err != nil {
		return fmt.Errorf("the agent's own user: %w", err)
	}
	_, err = newRunAsPolicy(self, cfg.RunAsAllow, cfg.RunAsDefault, lookupAccount)
	return err
}

// runAsPolicy decides who a job's ranks run as.
type runAsPolicy struct {
	self *account
	// allow are the users ranks may run as; nil: no list.
	allow []string
	// def is the user of a job naming none; "" the agent's own.
	def    string
	lookup func(name string) (*account, error)
}

func (p *runAsPolicy) root() bool { return p.self.uid == 0 }

// newRunAsPolicy checks the agent's settings against its identity: the
// errors name the agent's flags, for whoever starts it.
func newRunAsPolicy(self *account, allow []string, def string, lookup func(string) (*account, error)) (*runAsPolicy, error) {
	p := &runAsPolicy{self: self, def: def, lookup: lookup}
	if len(allow) > 0 {
		p.allow = slices.Clone(allow)
	}
	for _, name := range p.allow {
		if !userName.MatchString(name) {
			return nil, fmt.Errorf("--run-as-allow: %s: not a user name", shown(name))
		}
	}
	if p.root() && p.allow == nil {
		return nil, errors.New("--run-as-allow: required for an agent running as root, which would otherwise run every job's ranks as root: " +
			"give the users jobs may run as (run_as), such as --run-as-allow alice,bob; --run-as-allow root lets ranks run as root")
	}
	if def == "" {
		return p, nil
	}
	if !userName.MatchString(def) {
		return nil, fmt.Errorf("--run-as-default: %s: not a user name", shown(def))
	}
	if p.allow != nil && !slices.Contains(p.allow, def) {
		return nil, fmt.Errorf("--run-as-default %s: not in --run-as-allow", def)
	}
	a, err := lookup(def)
	if err != nil {
		return nil, fmt.Errorf("--run-as-default %s: %w", def, err)
	}
	if !p.root() && a.uid != self.uid {
		return nil, fmt.Errorf("--run-as-default %s: this agent runs as %s, not root, and can run ranks only as itself", def, self.name)
	}
	return p, nil
}

// resolve is the account a job's ranks run as, nil for the agent's own
// (nothing to change); its errors are launchErrors of field run_as.
func (p *runAsPolicy) resolve(runAs string) (*account, error) {
	name := runAs
	if name == "" {
		name = p.def
	}
	if name == "" {
		if p.allow != nil && !slices.Contains(p.allow, p.self.name) {
			return nil, &launchError{field: "run_as", err: errors.New("the job names none, and this agent runs ranks only as the users it allows: name one"),
				detail: fmt.Sprintf("the agent's own user %s is not in --run-as-allow %v", p.self.name, p.allow)}
		}
		return nil, nil
	}
	if !userName.MatchString(name) {
		return nil, fieldErr("run_as", "%s: not a user name", shown(name))
	}
	if p.allow != nil && !slices.Contains(p.allow, name) {
		return nil, &launchError{field: "run_as", err: fmt.Errorf("%s: not a user this agent may run ranks as", name),
			detail: fmt.Sprintf("--run-as-allow %v", p.allow)}
	}
	a, err := p.lookup(name)
	var unknown user.UnknownUserError
	switch {
	case errors.As(err, &unknown):
		return nil, fieldErr("run_as", "%s: no such user on this node", name)
	case err != nil:
		return nil, &launchError{field: "run_as", err: fmt.Errorf("%s: the agent could not look the user up (the agent's log says why)", name), detail: err.Error()}
	case a.uid == p.self.uid:
		return nil, nil
	case !p.root():
		return nil, fieldErr("run_as", "%s: this agent does not run as root, so it runs ranks only as its own user", name)
	}
	return a, nil
}
