package bus

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/toposched/toposched/events"
)

// A publish the server does not permit fails with a *DeniedError naming
// the subject, not after JetStream's timeout with a bare one; what
// the user may publish goes through; and a server that wants credentials
// says so at connect.
func TestPublishDenied(t *testing.T) {
	t.Parallel()
	admin, _ := nkeys.CreateUser()
	adminPub, _ := admin.PublicKey()
	tenant, _ := nkeys.CreateUser()
	tenantPub, _ := tenant.PublicKey()
	subj := events.NewSubjects("")
	ns := jetStreamServer(t, &server.Options{
		Nkeys: []*server.NkeyUser{
			{Nkey: adminPub},
			{Nkey: tenantPub, Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{subj.Scoped(events.NameJobSubmitted, events.TenantScope("a")), "$JS.API.>"}},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
			}},
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	signIn := func(kp nkeys.KeyPair) nats.Option {
		pub, _ := kp.PublicKey()
		return nats.Nkey(pub, func(nonce []byte) ([]byte, error) { return kp.Sign(nonce) })
	}
	if _, err := Connect(ctx, Config{URL: ns.ClientURL(), SkipStreams: true}); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("connect without credentials: %v, want an authorization error", err)
	}
	ab, err := Connect(ctx, Config{URL: ns.ClientURL(), NATSOptions: []nats.Option{signIn(admin)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ab.Close() })
	b, err := Connect(ctx, Config{URL: ns.ClientURL(), SkipStreams: true, NATSOptions: []nats.Option{signIn(tenant)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if _, err := b.Publish(ctx, &events.JobSubmitted{JobID: "ok", GPUs: 1, Tenant: "a"}); err != nil {
		t.Fatalf("own tenant's job: %v", err)
	}
	for i, v := range []any{
		&events.JobSubmitted{JobID: "theirs", GPUs: 1, Tenant: "b"},
		&events.JobFinished{JobID: "ok", Status: events.StatusCancelled},
	} {
		// A timeout would be another error: the *DeniedError comes from
		// the server's answer.
		_, err := b.Publish(ctx, v)
		var de *DeniedError
		if !errors.As(err, &de) || IsTransient(err) {
			t.Fatalf("case %d: %v, want a permanent *DeniedError", i, err)
		}
	}
}
