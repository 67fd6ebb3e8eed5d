package main

import (
	"fmt"
	"maps"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/authcallout"
)

const testNS = "toposched"

// chartSecrets is what the chart's hook asks for by default.
func chartSecrets(tenants ...string) kubeSecrets {
	return kubeSecrets{
		Prefix:         events.DefaultPrefix,
		Account:        "TOPOSCHED",
		ServicesSecret: "toposched-service-nkeys",
		Services:       []string{"analysis", "placement", "optimizer", "discovery", "kube"},
		CalloutSecret:  "toposched-auth-callout",
		AdminSecret:    "toposched-admin-nkeys",
		RolesSecret:    "toposched-nats-roles",
		Tenants:        tenants,
		TenantPrefix:   "toposched-tenant-",
	}
}

func runSecrets(t *testing.T, k kubeSecrets, client *fake.Clientset) []secretResult {
	t.Helper()
	res, err := k.run(t.Context(), client.CoreV1().Secrets(testNS))
	if err != nil {
		t.Fatalf("kube-secrets: %v", err)
	}
	return res
}

// secretsData is every Secret's data in the namespace, by name.
func secretsData(t *testing.T, client *fake.Clientset) map[string]map[string][]byte {
	t.Helper()
	list, err := client.CoreV1().Secrets(testNS).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string][]byte{}
	for _, s := range list.Items {
		out[s.Name] = s.Data
	}
	return out
}

func keysOf(m map[string][]byte) []string { return slices.Sorted(maps.Keys(m)) }

