package authcallout

import (
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// A user JWT carries a role's permissions list for list: allow and deny,
// publish and subscribe, responses; nil (everything) carries none, which
// the server reads as the account's defaults, everything.
func TestUserPermissions(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    *server.Permissions
	}{
		{"everything", nil},
		{"publish allow only", &server.Permissions{Publish: &server.SubjectPermission{Allow: []string{"a.>", "b.*"}}}},
		{"allow and deny both sides", &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"toposched.agent.heartbeat.n1", "$JS.API.INFO"}, Deny: []string{"$KV.>", "$JS.API.CONSUMER.CREATE.*.placement-topology"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}, Deny: []string{"_INBOX.secret"}},
		}},
		{"subscribe deny only", &server.Permissions{Subscribe: &server.SubjectPermission{Deny: []string{"x"}}}},
		{"responses", &server.Permissions{
			Subscribe: &server.SubjectPermission{Allow: []string{Subject}},
			Response:  &server.ResponsePermission{MaxMsgs: 1, Expires: 3 * time.Second},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			issuer, _ := nkeys.CreateAccount()
			user, _ := nkeys.CreateUser()
			pub, _ := user.PublicKey()
			uc := jwt.NewUserClaims(pub)
			uc.Permissions = UserPermissions(tc.p)
			vr := jwt.CreateValidationResults()
			uc.Validate(vr)
			if errs := vr.Errors(); len(errs) > 0 {
				t.Fatalf("invalid user JWT: %v", errs)
			}
			enc, err := uc.Encode(issuer)
			if err != nil {
				t.Fatal(err)
			}
			back, err := jwt.DecodeUserClaims(enc)
			if err != nil {
				t.Fatal(err)
			}
			got := back.Permissions
			want := [5][]string{}
			if tc.p != nil && tc.p.Publish != nil {
				want[0], want[1] = tc.p.Publish.Allow, tc.p.Publish.Deny
			}
			if tc.p != nil && tc.p.Subscribe != nil {
				want[2], want[3] = tc.p.Subscribe.Allow, tc.p.Subscribe.Deny
			}
			have := [5][]string{got.Pub.Allow, got.Pub.Deny, got.Sub.Allow, got.Sub.Deny}
			for i := range want {
				if !slices.Equal(have[i], want[i]) {
					t.Errorf("list %d: %q, want %q", i, have[i], want[i])
				}
			}
			switch {
			case tc.p == nil || tc.p.Response == nil:
				if got.Resp != nil {
					t.Errorf("responses %+v, want none", got.Resp)
				}
			case got.Resp == nil || got.Resp.MaxMsgs != tc.p.Response.MaxMsgs || got.Resp.Expires != tc.p.Response.Expires:
				t.Errorf("responses %+v, want %+v", got.Resp, tc.p.Response)
			}
		})
	}
}

var (
	agents = types.NamespacedName{Namespace: "toposched", Name: "toposched-agent"}
	other  = types.NamespacedName{Namespace: "toposched", Name: "default"}
)

// review is a TokenReview status for a token of sa bound to pod on node.
func review(sa types.NamespacedName, pod, uid, node string, audiences ...string) authv1.TokenReviewStatus {
	extra := map[string]authv1.ExtraValue{}
	if pod != "" {
		extra[extraPodName] = authv1.ExtraValue{pod}
		extra[extraPodUID] = authv1.ExtraValue{uid}
	}
	if node != "" {
		extra[extraNodeName] = authv1.ExtraValue{node}
	}
	return authv1.TokenReviewStatus{
		Authenticated: true,
		Audiences:     audiences,
		User:          authv1.UserInfo{Username: username(sa), Extra: extra},
	}
}

