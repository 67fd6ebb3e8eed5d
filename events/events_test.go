package events

import (
	"strings"
	"testing"
	"time"
)

func TestSubjects(t *testing.T) {
	t.Parallel()
	s := NewSubjects("")
	tests := []struct{ got, want string }{
		{s.Of(NameJobSubmitted), "toposched.jobs.submitted"},
		{s.Of(NamePlacementDecided), "toposched.placement.decided"},
		{s.Of(NameTopologyNode), "toposched.topology.node.*"},
		{s.ForNode(NameTopologyNode, "gpu-01.dc1"), "toposched.topology.node.gpu-01%2Edc1"},
		{NewSubjects("acme").Of(NameJobFinished), "acme.jobs.finished"},
		{s.Domain(DomainJobs), "toposched.jobs.>"},
		{s.DeadLetter(), "toposched.dlq"},
		{NamePlacementDecided.CEType(), "io.toposched.placement.decided.v1"},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	for _, n := range Catalogue {
		subject := s.Of(n)
		if n.NodeScoped() {
			subject = s.ForNode(n, "a.b")
		}
		if got, ok := s.NameOfSubject(subject); !ok || got != n {
			t.Errorf("NameOfSubject(%s) = %s, %v", subject, got, ok)
		}
		if got, ok := NameOfCEType(n.CEType()); !ok || got != n {
			t.Errorf("NameOfCEType(%s) = %s, %v", n.CEType(), got, ok)
		}
		v := n.New()
		if got, err := NameOf(v); err != nil || got != n {
			t.Errorf("NameOf(%T) = %s, %v", v, got, err)
		}
	}
}

func TestNodeTokenRoundTrip(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"dgx-01", "gpu-01.dc1.example.com", "a%2Eb", "x*y>z w"} {
		tok := NodeToken(name)
		back, err := NodeFromToken(tok)
		if err != nil || back != name {
			t.Errorf("%q -> %q -> %q, %v", name, tok, back, err)
		}
	}
}

func TestParseEnvelope(t *testing.T) {
	t.Parallel()
	s := NewSubjects("")
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	d := Delivery{Subject: "toposched.jobs.submitted", Stream: "TOPOSCHED_JOBS", Seq: 42, Time: at}
	body := []byte(`{"job_id":"j1","gpus":8}`)
	tests := []struct {
		name    string
		h       map[string]string
		d       Delivery
		want    Envelope
		wantErr string
	}{
		{
			name: "bare publisher: everything filled in",
			d:    d,
			want: Envelope{ID: "TOPOSCHED_JOBS-42", Type: "io.toposched.jobs.submitted.v1", Source: "urn:toposched:unknown-publisher",
				Subject: "j1", Time: at, CorrelationID: "TOPOSCHED_JOBS-42"},
		},
		{
			name: "Nats-Msg-Id used when ce-id is missing",
			h:    map[string]string{HeaderMsgID: "m-1"},
			d:    d,
			want: Envelope{ID: "m-1", Type: "io.toposched.jobs.submitted.v1", Source: "urn:toposched:unknown-publisher",
				Subject: "j1", Time: at, CorrelationID: "m-1"},
		},
		{
			name: "full CloudEvents headers kept",
			h: map[string]string{HeaderID: "e1", HeaderType: "io.toposched.jobs.submitted.v1", HeaderSource: "urn:me",
				HeaderTime: "2026-01-02T03:04:05Z", HeaderSubject: "j1", HeaderCorrelationID: "c1", HeaderCausationID: "p1"},
			d: d,
			want: Envelope{ID: "e1", Type: "io.toposched.jobs.submitted.v1", Source: "urn:me",
				Subject: "j1", Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), CorrelationID: "c1", CausationID: "p1"},
		},
		{name: "unknown type", h: map[string]string{HeaderType: "com.example.x"}, d: d, wantErr: "unknown event type"},
		{name: "type on the wrong subject", h: map[string]string{HeaderType: "io.toposched.jobs.finished.v1"}, d: d, wantErr: "does not belong"},
		{name: "foreign subject", d: Delivery{Subject: "other.jobs.submitted"}, wantErr: "not a toposched event subject"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, _, err := ParseEnvelope(s, tc.h, body, tc.d)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestEnvelopeHeadersRoundTrip(t *testing.T) {
	t.Parallel()
	e := Envelope{ID: "x", Type: NameJobFinished.CEType(), Source: "urn:a", Subject: "j",
		Time: time.Date(2026, 1, 1, 0, 0, 0, 123, time.UTC), CorrelationID: "c", CausationID: "p"}
	h := e.Headers()
	if h[HeaderMsgID] != "x" || h[HeaderSpecVersion] != "1.0" {
		t.Fatalf("headers %v", h)
	}
	got, _, err := ParseEnvelope(NewSubjects(""), h, nil, Delivery{Subject: "toposched.jobs.finished"})
	if err != nil || got != e {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
}

func TestDeriveIDDeterministic(t *testing.T) {
	t.Parallel()
	a := DeriveID("c", NamePlacementDecided, "j")
	if a != DeriveID("c", NamePlacementDecided, "j") || a == DeriveID("c", NamePlacementPending, "j") || a == DeriveID("c", NamePlacementDecided, "k") {
		t.Fatal("DeriveID must be a pure function of cause, name and key")
	}
}

func TestKeyOfBody(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name Name
		body string
		want string
	}{
		{NameJobSubmitted, `{"job_id":"a","gpus":"x"}`, "a"},
		{NameJobAnalyzed, `{"job":{"job_id":"b"}}`, "b"},
		{NameTopologyNode, `{"name":"n1"}`, "n1"},
		{NameTopologyHealth, `{"node":"n2"}`, "n2"},
		{NameJobSubmitted, `not json`, ""},
	}
	for _, tc := range tests {
		if got := KeyOfBody(tc.name, []byte(tc.body)); got != tc.want {
			t.Errorf("KeyOfBody(%s, %s) = %q, want %q", tc.name, tc.body, got, tc.want)
		}
	}
}

func FuzzParseEnvelope(f *testing.F) {
	f.Add("toposched.jobs.submitted", "", "", []byte(`{"job_id":"j"}`))
	f.Add("toposched.topology.node.a%2Eb", "io.toposched.topology.node.v1", "2026-01-01T00:00:00Z", []byte(`{"name":"a.b"}`))
	f.Add("x", "io.toposched.jobs.finished.v1", "bad", []byte(`{`))
	f.Fuzz(func(t *testing.T, subject, ceType, ceTime string, body []byte) {
		h := map[string]string{HeaderType: ceType, HeaderTime: ceTime}
		env, name, err := ParseEnvelope(NewSubjects(""), h, body, Delivery{Subject: subject, Stream: "S", Seq: 1})
		if err != nil {
			return
		}
		if env.ID == "" || env.Type != name.CEType() || env.CorrelationID == "" {
			t.Fatalf("accepted envelope with holes: %+v", env)
		}
	})
}
