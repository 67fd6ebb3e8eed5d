package authcallout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	authv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

const (
	// Subject is where the servers send their authorization requests, in
	// the callout account (server.AuthCalloutSubject).
	Subject = server.AuthCalloutSubject
	// QueueGroup shares the requests among the responders: every replica
	// of toposched kube answers, any one of them each request.
	QueueGroup = "toposched-auth-callout"
	// DefaultAudience is the audience of the agents' tokens: a token for
	// the API server (or for anything else) is no NATS sign-in.
	DefaultAudience = "toposched-nats"
	// DefaultMaxTTL bounds a user JWT's life below its token's: a deleted
	// pod's agent, whose token no longer passes review, is signed out
	// within it however long its token was issued for.
	DefaultMaxTTL = time.Hour
	// DefaultWorkers is how many requests are checked at once: each waits
	// on the API server, and after a NATS restart every agent signs in
	// again within the servers' authorization timeout.
	DefaultWorkers = 32
	// reviewTimeout bounds the API calls of one request: the server gives
	// up on an answer after its authorization timeout (2 s by default).
	reviewTimeout = 5 * time.Second
)

// Config is what a Responder needs.
type Config struct {
	// Issuer is the account key the servers' auth_callout names: it signs
	// the responses and the user JWTs.
	Issuer nkeys.KeyPair
	// Account is the account the agents are placed in (toposched roles
	// conf --account).
	Account string
	// ServiceAccount is the agents': no other's tokens are accepted.
	ServiceAccount types.NamespacedName
	// Audience the tokens must be for (DefaultAudience when empty).
	Audience string
	// Role gives the user name and the permissions of node's agent
	// (agent-<node>, roles.go's), or why the node has none.
	Role func(node string) (name string, perms *server.Permissions, err error)
	// Kube reviews the tokens and reads the pods.
	Kube kubernetes.Interface
	// MaxTTL bounds a user JWT's life (DefaultMaxTTL when zero).
	MaxTTL time.Duration
	// Workers is how many requests are checked at once (DefaultWorkers
	// when zero).
	Workers int
	Log     *slog.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Responder answers the servers' authorization requests.
type Responder struct {
	cfg    Config
	issuer string
}

// New checks cfg and makes a Responder.
func New(cfg Config) (*Responder, error) {
	if cfg.Issuer == nil {
		return nil, errors.New("auth callout: no issuer key")
	}
	pub, err := cfg.Issuer.PublicKey()
	if err != nil || !nkeys.IsValidPublicAccountKey(pub) {
		return nil, fmt.Errorf("auth callout: the issuer %q is no account key", pub)
	}
	var errs []error
	if cfg.Account == "" {
		errs = append(errs, errors.New("auth callout: no account to place the agents in"))
	}
	if cfg.ServiceAccount.Namespace == "" || cfg.ServiceAccount.Name == "" {
		errs = append(errs, errors.New("auth callout: no agents' ServiceAccount"))
	}
	if cfg.Role == nil || cfg.Kube == nil {
		errs = append(errs, errors.New("auth callout: no roles or no Kubernetes client"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Audience == "" {
		cfg.Audience = DefaultAudience
	}
	if cfg.MaxTTL <= 0 {
		cfg.MaxTTL = DefaultMaxTTL
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Responder{cfg: cfg, issuer: pub}, nil
}

// Issuer is the issuer's public key: the servers' auth_callout issuer.
func (r *Responder) Issuer() string { return r.issuer }

// Listen answers the requests that reach nc (a user of the callout
// account), in the queue group of every responder, from its return (the
// subscription is then in place on the server) until stop, which waits
// for the answers under way.
func (r *Responder) Listen(nc *nats.Conn) (stop func(), err error) {
	ctx, cancel := context.WithCancel(context.Background())
	sem := make(chan struct{}, r.cfg.Workers)
	var wg sync.WaitGroup
	sub, err := nc.QueueSubscribe(Subject, QueueGroup, func(m *nats.Msg) {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			resp := r.Respond(ctx, m.Data)
			if resp == nil {
				return // no request to answer: the server gives up
			}
			if err := m.Respond(resp); err != nil {
				r.cfg.Log.Warn("auth callout: answer not sent", "err", err)
			}
		})
	})
	if err == nil {
		err = nc.Flush()
	}
	if err != nil {
		cancel()
		return nil, fmt.Errorf("auth callout: subscribe %s: %w", Subject, err)
	}
	r.cfg.Log.Info("auth callout: answering the agents' sign-ins", "subject", Subject, "issuer", r.issuer,
		"service_account", r.cfg.ServiceAccount.String(), "audience", r.cfg.Audience, "account", r.cfg.Account)
	return func() {
		_ = sub.Unsubscribe() // a closed connection has dropped it already
		cancel()
		wg.Wait()
	}, nil
}

// Respond answers one request (an authorization request JWT the server
// signed): a response JWT signed by the issuer, holding either the user
// JWT of the node's agent or why the sign-in is refused. It returns nil
// for a request it cannot read, which has no one to answer.
func (r *Responder) Respond(ctx context.Context, request []byte) []byte {
	req, err := jwt.DecodeAuthorizationRequestClaims(string(request))
	if err != nil {
		r.cfg.Log.Warn("auth callout: unreadable request", "err", err)
		return nil
	}
	vr := jwt.CreateValidationResults()
	req.Validate(vr)
	if errs := vr.Errors(); len(errs) > 0 || req.Server.ID == "" {
		r.cfg.Log.Warn("auth callout: invalid request", "err", errors.Join(errs...), "server", req.Server.Name)
		return nil
	}
	log := r.cfg.Log.With("client_host", req.ClientInformation.Host, "client_name", req.ClientInformation.Name, "server", req.Server.Name)
	resp := jwt.NewAuthorizationResponseClaims(req.UserNkey)
	resp.Audience = req.Server.ID
	user, id, err := r.authorize(ctx, req)
	if err != nil {
		log.Warn("auth callout: sign-in refused", "reason", err.Error())
		resp.Error = err.Error()
	} else {
		log.Info("auth callout: agent signed in", "user", user.Name, "node", id.Node, "pod", id.Pod.String(), "expires", time.Unix(user.Expires, 0).UTC())
		resp.Jwt, err = user.Encode(r.cfg.Issuer)
		if err != nil {
			log.Error("auth callout: sign the user", "err", err)
			resp.Jwt, resp.Error = "", "the callout could not sign the user"
		}
	}
	out, err := resp.Encode(r.cfg.Issuer)
	if err != nil {
		log.Error("auth callout: sign the response", "err", err)
		return nil
	}
	return []byte(out)
}

// authorize checks the request's token and makes the user of its node's
// agent, or says why not.
func (r *Responder) authorize(ctx context.Context, req *jwt.AuthorizationRequestClaims) (*jwt.UserClaims, Identity, error) {
	token := req.ConnectOptions.Token
	switch {
	case token == "":
		return nil, Identity{}, errors.New("no token: toposched's users sign in with their nkeys, node agents with their pod's ServiceAccount token")
	case len(token) > MaxTokenSize:
		return nil, Identity{}, fmt.Errorf("token of %d bytes, over %d", len(token), MaxTokenSize)
	}
	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	id, expires, err := r.review(ctx, token)
	if err != nil {
		return nil, id, err
	}
	name, perms, err := r.cfg.Role(id.Node)
	if err != nil {
		return nil, id, fmt.Errorf("node %q: %w", id.Node, err)
	}
	now := r.cfg.Now()
	if !expires.After(now) {
		return nil, id, fmt.Errorf("token expired at %s", expires.UTC().Format(time.RFC3339))
	}
	if limit := now.Add(r.cfg.MaxTTL); expires.After(limit) {
		expires = limit
	}
	uc := jwt.NewUserClaims(req.UserNkey)
	uc.Name = name
	// Not operator mode: the servers place the user in the account the
	// audience names.
	uc.Audience = r.cfg.Account
	uc.Expires = expires.Unix()
	uc.Permissions = UserPermissions(perms)
	uc.AllowedConnectionTypes.Add(jwt.ConnectionTypeStandard)
	vr := jwt.CreateValidationResults()
	uc.Validate(vr)
	if errs := vr.Errors(); len(errs) > 0 {
		return nil, id, fmt.Errorf("the user of node %q: %w", id.Node, errors.Join(errs...))
	}
	return uc, id, nil
}

// review asks the API server who token is, and checks that its pod is
// bound to the node the token names.
func (r *Responder) review(ctx context.Context, token string) (Identity, time.Time, error) {
	tr, err := r.cfg.Kube.AuthenticationV1().TokenReviews().Create(ctx, &authv1.TokenReview{
		Spec: authv1.TokenReviewSpec{Token: token, Audiences: []string{r.cfg.Audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		return Identity{}, time.Time{}, fmt.Errorf("token review: %w", err)
	}
	id, err := CheckReview(tr.Status, r.cfg.ServiceAccount, r.cfg.Audience)
	if err != nil {
		return id, time.Time{}, err
	}
	expires, err := TokenExpiry(token)
	if err != nil {
		return id, time.Time{}, err
	}
	pod, err := r.cfg.Kube.CoreV1().Pods(id.Pod.Namespace).Get(ctx, id.Pod.Name, metav1.GetOptions{})
	if err != nil {
		return id, time.Time{}, fmt.Errorf("the token's pod %s: %w", id.Pod, err)
	}
	switch {
	case string(pod.UID) != id.PodUID:
		return id, time.Time{}, fmt.Errorf("the token's pod %s (uid %s) is gone: %s has uid %s", id.Pod, id.PodUID, id.Pod, pod.UID)
	case pod.Spec.NodeName != id.Node:
		return id, time.Time{}, fmt.Errorf("the token names node %q, its pod %s is bound to %q", id.Node, id.Pod, pod.Spec.NodeName)
	case pod.Spec.ServiceAccountName != r.cfg.ServiceAccount.Name:
		return id, time.Time{}, fmt.Errorf("the token's pod %s runs as ServiceAccount %q, not the agents'", id.Pod, pod.Spec.ServiceAccountName)
	}
	return id, expires, nil
}
