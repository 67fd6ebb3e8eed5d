package e2e

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// secretsNS is the namespace the credentials' hook writes into.
const secretsNS = "toposched-creds"

// hookSecrets are the Secrets the Helm chart's hook writes with its
// default values and the tenants research and vision: its Role's
// resourceNames.
var hookSecrets = []string{
	"toposched-service-nkeys", "toposched-auth-callout", "toposched-admin-nkeys", "toposched-nats-roles",
	"toposched-tenant-research", "toposched-tenant-vision",
}

// kubeSecretsArgs are the hook Job's arguments (templates/issue.yaml),
// with a kubeconfig in place of the pod's ServiceAccount.
func kubeSecretsArgs(kubeconfig string, tenants ...string) []string {
	args := []string{"roles", "kube-secrets", "--kubeconfig", kubeconfig, "--namespace", secretsNS,
		"--service", "analysis", "--service", "discovery", "--service", "optimizer", "--service", "placement", "--service", "kube",
		"--auth-callout"}
	for _, t := range tenants {
		args = append(args, "--tenant", t)
	}
	return args
}

// secretsIn reads every Secret of the namespace, by name.
func secretsIn(t *testing.T, kc *kubeCluster) map[string]map[string][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
	defer cancel()
	list, err := kc.Client.CoreV1().Secrets(secretsNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string][]byte{}
	for _, s := range list.Items {
		out[s.Name] = s.Data
	}
	return out
}

// newKeys are the keys a run's output says it made ("secret NS/NAME
// created: new a b" or "...: kept x; new a b"), as NAME/KEY.
func newKeys(out string) []string {
	var keys []string
	for _, line := range strings.Split(out, "\n") {
		head, made, ok := strings.Cut(line, " new ")
		if !ok {
			continue
		}
		name := strings.Fields(strings.TrimPrefix(head, "secret "+secretsNS+"/"))[0]
		for _, k := range strings.Fields(made) {
			keys = append(keys, name+"/"+k)
		}
	}
	return keys
}