// seedPublic is the public key of a seed as a Secret holds it.
func seedPublic(t *testing.T, what string, b []byte) string {
	t.Helper()
	kp, err := nkeys.ParseDecoratedNKey(b)
	if err != nil {
		t.Fatalf("%s: no seed: %v", what, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// writes counts the creates and updates of Secrets the client saw.
func writes(client *fake.Clientset) (creates, updates []string) {
	for _, a := range client.Actions() {
		switch a.GetVerb() {
		case "create":
			creates = append(creates, objectOf(a).Name)
		case "update":
			updates = append(updates, objectOf(a).Name)
		}
	}
	return creates, updates
}

// The first run creates every Secret the chart mounts with the keys it
// mounts, roles.conf lets in each seed with its role's permissions and
// turns the auth callout on with the issuer's key; a second run keeps
// every byte and writes nothing; a tenant added later gets its Secret and
// roles.conf its user, and nothing else changes.
func TestKubeSecretsIdempotent(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // where the seeds are made, and must be gone from
	client := fake.NewClientset()
	runSecrets(t, chartSecrets("research"), client)
	if left, _ := os.ReadDir(tmp); len(left) > 0 {
		t.Errorf("the seeds' temporary directory is left: %v", left)
	}
	first := secretsData(t, client)
	want := map[string][]string{
		"toposched-service-nkeys":   {"analysis.nk", "discovery.nk", "kube.nk", "optimizer.nk", "placement.nk"},
		"toposched-auth-callout":    {"auth-callout-issuer.seed", "auth-callout.nk"},
		"toposched-admin-nkeys":     {"launcher.nk", "policy-admin.nk"},
		"toposched-nats-roles":      {"roles.conf", "sys-password"},
		"toposched-tenant-research": {"tenant.nk"},
	}
	if len(first) != len(want) {
		t.Errorf("secrets %v, want %v", slices.Sorted(maps.Keys(first)), slices.Sorted(maps.Keys(want)))
	}
	for name, keys := range want {
		if got := keysOf(first[name]); !slices.Equal(got, keys) {
			t.Errorf("secret %s: keys %v, want %v", name, got, keys)
		}
	}
	opts := confOptions(t, string(first["toposched-nats-roles"]["roles.conf"]))
	users := map[string]bool{}
	for _, u := range opts.Nkeys {
		users[u.Nkey] = true
	}
	for name, data := range first {
		for key, b := range data {
			if !strings.HasSuffix(key, ".nk") {
				continue
			}
			if pub := seedPublic(t, name+"/"+key, b); !users[pub] {
				t.Errorf("roles.conf has no user for %s/%s (%s)", name, key, pub)
			}
		}
	}
	if len(users) != 9 {
		t.Errorf("roles.conf has %d users, want 9 (5 services, launcher, policy-admin, a tenant, the callout's)", len(users))
	}
	issuer := seedPublic(t, "issuer", first["toposched-auth-callout"][authcallout.IssuerFile])
	if opts.AuthCallout == nil || opts.AuthCallout.Issuer != issuer {
		t.Errorf("roles.conf's auth callout %+v, want issuer %s", opts.AuthCallout, issuer)
	}

	client.ClearActions()
	res := runSecrets(t, chartSecrets("research"), client)
	if creates, updates := writes(client); len(creates)+len(updates) > 0 {
		t.Errorf("a second run wrote: created %v, updated %v", creates, updates)
	}
	for _, r := range res {
		if r.Wrote || len(r.Added) > 0 {
			t.Errorf("second run: %+v", r)
		}
	}
	if again := secretsData(t, client); !equalData(first, again) {
		t.Errorf("a second run changed the Secrets")
	}

	client.ClearActions()
	runSecrets(t, chartSecrets("research", "vision"), client)
	creates, updates := writes(client)
	if !slices.Equal(creates, []string{"toposched-tenant-vision"}) || !slices.Equal(updates, []string{"toposched-nats-roles"}) {
		t.Errorf("a tenant added: created %v, updated %v; want the tenant's Secret created and roles.conf's updated", creates, updates)
	}
	third := secretsData(t, client)
	for name, data := range first {
		for key, b := range data {
			if key == rolesConfKey {
				continue
			}
			if string(third[name][key]) != string(b) {
				t.Errorf("a tenant added: %s/%s changed", name, key)
			}
		}
	}
	vision := seedPublic(t, "vision", third["toposched-tenant-vision"][tenantSeedKey])
	conf := string(third["toposched-nats-roles"][rolesConfKey])
	if !strings.Contains(conf, vision) || len(confOptions(t, conf).Nkeys) != 10 {
		t.Errorf("roles.conf after a tenant added lacks its user %s, or has not 10 users:\n%s", vision, conf)
	}
}

func equalData(a, b map[string]map[string][]byte) bool {
	return maps.EqualFunc(a, b, func(x, y map[string][]byte) bool {
		return maps.EqualFunc(x, y, func(p, q []byte) bool { return string(p) == string(q) })
	})
}

// A Secret that holds some of its seeds (made by hand, or before the
// Kubernetes service was turned on) keeps them, gets the missing ones,
// and keeps its other keys; sys-password made by an administrator is
// kept; a key that is no seed fails the run, naming it, and is not
// overwritten.
func TestKubeSecretsKeepAndAdd(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	client := fake.NewClientset(
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "toposched-service-nkeys", Namespace: testNS},
			Data: map[string][]byte{"placement.nk": seed, "notes": []byte("site")}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "toposched-nats-roles", Namespace: testNS},
			Data: map[string][]byte{"sys-password": []byte("admin-made")}},
	)
	res := runSecrets(t, chartSecrets(), client)
	got := secretsData(t, client)
	svc := got["toposched-service-nkeys"]
	if string(svc["placement.nk"]) != string(seed) || string(svc["notes"]) != "site" {
		t.Errorf("placement.nk or another key was not kept: %v", keysOf(svc))
	}
	if k := keysOf(svc); !slices.Equal(k, []string{"analysis.nk", "discovery.nk", "kube.nk", "notes", "optimizer.nk", "placement.nk"}) {
		t.Errorf("services' keys %v", k)
	}
	if string(got["toposched-nats-roles"]["sys-password"]) != "admin-made" {
		t.Error("sys-password was not kept")
	}
	if !strings.Contains(string(got["toposched-nats-roles"][rolesConfKey]), strconv.Quote(pub)) {
		t.Error("roles.conf does not let in the kept placement seed")
	}
	if r := res[0]; !slices.Equal(r.Kept, []string{"placement.nk"}) || len(r.Added) != 4 || r.Created {
		t.Errorf("services' result %+v", r)
	}

	bad := fake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "toposched-admin-nkeys", Namespace: testNS},
		Data: map[string][]byte{"launcher.nk": []byte("not a seed")}})
	_, err = chartSecrets().run(t.Context(), bad.CoreV1().Secrets(testNS))
	if err == nil || !strings.Contains(err.Error(), "toposched-admin-nkeys") || !strings.Contains(err.Error(), "no user nkey seed") {
		t.Errorf("a key that is no seed: error %v, want one naming the Secret and saying it is no seed", err)
	}
	if s, _ := bad.CoreV1().Secrets(testNS).Get(t.Context(), "toposched-admin-nkeys", metav1.GetOptions{}); string(s.Data["launcher.nk"]) != "not a seed" {
		t.Error("a key that is no seed was overwritten")
	}
}

