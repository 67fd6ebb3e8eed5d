package kube

import (
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/toposched/toposched/events"
)

// podsWithUIDs are pods of namespace team-a with the given UIDs.
func podsWithUIDs(uids ...string) []*corev1.Pod {
	out := make([]*corev1.Pod, len(uids))
	for i, u := range uids {
		out[i] = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "p" + strconv.Itoa(i), UID: types.UID(u)}}
	}
	return out
}

func TestJobIDRoundTrip(t *testing.T) {
	members := fingerprint(Gang{Namespace: "team-a", Kind: KindJobSet, Name: "llama"}, podsWithUIDs("u1", "u2"))
	for _, attempt := range []int{1, 2, 9, 10, 123456} {
		id := jobID(members, attempt)
		gotMembers, gotAttempt := parseJobID(id)
		if gotMembers != members || gotAttempt != attempt {
			t.Errorf("parseJobID(%q) = %q, %d; want %q, %d", id, gotMembers, gotAttempt, members, attempt)
		}
		if !events.ValidJobID(id) {
			t.Errorf("jobID(%q, %d) = %q is not a valid job id", members, attempt, id)
		}
	}
}

// TestParseJobIDNotOurs: an id not of jobID's shape is its own member set
// at attempt 0, so that job() never takes it for an attempt of another.
func TestParseJobIDNotOurs(t *testing.T) {
	for _, id := range []string{
		"k8s:team-a:llama:0123456789ab",  // no attempt
		"k8s:team-a:my-job:0123456789ab", // a '-' in the name is no attempt
		"k8s:team-a:llama:0123456789ab-0",
		"k8s:team-a:llama:0123456789ab-x",
		"k8s:team-a:llama:0123456789ab-",
		"plain",
	} {
		members, attempt := parseJobID(id)
		if members != id || attempt != 0 {
			t.Errorf("parseJobID(%q) = %q, %d; want %q, 0", id, members, attempt, id)
		}
	}
}

func TestFingerprint(t *testing.T) {
	g := Gang{Namespace: "team-a", Kind: KindJobSet, Name: "llama"}
	base := fingerprint(g, podsWithUIDs("u1", "u2", "u3"))
	if !strings.HasPrefix(base, JobIDPrefix+"team-a:llama:") {
		t.Errorf("fingerprint %q does not start with %q", base, JobIDPrefix+"team-a:llama:")
	}
	if got := fingerprint(g, podsWithUIDs("u3", "u1", "u2")); got != base {
		t.Errorf("the same members in another order: %q, want %q", got, base)
	}
	if got := fingerprint(g, podsWithUIDs("u1", "u2", "u4")); got == base {
		t.Errorf("another member set has the same fingerprint %q", got)
	}
	if got := fingerprint(g, podsWithUIDs("u1", "u2")); got == base {
		t.Errorf("a subset of the members has the same fingerprint %q", got)
	}
	// UIDs are joined with a separator: ("u1","u2") is not ("u1u2").
	if a, b := fingerprint(g, podsWithUIDs("u1", "u2")), fingerprint(g, podsWithUIDs("u1u2")); a == b {
		t.Errorf("members (u1, u2) and (u1u2) share fingerprint %q", a)
	}
	for _, other := range []Gang{
		{Namespace: "team-b", Kind: KindJobSet, Name: "llama"},
		{Namespace: "team-a", Kind: KindPodGroup, Name: "llama"},
		{Namespace: "team-a", Kind: KindJobSet, Name: "llama2"},
	} {
		if got := fingerprint(other, podsWithUIDs("u1", "u2", "u3")); got == base {
			t.Errorf("gang %s has the fingerprint of %s: %q", other.Key(), g.Key(), got)
		}
	}
}

// TestFingerprintLongNames: names are cut to keep the id within the
// schema's 128 characters, and the hash keeps ids of names that share
// their first characters apart.
func TestFingerprintLongNames(t *testing.T) {
	ns := strings.Repeat("n", 63) // the longest namespace (a DNS label)
	common := strings.Repeat("a", 40)
	names := []string{
		common + "-one",
		common + "-two",
		common,
		strings.Repeat("b", 39) + "-tail", // cut just after a '-': trimmed
		strings.Repeat("c", 39) + ".tail",
		strings.Repeat("x", 253), // the longest pod name
		"w_1.x",                  // label values may hold '_' and '.'
		"UPPER",
	}
	seen := map[string]string{}
	for _, name := range names {
		for _, kind := range []string{KindPod, KindPodGroup} {
			g := Gang{Namespace: ns, Kind: kind, Name: name}
			members := fingerprint(g, podsWithUIDs("0b8e7c5e-8f1d-4c7a-9a8e-1f2e3d4c5b6a"))
			if prev, dup := seen[members]; dup {
				t.Errorf("gangs %s and %s share the fingerprint %q", prev, g.Key(), members)
			}
			seen[members] = g.Key()
			for _, attempt := range []int{1, 99999} {
				if id := jobID(members, attempt); !events.ValidJobID(id) {
					t.Errorf("gang %s attempt %d: job id %q (%d characters) is not valid", g.Key(), attempt, id, len(id))
				}
			}
			readable := strings.Split(members, ":")[2]
			if len(readable) > 40 || strings.HasSuffix(readable, "-") || strings.HasSuffix(readable, ".") {
				t.Errorf("gang %s: the name in %q is %q, want at most 40 characters ending in neither '-' nor '.'", g.Key(), members, readable)
			}
		}
	}
}
