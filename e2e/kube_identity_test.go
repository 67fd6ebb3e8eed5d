package e2e

// Node agents on Kubernetes sign in to NATS with their pod's ServiceAccount
// token (docs/security.md; deploy/README.md, Kubernetes): a real
// nats-server configured by toposched roles conf --auth-callout-issuer, a
// real API server, and toposched kube answering the servers' auth callout
// with the chart's ClusterRole rules.

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// agentAudience is the audience of the agents' tokens, the responder's
	// default (--agent-token-audience) and the chart's.
	agentAudience = "toposched-nats"
	agentSA       = "toposched-agent"
)

// agentTokenPod creates a pod of ServiceAccount sa bound to node (as the
// DaemonSet's pods are, by nodeName) and returns it.
func (c *kubeCluster) agentTokenPod(t *testing.T, name, sa, node string) *corev1.Pod {
	t.Helper()
	return c.createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: kubeNS},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			ServiceAccountName:           sa,
			AutomountServiceAccountToken: new(false),
			Containers:                   []corev1.Container{{Name: "agent", Image: "registry.invalid/toposched:latest"}},
		},
	})
}

// podToken asks the API server for a token of the pod's ServiceAccount,
// bound to the pod, for audience: what the kubelet does for a projected
// serviceAccountToken volume.
func (c *kubeCluster) podToken(t *testing.T, pod *corev1.Pod, audience string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
	defer cancel()
	tr, err := c.Client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authv1.TokenRequest{
		Spec: authv1.TokenRequestSpec{
			Audiences:         []string{audience},
			ExpirationSeconds: new(int64(3600)),
			BoundObjectRef:    &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of pod %s for %s: %v", pod.Name, audience, err)
	}
	return tr.Status.Token
}

// resign is token with its claims changed by edit and signed again with
// the cluster's ServiceAccount key, under the same key id: a token the API
// server issued but with another expiry, which the API server itself
// checks (the TokenRequest API issues none shorter than ten minutes).
func (c *kubeCluster) resign(t *testing.T, token string, edit func(claims map[string]any)) string {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("token: %d parts", len(parts))
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	claims := map[string]any{}
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	edit(claims)
	payload, err = json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	signed := parts[0] + "." + base64.RawURLEncoding.EncodeToString(payload)
	pemKey, err := os.ReadFile(filepath.Join(c.Dir, "sa.key"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(pemKey)
	key, err := x509.ParsePKCS1PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(signed))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// tokenPub publishes body on subject through JetStream with the real nats
// CLI, signed in with token.
func tokenPub(t *testing.T, url, token, subject, body string) result {
	t.Helper()
	return natsCLIWith(t, url, []string{"--token", token}, "--timeout", "2s", "pub", subject, body, "--jetstream")
}

// calloutRefused connects with token and returns nil if the servers
// refused the sign-in.
func calloutRefused(url, token string) error {
	nc, err := nats.Connect(url, nats.Token(token), nats.Timeout(10*time.Second))
	if err == nil {
		nc.Close()
		return errors.New("signed in")
	}
	if !errors.Is(err, nats.ErrAuthorization) {
		return fmt.Errorf("connect: %w, want an authorization violation", err)
	}
	return nil
}

// TestKubeAgentIdentity: a node's agent signs in with its pod's
// ServiceAccount token and may publish its node's subjects only; a token
// of another ServiceAccount, for another audience, or expired is refused;
// another node's pod gets that node's rights; the user expires with its
// token, and the agent signs in again with the token file rewritten (as
// the kubelet refreshes it); the real agent runs on its token.
func TestKubeAgentIdentity(t *testing.T) {
	needBinaries(t)
	t.Parallel()
	kc := startKube(t)
	kc.grant(t, kubeRules(t))
	kc.addNode(t, "node-a", nil)
	kc.addNode(t, "node-b", nil)
	ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
	defer cancel()
	for _, sa := range []string{agentSA, "other"} {
		if _, err := kc.Client.CoreV1().ServiceAccounts(kubeNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("service account %s: %v", sa, err)
		}
	}
	podA := kc.agentTokenPod(t, "agent-a", agentSA, "node-a")
	podB := kc.agentTokenPod(t, "agent-b", agentSA, "node-b")
	otherA := kc.agentTokenPod(t, "other-a", "other", "node-a")

	// The administrator's keys and the servers' configuration.
	creds := t.TempDir()
	issueRoles(t, creds, "--services", "--auth-callout")
	issuer := filepath.Join(creds, "auth-callout-issuer.seed")
	r := runCmd(t, 30*time.Second, childEnv(), bins.toposched, "roles", "conf", "--dir", creds, "--auth-callout-issuer", issuer)
	if r.code != 0 {
		t.Fatalf("roles conf --auth-callout-issuer: exit %d\n%s", r.code, r.stderr)
	}
	conf := natsConfDir(t, "standalone.conf")
	if err := os.WriteFile(filepath.Join(conf, "auth.conf"), []byte(r.stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	url, natsProc := confServer(t, conf, "nats")

	// toposched kube, as the Helm chart runs it: its own role, the chart's
	// ClusterRole rules, and the responder.
	kube := startProc(t, "kube", childEnv(), bins.toposched, "kube", "--nats-url", url,
		"--nats-nkey", seedIn(t, creds, "kube"), "--kubeconfig", kc.kubeconfigFor(t, kubeToposched), "--lease-ttl", "2s",
		"--auth-callout-issuer-seed", issuer, "--auth-callout-nkey", seedIn(t, creds, "auth-callout"),
		"--agent-service-account", kubeNS+"/"+agentSA)
	waitFor(t, time.Minute, func() (bool, string) {
		mustBeAlive(t, kube)
		out := kube.output()
		return strings.Contains(out, "answering the agents' sign-ins") && strings.Contains(out, "scheduling pods"),
			"toposched kube has not logged 'answering the agents' sign-ins' and 'scheduling pods'"
	})
	operator := connectWith(t, url, "operator", nkeyOption(t, seedIn(t, creds, "operator")))

	tokenA := kc.podToken(t, podA, agentAudience)
	tokenB := kc.podToken(t, podB, agentAudience)
	hbA, hbB := "toposched.agent.heartbeat.node-a", "toposched.agent.heartbeat.node-b"
	exitedB := "toposched.runtime.ranks_exited.node-b"

	t.Run("own node only", func(t *testing.T) {
		mustBeStored(t, tokenPub(t, url, tokenA, hbA, "probe-a"), "node-a's agent", hbA)
		mustBeRefused(t, tokenPub(t, url, tokenA, hbB, "probe-a-as-b"), "node-a's agent", hbB)
		mustBeRefused(t, tokenPub(t, url, tokenA, exitedB, "probe-a-as-b"), "node-a's agent", exitedB)
		mustBeRefused(t, tokenPub(t, url, tokenA, subjectDecided, "probe-a"), "node-a's agent", subjectDecided)
	})
	t.Run("another node's pod gets its node", func(t *testing.T) {
		mustBeStored(t, tokenPub(t, url, tokenB, hbB, "probe-b"), "node-b's agent", hbB)
		mustBeRefused(t, tokenPub(t, url, tokenB, hbA, "probe-b-as-a"), "node-b's agent", hbA)
	})
	t.Run("refused", func(t *testing.T) {
		for _, tc := range []struct{ name, token string }{
			{"another ServiceAccount's token", kc.podToken(t, otherA, agentAudience)},
			{"a token for another audience", kc.podToken(t, podA, "https://kubernetes.default.svc")},
			{"an expired token", kc.resign(t, tokenA, func(c map[string]any) {
				now := time.Now()
				c["iat"], c["nbf"], c["exp"] = now.Add(-20*time.Minute).Unix(), now.Add(-20*time.Minute).Unix(), now.Add(-10*time.Minute).Unix()
			})},
			{"a token not the API server's", tokenA[:strings.LastIndex(tokenA, ".")] + ".c2lnbmF0dXJl"},
			{"no token", ""},
		} {
			if err := calloutRefused(url, tc.token); err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
		}
		for _, reason := range []string{"not of the agents' ServiceAccount", "token not authenticated"} {
			if !strings.Contains(kube.output(), reason) {
				t.Errorf("toposched kube logged no refusal %q", reason)
			}
		}
	})
	t.Run("expires with its token and signs in again", func(t *testing.T) {
		// A token the API server accepts for 25 s more; then the token
		// file holds a fresh one, as the kubelet rewrites it.
		short := kc.resign(t, tokenA, func(c map[string]any) { c["exp"] = time.Now().Add(25 * time.Second).Unix() })
		file := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(file, []byte(short), 0o600); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var asyncErrs []string
		reconnected := make(chan struct{}, 1)
		nc, err := nats.Connect(url, nats.TokenHandler(func() string {
			b, _ := os.ReadFile(file)
			return string(b)
		}), nats.IgnoreAuthErrorAbort(), nats.MaxReconnects(-1), nats.ReconnectWait(200*time.Millisecond),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				mu.Lock()
				defer mu.Unlock()
				asyncErrs = append(asyncErrs, err.Error())
			}),
			nats.ReconnectHandler(func(*nats.Conn) {
				select {
				case reconnected <- struct{}{}:
				default:
				}
			}))
		if err != nil {
			t.Fatalf("sign in with a token of 25 s: %v", err)
		}
		defer nc.Close()
		signedIn := time.Now()
		if err := os.WriteFile(file, []byte(tokenA), 0o600); err != nil {
			t.Fatal(err)
		}
		select {
		case <-reconnected:
		case <-time.After(90 * time.Second):
			t.Fatalf("not signed out and in again within 90 s (errors %q)", asyncErrs)
		}
		mu.Lock()
		defer mu.Unlock()
		if !slices.Contains(asyncErrs, nats.ErrAuthExpired.Error()) {
			t.Errorf("signed out for %q, want the user's expiry (%v)", asyncErrs, nats.ErrAuthExpired)
		}
		t.Logf("signed out %s after signing in with a token of 25 s, signed in again with the rewritten file", time.Since(signedIn).Round(time.Second))
	})
	t.Run("a tenant added by a reload", func(t *testing.T) {
		// roles issue and roles conf again, the servers reloaded (as the
		// NATS chart's reloader does when the Secret changes): the
		// tenant's user signs in, not through the callout, and the agents
		// still do through it.
		issueRoles(t, creds, "--tenant", "research")
		r := runCmd(t, 30*time.Second, childEnv(), bins.toposched, "roles", "conf", "--dir", creds, "--auth-callout-issuer", issuer)
		if r.code != 0 {
			t.Fatalf("roles conf: exit %d\n%s", r.code, r.stderr)
		}
		if err := os.WriteFile(filepath.Join(conf, "auth.conf"), []byte(r.stdout), 0o600); err != nil {
			t.Fatal(err)
		}
		reloads := strings.Count(natsProc.output(), "Reloaded server configuration")
		natsProc.signal(t, syscall.SIGHUP)
		waitFor(t, 30*time.Second, func() (bool, string) {
			mustBeAlive(t, natsProc)
			out := natsProc.output()
			if strings.Contains(out, "config reload not supported") {
				t.Fatalf("nats-server refused the reload:\n%s", out)
			}
			return strings.Count(out, "Reloaded server configuration") > reloads, "nats-server has not logged 'Reloaded server configuration'"
		})
		connectWith(t, url, "tenant-research", nkeyOption(t, seedIn(t, creds, "tenant-research")))
		mustBeStored(t, tokenPub(t, url, tokenA, hbA, "probe-after-reload"), "node-a's agent after a reload", hbA)
	})
	t.Run("the agent on its token", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(file, []byte(tokenA), 0o600); err != nil {
			t.Fatal(err)
		}
		cluster := filepath.Join(t.TempDir(), "cluster.yaml")
		if err := os.WriteFile(cluster, []byte("name: kube\nnodes:\n  - {name: node-a, model: dgx-h100}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		agent := startProc(t, "agent node-a", childEnv(), bins.toposched, "--nats-url", url, "agent", "--node", "node-a",
			"--nats-token-file", file, "--exec", "--cluster", cluster, "--state-dir", t.TempDir(), "--address", "127.0.0.1",
			"--heartbeat", "500ms", "--run-as-allow", runAsAllow(t))
		waitFor(t, time.Minute, func() (bool, string) {
			mustBeAlive(t, agent)
			return strings.Contains(agent.output(), "launcher ready"), "the agent has not logged 'launcher ready'"
		})
		// The agent stream keeps a node's last heartbeat: the agent's own,
		// which names it, once its sign-in and publish went through.
		id := regexp.MustCompile(`msg="launcher ready".* agent=(\S+)`).FindStringSubmatch(agent.output())
		if id == nil {
			t.Fatalf("no agent id in the agent's log:\n%s", agent.output())
		}
		waitFor(t, 30*time.Second, func() (bool, string) {
			mustBeAlive(t, agent)
			if last := lastOn(t, operator.js, "TOPOSCHED_AGENT", hbA); !strings.Contains(string(last), `"`+id[1]+`"`) {
				return false, fmt.Sprintf("node-a's last heartbeat is not agent %s's: %s", id[1], last)
			}
			return true, ""
		})
		if strings.Contains(agent.output(), "Permissions Violation") {
			t.Errorf("the agent was refused something:\n%s", agent.output())
		}
	})
}