// The claims a token must have: authenticated, for the audience, the
// agents' ServiceAccount's, bound to a pod on a node.
func TestCheckReview(t *testing.T) {
	for _, tc := range []struct {
		name    string
		status  authv1.TokenReviewStatus
		want    Identity
		wantErr string
	}{
		{"an agent's", review(agents, "agent-x", "u1", "gpu-1", DefaultAudience),
			Identity{Node: "gpu-1", Pod: types.NamespacedName{Namespace: "toposched", Name: "agent-x"}, PodUID: "u1"}, ""},
		{"among other audiences", review(agents, "agent-x", "u1", "gpu-1.lab", "api", DefaultAudience),
			Identity{Node: "gpu-1.lab", Pod: types.NamespacedName{Namespace: "toposched", Name: "agent-x"}, PodUID: "u1"}, ""},
		{"not authenticated", authv1.TokenReviewStatus{Error: "token has expired"}, Identity{}, "token has expired"},
		{"another audience", review(agents, "agent-x", "u1", "gpu-1", "https://kubernetes.default.svc"), Identity{}, "not for audience"},
		{"another ServiceAccount", review(other, "agent-x", "u1", "gpu-1", DefaultAudience), Identity{}, "not of the agents' ServiceAccount"},
		{"same name, other namespace", review(types.NamespacedName{Namespace: "x", Name: agents.Name}, "p", "u", "gpu-1", DefaultAudience), Identity{}, "not of the agents'"},
		{"no node (Kubernetes before 1.32)", review(agents, "agent-x", "u1", "", DefaultAudience), Identity{}, extraNodeName},
		{"not bound to a pod (a Secret's token)", review(agents, "", "", "", DefaultAudience), Identity{}, extraPodName},
		{"two nodes", func() authv1.TokenReviewStatus {
			s := review(agents, "agent-x", "u1", "gpu-1", DefaultAudience)
			s.User.Extra[extraNodeName] = authv1.ExtraValue{"gpu-1", "gpu-2"}
			return s
		}(), Identity{}, extraNodeName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CheckReview(tc.status, agents, DefaultAudience)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("%+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestParseServiceAccount(t *testing.T) {
	for in, ok := range map[string]bool{"ns/name": true, "ns/": false, "/name": false, "name": false, "a/b/c": false, "a:b/c": false} {
		_, err := ParseServiceAccount(in)
		if (err == nil) != ok {
			t.Errorf("%q: err %v, want ok %v", in, err, ok)
		}
	}
}

// jwtWith is a JWT-shaped token of the payload (no valid signature: the
// API server, not this package, checks those).
func jwtWith(payload string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256","kid":"k"}`)) + "." + enc([]byte(payload)) + ".c2ln"
}

func TestTokenExpiry(t *testing.T) {
	for _, tc := range []struct {
		name, token string
		want        int64
		wantErr     string
	}{
		{"bound token", jwtWith(`{"aud":["toposched-nats"],"exp":1900000000,"iat":1899996400,"kubernetes.io":{"node":{"name":"n"}}}`), 1900000000, ""},
		{"padded payload", strings.Replace(jwtWith(`{"exp":1900000000}`), ".c2ln", "", 1) + "==.c2ln", 1900000000, ""},
		{"no exp", jwtWith(`{"iat":1}`), 0, "without exp"},
		{"fractional exp", jwtWith(`{"exp":1.5}`), 0, "want whole seconds"},
		{"negative exp", jwtWith(`{"exp":-1}`), 0, "want whole seconds"},
		{"string exp", jwtWith(`{"exp":"1900000000"}`), 0, "want whole seconds"},
		{"null exp", jwtWith(`{"exp":null}`), 0, "without exp"},
		{"not a JWT", "0123456789abcdef", 0, "3"},
		{"payload not base64", "a.%%%.c", 0, "payload"},
		{"payload not JSON", "a." + base64.RawURLEncoding.EncodeToString([]byte("exp")) + ".c", 0, "payload"},
		{"too large", jwtWith(`{"exp":1,"x":"` + strings.Repeat("x", MaxTokenSize) + `"}`), 0, "over"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := TokenExpiry(tc.token)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got.Unix() != tc.want {
				t.Fatalf("%v, %v; want %d", got, err, tc.want)
			}
		})
	}
}

// FuzzTokenExpiry: any string is read or refused, never a panic, and an
// expiry read is after 1970.
func FuzzTokenExpiry(f *testing.F) {
	f.Add(jwtWith(`{"exp":1900000000}`))
	f.Add(jwtWith(`{"exp":1e99}`))
	f.Add(jwtWith(`{"exp":null}`))
	f.Add(jwtWith(`[]`))
	f.Add("..")
	f.Add("a.b.c.d")
	f.Fuzz(func(t *testing.T, token string) {
		got, err := TokenExpiry(token)
		if err == nil && got.Unix() <= 0 {
			t.Fatalf("%q: expiry %v", token, got)
		}
	})
}

// kubeFake is an API server that reviews the tokens of reviews (token ->
// status) and holds pods.
func kubeFake(reviews map[string]authv1.TokenReviewStatus, pods ...*corev1.Pod) (*fake.Clientset, *[]authv1.TokenReviewSpec) {
	objs := make([]runtime.Object, len(pods))
	for i, p := range pods {
		objs[i] = p
	}
	kc := fake.NewClientset(objs...)
	var asked []authv1.TokenReviewSpec
	kc.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		tr := a.(k8stesting.CreateAction).GetObject().(*authv1.TokenReview).DeepCopy()
		asked = append(asked, tr.Spec)
		s, ok := reviews[tr.Spec.Token]
		if !ok {
			s = authv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		if !slices.Contains(tr.Spec.Audiences, DefaultAudience) {
			return true, nil, errors.New("the test's reviews are for the default audience")
		}
		tr.Status = s
		return true, tr, nil
	})
	return kc, &asked
}

func agentPod(name, uid, node string, sa types.NamespacedName) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: sa.Namespace, Name: name, UID: types.UID(uid)},
		Spec:       corev1.PodSpec{NodeName: node, ServiceAccountName: sa.Name},
	}
}

