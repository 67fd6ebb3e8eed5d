package authcallout

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Keys of a bound ServiceAccount token's user extra, as the API server's
// TokenReview gives them (k8s.io/apiserver/pkg/authentication/serviceaccount):
// the pod the token is bound to, and the node that pod is bound to
// (Kubernetes 1.32 and later put it in every token of a scheduled pod).
const (
	extraPodName  = "authentication.kubernetes.io/pod-name"
	extraPodUID   = "authentication.kubernetes.io/pod-uid"
	extraNodeName = "authentication.kubernetes.io/node-name"
)

// MaxTokenSize bounds the token a client may send: a ServiceAccount token
// is about a kilobyte; anything much larger is refused before the API
// server is asked.
const MaxTokenSize = 16 << 10

// username is the API server's user name of a ServiceAccount's tokens.
func username(sa types.NamespacedName) string {
	return "system:serviceaccount:" + sa.Namespace + ":" + sa.Name
}

// ParseServiceAccount reads NAMESPACE/NAME.
func ParseServiceAccount(s string) (types.NamespacedName, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.ContainsAny(name, "/:") || strings.ContainsAny(ns, ":") {
		return types.NamespacedName{}, fmt.Errorf("service account %q: want NAMESPACE/NAME", s)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}

// Identity is who a token is: the pod it is bound to and that pod's node.
type Identity struct {
	Node   string
	Pod    types.NamespacedName // in the ServiceAccount's namespace
	PodUID string
}

// CheckReview checks what the API server said of a token: authenticated
// for audience, the ServiceAccount sa's, and bound to a pod on a node.
// It returns the pod and the node, or why the token is refused.
func CheckReview(status authv1.TokenReviewStatus, sa types.NamespacedName, audience string) (Identity, error) {
	if !status.Authenticated {
		if status.Error != "" {
			return Identity{}, fmt.Errorf("token not authenticated: %s", status.Error)
		}
		return Identity{}, errors.New("token not authenticated")
	}
	if !slices.Contains(status.Audiences, audience) {
		return Identity{}, fmt.Errorf("token not for audience %q (its audiences: %q)", audience, status.Audiences)
	}
	if status.User.Username != username(sa) {
		return Identity{}, fmt.Errorf("token of %q, not of the agents' ServiceAccount %s", status.User.Username, sa)
	}
	one := func(key string) (string, error) {
		v := status.User.Extra[key]
		if len(v) != 1 || v[0] == "" {
			return "", fmt.Errorf("token without %s (a token bound to a scheduled pod has it: Kubernetes 1.32 or later)", key)
		}
		return v[0], nil
	}
	var id Identity
	var errs []error
	var err error
	id.Node, err = one(extraNodeName)
	errs = append(errs, err)
	id.Pod.Name, err = one(extraPodName)
	errs = append(errs, err)
	id.PodUID, err = one(extraPodUID)
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return Identity{}, err
	}
	id.Pod.Namespace = sa.Namespace
	return id, nil
}

// TokenExpiry reads the expiry (exp) of a JWT without checking its
// signature: call it only on a token the API server has authenticated,
// whose claims are then the API server's own.
func TokenExpiry(token string) (time.Time, error) {
	if len(token) > MaxTokenSize {
		return time.Time{}, fmt.Errorf("token of %d bytes, over %d", len(token), MaxTokenSize)
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, fmt.Errorf("token: %d parts, want a JWT's 3", len(parts))
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, fmt.Errorf("token payload: %w", err)
	}
	var claims struct {
		Exp json.RawMessage `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return time.Time{}, fmt.Errorf("token payload: %w", err)
	}
	if len(claims.Exp) == 0 || string(claims.Exp) == "null" {
		return time.Time{}, errors.New("token without exp: not a bound ServiceAccount token")
	}
	// A NumericDate is a JSON number; the API server writes whole seconds.
	exp, err := strconv.ParseInt(string(claims.Exp), 10, 64)
	if err != nil || exp <= 0 {
		return time.Time{}, fmt.Errorf("token exp %.40q: want whole seconds since 1970", claims.Exp)
	}
	return time.Unix(exp, 0), nil
}
