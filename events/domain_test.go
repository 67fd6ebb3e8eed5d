package events

import (
	"slices"
	"strings"
	"testing"
)

// TestNameDomain checks that the table in Name.Domain agrees with the names
// themselves, and that every event's domain has a stream.
func TestNameDomain(t *testing.T) {
	t.Parallel()
	for _, n := range Catalogue {
		first, _, _ := strings.Cut(string(n), ".")
		if got := n.Domain(); string(got) != first {
			t.Errorf("%s.Domain() = %q, want %q", n, got, first)
		}
		if !slices.Contains(Domains, n.Domain()) {
			t.Errorf("%s: domain %q has no stream in Domains", n, n.Domain())
		}
	}
	if got := Name("custom.thing").Domain(); got != "custom" {
		t.Errorf("Domain of a name outside the catalogue = %q, want its first token", got)
	}
	if slices.Contains(Domains, Domain("")) {
		t.Error("Domains holds an empty domain")
	}
}

// TestJobStateValid checks the job states the store accepts.
func TestJobStateValid(t *testing.T) {
	t.Parallel()
	for _, s := range JobStates {
		if !s.Valid() {
			t.Errorf("%q: not valid", s)
		}
	}
	for _, s := range []JobState{"", "running", "Pending"} {
		if s.Valid() {
			t.Errorf("%q: valid", s)
		}
	}
}

// TestJobStatusValid checks the finish statuses.
func TestJobStatusValid(t *testing.T) {
	t.Parallel()
	for _, s := range []JobStatus{StatusSucceeded, StatusFailed, StatusCancelled} {
		if !s.Valid() {
			t.Errorf("%q: not valid", s)
		}
	}
	if JobStatus("done").Valid() {
		t.Error(`"done": valid`)
	}
}
