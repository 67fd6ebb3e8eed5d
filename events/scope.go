package events

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
)

// Scopes: who may publish an event, written into its subject so that NATS
// permissions can allow each identity its own part and nothing more. NATS
// cannot read a body, and JetStream stores no trustworthy sender, so the
// subject is the one place where the server itself checks who speaks for
// whom; the services then check that the body agrees with the subject
// (CheckScope) and, where it takes their state, that the scope may act on
// the job it names (a tenant's own job, the node of rank 0).
//
//   - Node-scoped events (NodeScoped) end in their node's token:
//     <prefix>.runtime.ranks_exited.<node>. Only that node's agent
//     identity, and the services, may publish them.
//   - Identity-scoped events (IdentityScoped: jobs.submitted,
//     jobs.finished, jobs.migration_accepted, runtime.telemetry) are
//     published bare by the services and by administrators
//     (<prefix>.jobs.finished), or under a tenant
//     (<prefix>.jobs.finished.tenant.<tenant>) or a node
//     (<prefix>.jobs.finished.node.<node>). A tenant's users may publish
//     only under their tenant, a node's agent only under its node.
//
// Consumers of an identity-scoped event filter on both forms
// (Subjects.Filters).

// CodeNotPermitted is the reason code of a request refused because its
// sender's scope may not act on the job it names (another tenant's job, a
// job whose rank 0 runs on another node).
const CodeNotPermitted = "not_permitted"

// ScopeKind says whose part an identity-scoped event is.
type ScopeKind string

// The scope kinds. The zero kind is the bare subject: the services'.
const (
	ScopeNone   ScopeKind = ""
	ScopeTenant ScopeKind = "tenant"
	ScopeNode   ScopeKind = "node"
)

// Scope is the identity an event was published under, as its subject says.
type Scope struct {
	Kind ScopeKind
	// Name is the tenant or the node; "" with ScopeNone.
	Name string
}

// TenantScope is the scope of a tenant's users; "" is no scope.
func TenantScope(tenant string) Scope {
	if tenant == "" {
		return Scope{}
	}
	return Scope{Kind: ScopeTenant, Name: tenant}
}

// NodeScope is the scope of a node's agent; "" is no scope.
func NodeScope(node string) Scope {
	if node == "" {
		return Scope{}
	}
	return Scope{Kind: ScopeNode, Name: node}
}

// IsZero reports the bare subject's scope: the services'.
func (s Scope) IsZero() bool { return s.Kind == ScopeNone }

func (s Scope) String() string {
	if s.IsZero() {
		return "the services"
	}
	return string(s.Kind) + " " + s.Name
}

// IdentityScoped reports whether the event may travel under a tenant's or
// a node's scope: what users and agents say about jobs.
func (n Name) IdentityScoped() bool {
	switch n {
	case NameJobSubmitted, NameJobFinished, NameJobMigrationAccepted, NameRuntimeTelemetry:
		return true
	}
	return false
}

// Scoped is the subject of an event under scope: the bare subject for the
// services, else the scope's tokens after it. A node-scoped event's scope
// is its node, whatever the kind given.
func (s Subjects) Scoped(n Name, scope Scope) string {
	switch {
	case n.NodeScoped():
		return s.ForNode(n, scope.Name)
	case scope.IsZero() || !n.IdentityScoped():
		return s.Prefix + "." + string(n)
	}
	return s.Prefix + "." + string(n) + "." + string(scope.Kind) + "." + NodeToken(scope.Name)
}

// Filters are the subjects a consumer of the named events filters on: an
// identity-scoped event's bare subject and every scope under it.
func (s Subjects) Filters(names ...Name) []string {
	out := make([]string, 0, len(names)+2)
	for _, n := range names {
		out = append(out, s.Of(n))
		if n.IdentityScoped() {
			out = append(out, s.Of(n)+".>")
		}
	}
	return out
}