// TestKubeSecretsHook: toposched roles kube-secrets, as the Helm chart's
// hook runs it, against a real kube-apiserver with no right but the hook
// Role's (get and update of its Secrets by name, create): two runs at
// once make one seed per role between them; a run again keeps every byte
// and writes nothing; a tenant added gets its Secret and a user in
// roles.conf, and nothing else changes; a nats-server on that roles.conf
// lets placement's and the new tenant's seeds in, and the system account
// with sys-password, and refuses a key it does not know.
func TestKubeSecretsHook(t *testing.T) {
	needBinaries(t)
	t.Parallel()
	kc := startKube(t)
	ctx, cancel := context.WithTimeout(t.Context(), kubeCallTimeout)
	defer cancel()
	if _, err := kc.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: secretsNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The chart's hook Role (deploy/helm/check checks the chart renders
	// these rules), given to a user with no other right.
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "toposched-issue"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: hookSecrets, Verbs: []string{"get", "update"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}},
	}}
	if _, err := kc.Client.RbacV1().Roles(secretsNS).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "toposched-issue"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: kubeToposched}}}
	if _, err := kc.Client.RbacV1().RoleBindings(secretsNS).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeconfig := kc.kubeconfigFor(t, kubeToposched)
	run := func(tenants ...string) result {
		t.Helper()
		r := runCmd(t, time.Minute, childEnv(), bins.toposched, kubeSecretsArgs(kubeconfig, tenants...)...)
		if r.code != 0 {
			t.Fatalf("roles kube-secrets: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
		}
		return r
	}

	// Two runs at once: each seed is made by one of them, and the other
	// kept it.
	var wg sync.WaitGroup
	outs := make([]result, 2)
	for i := range outs {
		wg.Go(func() { outs[i] = run("research") })
	}
	wg.Wait()
	t.Logf("two runs at once:\nrun 1:\n%srun 2:\n%s", outs[0].stdout, outs[1].stdout)
	first := secretsIn(t, kc)
	var made []string
	for _, r := range outs {
		made = append(made, newKeys(r.stdout)...)
	}
	for name, data := range first {
		for key := range data {
			if key == "roles.conf" {
				continue // each run writes its own, the same
			}
			if n := strings.Count(" "+strings.Join(made, " ")+" ", " "+name+"/"+key+" "); n != 1 {
				t.Errorf("%s/%s: made by %d runs, want 1\nrun 1:\n%s\nrun 2:\n%s", name, key, n, outs[0].stdout, outs[1].stdout)
			}
		}
	}
	if len(first) != 5 {
		t.Errorf("secrets %v, want the 5 of %v without vision's", slices.Sorted(maps.Keys(first)), hookSecrets)
	}
	conf := string(first["toposched-nats-roles"]["roles.conf"])
	for name, data := range first {
		for key, b := range data {
			if strings.HasSuffix(key, ".nk") && !strings.Contains(conf, seedPub(t, b)) {
				t.Errorf("roles.conf has no user for %s/%s after two runs at once", name, key)
			}
		}
	}

	// Again: nothing written, every byte kept.
	again := run("research")
	if strings.Contains(again.stdout, " new ") || strings.Count(again.stdout, "unchanged") != 5 {
		t.Errorf("a run again changed something:\n%s", again.stdout)
	}
	if !maps.EqualFunc(first, secretsIn(t, kc), func(a, b map[string][]byte) bool {
		return maps.EqualFunc(a, b, func(x, y []byte) bool { return string(x) == string(y) })
	}) {
		t.Error("a run again changed the Secrets' bytes")
	}

	// A tenant added: its Secret, and roles.conf's user; nothing else.
	added := run("research", "vision")
	if got := newKeys(added.stdout); !slices.Equal(got, []string{"toposched-tenant-vision/tenant.nk", "toposched-nats-roles/roles.conf"}) {
		t.Errorf("a tenant added made %v:\n%s", got, added.stdout)
	}
	third := secretsIn(t, kc)
	for name, data := range first {
		for key, b := range data {
			if key != "roles.conf" && string(third[name][key]) != string(b) {
				t.Errorf("a tenant added changed %s/%s", name, key)
			}
		}
	}
	conf = string(third["toposched-nats-roles"]["roles.conf"])
	if len(conf) <= len(string(first["toposched-nats-roles"]["roles.conf"])) || !strings.Contains(conf, seedPub(t, third["toposched-tenant-vision"]["tenant.nk"])) {
		t.Errorf("roles.conf did not grow by vision's user:\n%s", conf)
	}

	// The NATS servers, as the chart's: roles.conf included, the system
	// account's password from sys-password.
	dir := natsConfDir(t, "standalone.conf")
	if err := os.WriteFile(filepath.Join(dir, "auth.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	sysPassword := string(third["toposched-nats-roles"]["sys-password"])
	url, _ := confServer(t, dir, "nats", "NATS_SYS_PASSWORD="+sysPassword)
	seedFile := func(name, key string) string {
		p := filepath.Join(t.TempDir(), key)
		if err := os.WriteFile(p, third[name][key], 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	placement := connectWith(t, url, "placement", nkeyOption(t, seedFile("toposched-service-nkeys", "placement.nk")))
	if err := placement.nc.Flush(); err != nil {
		t.Errorf("placement's seed: %v", err)
	}
	connectWith(t, url, "tenant vision", nkeyOption(t, seedFile("toposched-tenant-vision", "tenant.nk")))
	connectWith(t, url, "sys", nats.UserInfo("sys", sysPassword))

	wrong, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	wrongSeed, _ := wrong.Seed()
	p := filepath.Join(t.TempDir(), "wrong.nk")
	if err := os.WriteFile(p, wrongSeed, 0o600); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, nkeyOption(t, p), nats.Timeout(10*time.Second))
	if err == nil {
		nc.Close()
		t.Fatal("a key roles.conf does not know was let in")
	}
	if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		t.Errorf("a key roles.conf does not know: %v, want an authorization violation", err)
	}
}

func seedPub(t *testing.T, seed []byte) string {
	t.Helper()
	kp, err := nkeys.ParseDecoratedNKey(seed)
	if err != nil {
		t.Fatalf("no seed: %v", err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}
