package events

import (
	"errors"
	"testing"
)

func TestScopedSubjectsRoundTrip(t *testing.T) {
	s := NewSubjects("")
	scopes := []Scope{{}, TenantScope("research"), TenantScope("a.b*c>d e%"), NodeScope("gpu-001"), NodeScope("gpu.rack1")}
	for _, n := range Catalogue {
		for _, scope := range scopes {
			switch {
			case n.NodeScoped() && scope.IsZero():
				continue // a node's event always names its node
			case n.NodeScoped():
				scope = NodeScope(scope.Name)
			case !n.IdentityScoped(), scope.Kind == ScopeNode && !n.AgentScoped():
				scope = Scope{}
			}
			subject := s.Scoped(n, scope)
			got, err := s.ScopeOfSubject(n, subject)
			if err != nil || got != scope {
				t.Errorf("%s under %v: subject %s reads back as %v, %v", n, scope, subject, got, err)
			}
			if name, ok := s.NameOfSubject(subject); !ok || name != n {
				t.Errorf("subject %s: name %q, %v; want %s", subject, name, ok, n)
			}
		}
	}
}

func TestScopeOfSubjectRefuses(t *testing.T) {
	s := NewSubjects("")
	for _, tc := range []struct {
		name    Name
		subject string
	}{
		{NameJobSubmitted, "toposched.jobs.submitted.node.gpu-001"}, // an agent submits nothing
		{NameJobSubmitted, "toposched.jobs.submitted.tenant"},
		{NameJobSubmitted, "toposched.jobs.submitted.tenant."},
		{NameJobSubmitted, "toposched.jobs.submitted.team.research"},
		{NameJobSubmitted, "toposched.jobs.submitted.tenant.a.b"},
		{NameJobFinished, "toposched.jobs.finished.user.alice"},
		{NameJobMigrationAccepted, "toposched.jobs.migration_accepted.node.gpu-001"},
		{NameJobFinished, "toposched.jobs.finishedx"},
		{NamePlacementDecided, "toposched.placement.decided.tenant.research"}, // placement's alone
		{NameRanksExited, "toposched.runtime.ranks_exited"},                   // no node
		{NameRanksExited, "toposched.runtime.ranks_exited.a.b"},
		{NameAgentHeartbeat, "toposched.agent.heartbeat.%zz"},
	} {
		_, err := s.ScopeOfSubject(tc.name, tc.subject)
		var se *SubjectError
		if !errors.As(err, &se) {
			t.Errorf("%s on %s: err %v, want a *SubjectError", tc.name, tc.subject, err)
		}
	}
}

func TestFiltersCoverEveryScope(t *testing.T) {
	s := NewSubjects("")
	got := s.Filters(NameJobFinished, NamePlacementDecided, NameRanksExited)
	want := []string{"toposched.jobs.finished", "toposched.jobs.finished.>", "toposched.placement.decided", "toposched.runtime.ranks_exited.*"}
	if len(got) != len(want) {
		t.Fatalf("filters %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("filters %v, want %v", got, want)
		}
	}
}

func TestCheckScope(t *testing.T) {
	for _, tc := range []struct {
		name  string
		scope Scope
		v     any
		field string // "" when it agrees
	}{
		{"own heartbeat", NodeScope("n1"), &AgentHeartbeat{Node: "n1"}, ""},
		{"another node's heartbeat", NodeScope("n1"), &AgentHeartbeat{Node: "n2"}, "node"},
		{"another node's exit", NodeScope("n1"), &RanksExited{JobID: "j", Node: "n2"}, "node"},
		{"another node's log", NodeScope("n1"), &RankLog{JobID: "j", Node: "n2"}, "node"},
		{"another node's description", NodeScope("n1"), &TopologyNode{Name: "n2"}, "name"},
		{"another node's health", NodeScope("n1"), &TopologyHealth{Node: "n2"}, "node"},
		{"own tenant's job", TenantScope("a"), &JobSubmitted{JobID: "j", Tenant: "a"}, ""},
		{"another tenant's job", TenantScope("a"), &JobSubmitted{JobID: "j", Tenant: "b"}, "tenant"},
		{"a tenant's job without tenant", TenantScope("a"), &JobSubmitted{JobID: "j"}, "tenant"},
		{"the services submit for anyone", Scope{}, &JobSubmitted{JobID: "j", Tenant: "b"}, ""},
		{"a finish is for its service to judge", TenantScope("a"), &JobFinished{JobID: "j"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckScope(tc.scope, tc.v)
			var se *ScopeError
			switch {
			case tc.field == "" && err != nil:
				t.Fatalf("err %v, want none", err)
			case tc.field != "" && (!errors.As(err, &se) || se.Field != tc.field):
				t.Fatalf("err %v, want a *ScopeError naming %s", err, tc.field)
			}
		})
	}
}

// CheckScopeOfBody reads a body's node or tenant as CheckScope does the
// decoded event's.
func TestCheckScopeOfBody(t *testing.T) {
	for _, tc := range []struct {
		name  Name
		scope Scope
		body  string
		field string
	}{
		{NameAgentHeartbeat, NodeScope("n1"), `{"node":"n1","agent":"a"}`, ""},
		{NameAgentHeartbeat, NodeScope("n1"), `{"node":"n2","agent":"a"}`, "node"},
		{NameRanksExited, NodeScope("n1"), `{"job_id":"j","node":"n2"}`, "node"},
		{NameTopologyNode, NodeScope("n1"), `{"name":"n2","gpus":[]}`, "name"},
		{NameJobSubmitted, TenantScope("a"), `{"job_id":"j","tenant":"b"}`, "tenant"},
		{NameJobSubmitted, Scope{}, `{"job_id":"j","tenant":"b"}`, ""},
		{NameJobFinished, TenantScope("a"), `{"job_id":"j"}`, ""},
		{NameAgentHeartbeat, NodeScope("n1"), `not json`, ""},
	} {
		err := CheckScopeOfBody(tc.name, tc.scope, []byte(tc.body))
		var se *ScopeError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s %s: %v, want none", tc.name, tc.body, err)
		case tc.field != "" && (!errors.As(err, &se) || se.Field != tc.field):
			t.Errorf("%s %s: %v, want a *ScopeError naming %s", tc.name, tc.body, err, tc.field)
		}
	}
}