// SubjectError is a subject whose scope tokens do not fit its event.
type SubjectError struct {
	Subject string
	Reason  string
}

func (e *SubjectError) Error() string { return "subject " + e.Subject + ": " + e.Reason }

// ScopeOfSubject reads the scope of an event of name n from its subject.
// A subject whose scope tokens do not fit the event (a jobs.submitted
// under a node, a scope kind toposched does not know, a node-scoped event
// without its node) is a *SubjectError.
func (s Subjects) ScopeOfSubject(n Name, subject string) (Scope, error) {
	bad := func(format string, args ...any) (Scope, error) {
		return Scope{}, &SubjectError{Subject: subject, Reason: fmt.Sprintf(format, args...)}
	}
	rest, ok := strings.CutPrefix(subject, s.Prefix+"."+string(n))
	if !ok {
		return bad("not a subject of %s", n)
	}
	if rest == "" {
		if n.NodeScoped() {
			return bad("%s names its node in the subject's last token", n)
		}
		return Scope{}, nil
	}
	rest, ok = strings.CutPrefix(rest, ".")
	if !ok {
		return bad("not a subject of %s", n)
	}
	if n.NodeScoped() {
		node, err := NodeFromToken(rest)
		if err != nil || strings.Contains(rest, ".") || node == "" {
			return bad("%s takes one node token after its name", n)
		}
		return NodeScope(node), nil
	}
	if !n.IdentityScoped() {
		return bad("%s takes no scope", n)
	}
	kind, tok, ok := strings.Cut(rest, ".")
	name, err := NodeFromToken(tok)
	if !ok || err != nil || name == "" || strings.Contains(tok, ".") {
		return bad("a scope is %s.tenant.<tenant> or %s.node.<node>", n, n)
	}
	switch k := ScopeKind(kind); {
	case k == ScopeTenant:
		return TenantScope(name), nil
	case k == ScopeNode && n.AgentScoped():
		return NodeScope(name), nil
	}
	if n.AgentScoped() {
		return bad("%s is published bare, under tenant.<tenant> or under node.<node>, not %q", n, kind)
	}
	return bad("%s is published bare or under tenant.<tenant>, not %q", n, kind)
}

// AgentScoped reports whether a node's agent may publish the
// identity-scoped event under its node: it finishes the jobs whose rank 0
// it runs and reports their telemetry; it submits and accepts nothing.
func (n Name) AgentScoped() bool { return n == NameJobFinished || n == NameRuntimeTelemetry }

// ScopeError is an event whose body does not agree with the scope of its
// subject: a node's report about another node, a tenant's job naming
// another tenant. The sender may be answered; the event is not applied.
type ScopeError struct {
	Name  Name
	Scope Scope
	// Field is the body's field that disagrees, and Value what it says.
	Field string
	Value string
}

func (e *ScopeError) Error() string {
	return fmt.Sprintf("%s: %q, but the event was published under %s's subject", e.Field, e.Value, e.Scope)
}

// ScopeOf is the scope an event's own body gives it, when it gives one: a
// node-scoped event's node, a jobs.submitted's tenant (a job without a
// tenant is the services'). For the other identity-scoped events the
// publisher's identity decides (bus.WithScope).
func ScopeOf(v any) (Scope, bool) {
	switch e := v.(type) {
	case *TopologyNode:
		return NodeScope(e.Name), true
	case *TopologyHealth:
		return NodeScope(e.Node), true
	case *TopologyHeld:
		return NodeScope(e.Node), true
	case *AgentHeartbeat:
		return NodeScope(e.Node), true
	case *RanksExited:
		return NodeScope(e.Node), true
	case *RankLog:
		return NodeScope(e.Node), true
	case *JobSubmitted:
		return TenantScope(e.Tenant), true
	}
	return Scope{}, false
}