// Another run that writes a Secret between this run's read and its write
// wins: its seed is the one kept, whether it created the Secret first
// (AlreadyExists) or updated it first (a conflict on the version read),
// so no role ever gets two seeds.
func TestKubeSecretsRace(t *testing.T) {
	other, _ := nkeys.CreateUser()
	otherSeed, _ := other.Seed()
	for _, tc := range []struct {
		name string
		verb string
	}{
		{"created first", "create"},
		{"updated first", "update"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			if tc.verb == "update" {
				// The Secret as both runs found it: no seed yet.
				client = fake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "toposched-service-nkeys", Namespace: testNS}})
			}
			raced := false
			client.PrependReactor(tc.verb, "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
				s := objectOf(a)
				if raced || s.Name != "toposched-service-nkeys" {
					return false, nil, nil
				}
				raced = true
				// The other run's write lands first, with its own seeds.
				won := s.DeepCopy()
				won.Data = maps.Clone(won.Data)
				won.Data["placement.nk"] = otherSeed
				tracker := client.Tracker()
				gvr := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
				if tc.verb == "create" {
					if err := tracker.Create(gvr, won, testNS); err != nil {
						t.Fatal(err)
					}
					return true, nil, apierrors.NewAlreadyExists(gvr.GroupResource(), s.Name)
				}
				if err := tracker.Update(gvr, won, testNS); err != nil {
					t.Fatal(err)
				}
				return true, nil, apierrors.NewConflict(gvr.GroupResource(), s.Name, fmt.Errorf("the object has been modified"))
			})
			runSecrets(t, chartSecrets(), client)
			if !raced {
				t.Fatalf("no %s of the services' Secret", tc.verb)
			}
			got := secretsData(t, client)
			if string(got["toposched-service-nkeys"]["placement.nk"]) != string(otherSeed) {
				t.Error("the other run's placement seed was replaced")
			}
			otherPub, _ := other.PublicKey()
			if !strings.Contains(string(got["toposched-nats-roles"][rolesConfKey]), otherPub) {
				t.Error("roles.conf does not let in the seed the Secret holds")
			}
		})
	}
}

// objectOf is the Secret a create or an update writes.
func objectOf(a k8stesting.Action) *corev1.Secret {
	if a, ok := a.(interface{ GetObject() runtime.Object }); ok {
		if s, ok := a.GetObject().(*corev1.Secret); ok {
			return s
		}
	}
	return &corev1.Secret{}
}

// decodeTenantSecret is tenantSecretName's inverse, ok false for a name
// it does not write.
func decodeTenantSecret(prefix, name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return "", false
	}
	var b strings.Builder
	for i := 0; i < len(rest); i++ {
		if rest[i] != '-' {
			b.WriteByte(rest[i])
			continue
		}
		if i+3 > len(rest) {
			return "", false
		}
		v, err := strconv.ParseUint(rest[i+1:i+3], 16, 8)
		if err != nil {
			return "", false
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), true
}

// A tenant's Secret's name is a valid Kubernetes name for every tenant
// name and is read back as that tenant alone: names that differ only in
// case, punctuation or escapes get Secrets of their own.
func TestTenantSecretNamesAreInjective(t *testing.T) {
	tenants := []string{
		"research", "Research", "RESEARCH", "re-search", "re_search", "re.search", "re search",
		"re-2dsearch", "re%2Dsearch", "re%2dsearch", "-", "--", "a-", "-a", ".", "..", "a.b", "a/b",
		"ünïcode", "研究", "x\x00y", strings.Repeat("z", 60), strings.Repeat("-", 60),
	}
	seen := map[string]string{}
	for _, tenant := range tenants {
		name := tenantSecretName("toposched-tenant-", tenant)
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			t.Errorf("tenant %q: secret %q: %v", tenant, name, errs)
		}
		if was, ok := seen[name]; ok {
			t.Errorf("tenants %q and %q share the Secret %s", was, tenant, name)
		}
		seen[name] = tenant
		if back, ok := decodeTenantSecret("toposched-tenant-", name); !ok || back != tenant {
			t.Errorf("secret %s reads back as %q, want %q", name, back, tenant)
		}
	}
	// The Helm chart's template writes the same names (deploy/helm/check,
	// TestIssueSecretNames, expects these).
	for tenant, want := range map[string]string{
		"research":     "site-tenant-research",
		"Research Lab": "site-tenant--52esearch-20-4cab",
		"ml-research":  "site-tenant-ml-2dresearch",
		"研究":           "site-tenant--e7-a0-94-e7-a9-b6",
	} {
		if got := tenantSecretName("site-tenant-", tenant); got != want {
			t.Errorf("tenant %q: %s, want %s", tenant, got, want)
		}
	}
}