// testRole is node's agent's role in the tests: its heartbeats only.
func testRole(node string) (string, *server.Permissions, error) {
	if strings.ContainsAny(node, " *>") {
		return "", nil, errors.New("no role for such a name")
	}
	return "agent-" + node, &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{"hb." + node}, Deny: []string{"hb.forbidden"}},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
	}, nil
}

// request is an authorization request as a server sends it, for a
// client with token.
func request(t *testing.T, srv nkeys.KeyPair, userNkey, token string) []byte {
	t.Helper()
	srvPub, _ := srv.PublicKey()
	req := jwt.NewAuthorizationRequestClaims(srvPub)
	req.Audience = server.AuthRequestSubject
	req.UserNkey = userNkey
	req.Server = jwt.ServerID{Name: "nats-0", ID: srvPub}
	req.ConnectOptions.Token = token
	req.ClientInformation.Host = "10.0.0.7"
	req.Expires = time.Now().Add(2 * time.Second).Unix()
	enc, err := req.Encode(srv)
	if err != nil {
		t.Fatal(err)
	}
	return []byte(enc)
}

// The responder answers a token of the agents' ServiceAccount, bound to a
// pod on node gpu-1, with a user of gpu-1's role expiring with the token
// (or within MaxTTL), and refuses everything else, saying why.
func TestRespond(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	soon, later, past := jwtWith(`{"exp":1800000600}`), jwtWith(`{"exp":1800090000}`), jwtWith(`{"exp":1799999000}`)
	other1, otherSA, noNode, moved, gone, elsewhere := jwtWith(`{"exp":1800000601}`), jwtWith(`{"exp":1800000602}`),
		jwtWith(`{"exp":1800000603}`), jwtWith(`{"exp":1800000604}`), jwtWith(`{"exp":1800000605}`), jwtWith(`{"exp":1800000606}`)
	badName := jwtWith(`{"exp":1800000607}`)
	reviews := map[string]authv1.TokenReviewStatus{
		soon:      review(agents, "agent-a", "ua", "gpu-1", DefaultAudience),
		later:     review(agents, "agent-a", "ua", "gpu-1", DefaultAudience),
		past:      review(agents, "agent-a", "ua", "gpu-1", DefaultAudience), // as if the API server's leeway let it pass
		other1:    review(agents, "agent-b", "ub", "gpu-2", DefaultAudience),
		otherSA:   review(other, "agent-a", "ua", "gpu-1", DefaultAudience),
		noNode:    review(agents, "agent-a", "ua", "", DefaultAudience),
		moved:     review(agents, "agent-a", "ua", "gpu-2", DefaultAudience), // the pod is on gpu-1
		gone:      review(agents, "agent-old", "uold", "gpu-1", DefaultAudience),
		elsewhere: review(agents, "agent-c", "uc", "gpu-3", DefaultAudience), // the pod runs as another ServiceAccount
		badName:   review(agents, "agent-d", "ud", "gpu *", DefaultAudience),
	}
	kc, asked := kubeFake(reviews,
		agentPod("agent-a", "ua", "gpu-1", agents),
		agentPod("agent-b", "ub", "gpu-2", agents),
		agentPod("agent-old", "unew", "gpu-1", agents),
		agentPod("agent-c", "uc", "gpu-3", other),
		agentPod("agent-d", "ud", "gpu *", agents))
	issuer, _ := nkeys.CreateAccount()
	issuerPub, _ := issuer.PublicKey()
	r, err := New(Config{Issuer: issuer, Account: "TOPOSCHED", ServiceAccount: agents, Role: testRole, Kube: kc,
		MaxTTL: time.Hour, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := nkeys.CreateServer()
	srvPub, _ := srv.PublicKey()
	for _, tc := range []struct {
		name, token string
		wantUser    string
		wantExp     int64
		wantErr     string
	}{
		{"an agent's token", soon, "agent-gpu-1", 1800000600, ""},
		{"a long token: MaxTTL", later, "agent-gpu-1", now.Add(time.Hour).Unix(), ""},
		{"another node's agent", other1, "agent-gpu-2", 1800000601, ""},
		{"no token", "", "", 0, "no token"},
		{"a token the API server refuses", jwtWith(`{"exp":1900000000}`), "", 0, "invalid bearer token"},
		{"expired", past, "", 0, "expired"},
		{"another ServiceAccount", otherSA, "", 0, "not of the agents' ServiceAccount"},
		{"no node", noNode, "", 0, extraNodeName},
		{"pod on another node", moved, "", 0, `bound to "gpu-1"`},
		{"pod gone, a new one of its name", gone, "", 0, "is gone"},
		{"pod of another ServiceAccount", elsewhere, "", 0, "runs as ServiceAccount"},
		{"a node without a role", badName, "", 0, "no role"},
		{"too large", strings.Repeat("x", MaxTokenSize+1), "", 0, "over"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user, _ := nkeys.CreateUser()
			userPub, _ := user.PublicKey()
			out := r.Respond(t.Context(), request(t, srv, userPub, tc.token))
			resp, err := jwt.DecodeAuthorizationResponseClaims(string(out))
			if err != nil {
				t.Fatalf("response: %v", err)
			}
			if resp.Issuer != issuerPub || resp.Subject != userPub || resp.Audience != srvPub {
				t.Fatalf("response issuer %s subject %s audience %s; want %s, %s, %s", resp.Issuer, resp.Subject, resp.Audience, issuerPub, userPub, srvPub)
			}
			if tc.wantErr != "" {
				if resp.Jwt != "" || !strings.Contains(resp.Error, tc.wantErr) {
					t.Fatalf("jwt %q error %q, want a refusal naming %q", resp.Jwt, resp.Error, tc.wantErr)
				}
				if strings.Contains(resp.Error, tc.token) && tc.token != "" {
					t.Fatalf("the refusal quotes the token: %q", resp.Error)
				}
				return
			}
			if resp.Error != "" {
				t.Fatalf("refused: %s", resp.Error)
			}
			uc, err := jwt.DecodeUserClaims(resp.Jwt)
			if err != nil {
				t.Fatal(err)
			}
			_, wantPerms, _ := testRole(strings.TrimPrefix(tc.wantUser, "agent-"))
			switch {
			case uc.Issuer != issuerPub || uc.Subject != userPub:
				t.Errorf("user issuer %s subject %s", uc.Issuer, uc.Subject)
			case uc.Name != tc.wantUser || uc.Audience != "TOPOSCHED":
				t.Errorf("user %q in account %q, want %q in TOPOSCHED", uc.Name, uc.Audience, tc.wantUser)
			case uc.Expires != tc.wantExp:
				t.Errorf("user expires %d, want %d", uc.Expires, tc.wantExp)
			case !slices.Equal(uc.Pub.Allow, wantPerms.Publish.Allow) || !slices.Equal(uc.Pub.Deny, wantPerms.Publish.Deny) || !slices.Equal(uc.Sub.Allow, wantPerms.Subscribe.Allow):
				t.Errorf("user permissions %+v, want %+v", uc.Permissions, wantPerms)
			}
		})
	}
	for _, a := range *asked {
		if !slices.Equal(a.Audiences, []string{DefaultAudience}) {
			t.Errorf("a review for audiences %q", a.Audiences)
		}
	}
	// A request the server did not sign, or not a request at all, has no
	// one to answer.
	if out := r.Respond(t.Context(), []byte("not a jwt")); out != nil {
		t.Errorf("answered garbage: %s", out)
	}
	user, _ := nkeys.CreateUser()
	userPub, _ := user.PublicKey()
	forged := request(t, srv, userPub, soon)
	forged[len(forged)-3] ^= 1
	if out := r.Respond(t.Context(), forged); out != nil {
		t.Errorf("answered a request with a broken signature")
	}
}

// A real nats-server (in this process) with auth_callout in the
// configuration nats-server reads: the responder lets a token's client
// in as its node's agent with that role's permissions, in the account
// named; refuses another node's subjects and other tokens; nkey users
// listed as auth users sign in as before, without the callout.
func TestServeWithNATSServer(t *testing.T) {
	issuer, _ := nkeys.CreateAccount()
	issuerPub, _ := issuer.PublicKey()
	responder, _ := nkeys.CreateUser()
	responderPub, _ := responder.PublicKey()
	responderSeed, _ := responder.Seed()
	admin, _ := nkeys.CreateUser()
	adminPub, _ := admin.PublicKey()
	adminSeed, _ := admin.Seed()
	// The shape toposched roles conf --auth-callout-issuer writes: the
	// responder alone an auth user, its account alone delegated, so that
	// TOPOSCHED's users are not sent to the callout and may be added by a
	// reload (nats-server reloads no changed auth_callout).
	dir := t.TempDir()
	file := filepath.Join(dir, "nats.conf")
	writeConf := func(users ...string) {
		t.Helper()
		var list strings.Builder
		for _, u := range users {
			fmt.Fprintf(&list, "{nkey: %q}\n", u)
		}
		conf := fmt.Sprintf(`listen: "127.0.0.1:-1"
accounts {
  TOPOSCHED { users: [ %s ] }
  TOPOSCHED_AUTH { users: [ {nkey: %q, permissions: {publish: "$SYS._INBOX.>", subscribe: %q}} ] }
}
authorization {
  auth_callout {
    issuer: %q
    account: TOPOSCHED_AUTH
    auth_users: [ %q ]
    allowed_accounts: [ TOPOSCHED_AUTH ]
  }
}
`, list.String(), responderPub, Subject, issuerPub, responderPub)
		if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeConf(adminPub)
	opts, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatal(err)
	}
	opts.NoLog, opts.NoSigs = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	url := ns.ClientURL()

	tokenA, tokenB := jwtWith(`{"exp":`+fmt.Sprint(time.Now().Add(time.Hour).Unix())+`}`), jwtWith(`{"exp":`+fmt.Sprint(time.Now().Add(time.Hour).Unix()+1)+`}`)
	kc, _ := kubeFake(map[string]authv1.TokenReviewStatus{
		tokenA: review(agents, "agent-a", "ua", "gpu-1", DefaultAudience),
		tokenB: review(other, "agent-b", "ub", "gpu-2", DefaultAudience),
	}, agentPod("agent-a", "ua", "gpu-1", agents), agentPod("agent-b", "ub", "gpu-2", other))
	r, err := New(Config{Issuer: issuer, Account: "TOPOSCHED", ServiceAccount: agents, Role: testRole, Kube: kc})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := nats.Connect(url, nats.Nkey(responderPub, func(n []byte) ([]byte, error) {
		kp, _ := nkeys.FromSeed(responderSeed)
		return kp.Sign(n)
	}))
	if err != nil {
		t.Fatalf("the responder's user: %v", err)
	}
	t.Cleanup(rc.Close)
	stop, err := r.Listen(rc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)

	signer := func(seed []byte) nats.Option {
		kp, _ := nkeys.FromSeed(seed)
		pub, _ := kp.PublicKey()
		return nats.Nkey(pub, kp.Sign)
	}
	adminNC, err := nats.Connect(url, signer(adminSeed))
	if err != nil {
		t.Fatalf("an auth user (nkey): %v", err)
	}
	t.Cleanup(adminNC.Close)
	sub, err := adminNC.SubscribeSync("hb.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := adminNC.Flush(); err != nil {
		t.Fatal(err)
	}

	errs := make(chan error, 16)
	agent, err := nats.Connect(url, nats.Token(tokenA), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatalf("agent of gpu-1 with its token: %v", err)
	}
	t.Cleanup(agent.Close)
	for _, s := range []string{"hb.gpu-2", "hb.gpu-1"} {
		if err := agent.Publish(s, []byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if err := agent.Flush(); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil || m.Subject != "hb.gpu-1" {
		t.Fatalf("the admin got %v, %v; want gpu-1's heartbeat alone (same account, gpu-2's refused)", m, err)
	}
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), "hb.gpu-2") {
			t.Fatalf("agent's async error %v, want a permissions violation for hb.gpu-2", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no permissions violation for hb.gpu-2")
	}
	if _, err := nats.Connect(url, nats.Token(tokenB)); err == nil || !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("another ServiceAccount's token: %v, want an authorization violation", err)
	}
	if _, err := nats.Connect(url); err == nil {
		t.Fatal("a client without credentials got in")
	}

	// A user added by a reload signs in, not through the callout.
	late, _ := nkeys.CreateUser()
	latePub, _ := late.PublicKey()
	lateSeed, _ := late.Seed()
	writeConf(adminPub, latePub)
	if err := ns.Reload(); err != nil {
		t.Fatalf("reload with a user added: %v", err)
	}
	lateNC, err := nats.Connect(url, signer(lateSeed))
	if err != nil {
		t.Fatalf("a user added by a reload: %v", err)
	}
	lateNC.Close()
}