// CheckScopeOfBody is CheckScope for a body not decoded yet: it reads the
// one field that names the body's node or tenant, not the whole event (a
// rebuild reads thousands of node descriptions). A body that is not JSON
// is left to its reader's decoding.
func CheckScopeOfBody(name Name, scope Scope, body []byte) error {
	if scope.IsZero() || (!name.NodeScoped() && name != NameJobSubmitted) {
		return nil
	}
	var probe struct {
		Name   string `json:"name"`
		Node   string `json:"node"`
		Tenant string `json:"tenant"`
	}
	if json.Unmarshal(body, &probe) != nil {
		return nil
	}
	var v any
	switch name {
	case NameTopologyNode:
		v = &TopologyNode{Name: probe.Name}
	case NameTopologyHealth:
		v = &TopologyHealth{Node: probe.Node}
	case NameTopologyHeld:
		v = &TopologyHeld{Node: probe.Node}
	case NameAgentHeartbeat:
		v = &AgentHeartbeat{Node: probe.Node}
	case NameRanksExited:
		v = &RanksExited{Node: probe.Node}
	case NameRankLog:
		v = &RankLog{Node: probe.Node}
	case NameJobSubmitted:
		v = &JobSubmitted{Tenant: probe.Tenant}
	default:
		return nil
	}
	return CheckScope(scope, v)
}

// CheckScope reports whether a decoded event's body agrees with the scope
// its subject gave: a node-scoped event's node (a topology.node's name) is
// the subject's node, and a jobs.submitted under a tenant is that tenant's
// job. What depends on state (whose job a finish names) is for the service
// that holds it. v is a pointer to the event's type.
func CheckScope(scope Scope, v any) error {
	name, err := NameOf(v)
	if err != nil {
		return err
	}
	own, ok := ScopeOf(v)
	if !ok || own == scope || scope.IsZero() {
		// A bare subject is the services' (and administrators'): they
		// speak for every node and submit for every tenant.
		return nil
	}
	field := "node"
	switch name {
	case NameTopologyNode:
		field = "name"
	case NameJobSubmitted:
		field = "tenant"
	}
	return &ScopeError{Name: name, Scope: scope, Field: field, Value: own.Name}
}

// MaxRoleName bounds a role's name: a seed file is named after it
// (<role>.nk), and file systems allow 255 bytes.
const MaxRoleName = 200

// roleKinds are the roles of a node's agent and of a tenant's users.
var roleKinds = map[ScopeKind]string{ScopeNode: "agent", ScopeTenant: "tenant"}

// Role is the NATS user role of a scope's identity (docs/security.md): an
// agent-<node> or a tenant-<tenant>, the name escaped so that every name
// has one role and every role one name (no two nodes share a seed file),
// and the role is a file name: every byte but letters, digits, '_' and
// '-' is %XX.
func (s Scope) Role() (string, error) {
	kind, ok := roleKinds[s.Kind]
	if !ok || s.Name == "" {
		return "", fmt.Errorf("%s: no role of its own", s)
	}
	var b strings.Builder
	b.WriteString(kind)
	b.WriteByte('-')
	for i := 0; i < len(s.Name); i++ {
		c := s.Name[i]
		if c == '_' || c == '-' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	if b.Len() > MaxRoleName {
		return "", fmt.Errorf("%s: the name is too long for a role (%d bytes escaped, at most %d)", s, b.Len(), MaxRoleName)
	}
	return b.String(), nil
}

// ScopeOfRole is Role's inverse: the scope of an agent-<node> or a
// tenant-<tenant> role, ok false for any other (operator, launcher, or a
// spelling Role does not write).
func ScopeOfRole(role string) (Scope, bool) {
	for kind, prefix := range roleKinds {
		esc, ok := strings.CutPrefix(role, prefix+"-")
		if !ok {
			continue
		}
		name, err := url.PathUnescape(esc)
		if err != nil {
			return Scope{}, false
		}
		s := Scope{Kind: kind, Name: name}
		if again, err := s.Role(); err != nil || again != role {
			return Scope{}, false
		}
		return s, true
	}
	return Scope{}, false
}