// A tenant's Secret says whose seed it holds, and the plan refuses names
// Kubernetes would.
func TestKubeSecretsPlan(t *testing.T) {
	client := fake.NewClientset()
	runSecrets(t, chartSecrets("Research Lab"), client)
	s, err := client.CoreV1().Secrets(testNS).Get(t.Context(), tenantSecretName("toposched-tenant-", "Research Lab"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	role, _ := events.TenantScope("Research Lab").Role()
	if s.Annotations[tenantAnnotation] != "Research Lab" || s.Annotations[roleAnnotation] != role {
		t.Errorf("tenant Secret annotations %v", s.Annotations)
	}
	if back, _ := url.PathUnescape(strings.TrimPrefix(role, "tenant-")); back != "Research Lab" {
		t.Errorf("role %s", role)
	}
	for _, tc := range []struct {
		name string
		edit func(*kubeSecrets)
		want string
	}{
		{"unknown service", func(k *kubeSecrets) { k.Services = append(k.Services, "sched") }, `--service "sched"`},
		{"no services", func(k *kubeSecrets) { k.Services = nil }, "--services-secret and --service"},
		{"bad name", func(k *kubeSecrets) { k.AdminSecret = "Admin_Seeds" }, `secret name "Admin_Seeds"`},
		{"one Secret twice", func(k *kubeSecrets) { k.CalloutSecret = k.ServicesSecret }, "named twice"},
		{"roles Secret twice", func(k *kubeSecrets) { k.AdminSecret = k.RolesSecret }, "named twice"},
		{"no roles Secret", func(k *kubeSecrets) { k.RolesSecret = "" }, "--roles-secret"},
	} {
		k := chartSecrets()
		tc.edit(&k)
		_, err := k.plan()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
}

// The command's output says, Secret by Secret, what was kept and made.
func TestKubeSecretsOutput(t *testing.T) {
	var b strings.Builder
	err := writeSecretResults(&b, "ns", []secretResult{
		{Name: "a", Created: true, Wrote: true, Added: []string{"x.nk"}},
		{Name: "b", Kept: []string{"y.nk"}},
		{Name: "c", Wrote: true, Kept: []string{"sys-password"}, Added: []string{"roles.conf"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "secret ns/a created: new x.nk\nsecret ns/b unchanged: kept y.nk\nsecret ns/c updated: kept sys-password; new roles.conf\n"
	if b.String() != want {
		t.Errorf("output\n%s\nwant\n%s", b.String(), want)
	}
}

// A roles.conf an administrator wrote (from before the chart issued the
// Secrets) is not replaced without --adopt: its users this run does not
// issue would be signed out. With it, it is, and it is the command's from
// then on (labelled), so later runs need no --adopt.
func TestKubeSecretsAdoptsOnlyWhenTold(t *testing.T) {
	handMade := "accounts { TOPOSCHED { users = [ {nkey: UADMINMADE} ] } }\n"
	client := fake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "toposched-nats-roles", Namespace: testNS},
		Data: map[string][]byte{rolesConfKey: []byte(handMade), sysPasswordKey: []byte("admin-made")}})
	k := chartSecrets()
	_, err := k.run(t.Context(), client.CoreV1().Secrets(testNS))
	if err == nil || !strings.Contains(err.Error(), "toposched-nats-roles") || !strings.Contains(err.Error(), "--adopt") {
		t.Fatalf("a hand-made roles.conf: error %v, want one naming the Secret and --adopt", err)
	}
	if got := secretsData(t, client)["toposched-nats-roles"][rolesConfKey]; string(got) != handMade {
		t.Fatalf("the hand-made roles.conf was changed without --adopt:\n%s", got)
	}

	k.Adopt = true
	runSecrets(t, k, client)
	s, err := client.CoreV1().Secrets(testNS).Get(t.Context(), "toposched-nats-roles", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(s.Data[rolesConfKey]) == handMade || string(s.Data[sysPasswordKey]) != "admin-made" {
		t.Errorf("with --adopt: roles.conf not written, or sys-password not kept")
	}
	if s.Labels["app.kubernetes.io/managed-by"] != managedBy {
		t.Errorf("with --adopt: labels %v, want managed-by %s", s.Labels, managedBy)
	}
	k.Adopt = false
	k.Tenants = []string{"research"}
	runSecrets(t, k, client) // the command's own now: no --adopt needed
}
