package main

import (
	"context"
	"encoding/json"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/policies"
	"github.com/toposched/toposched/services/operator"
)

func TestPolicyPushRefusesBrokenSetBeforeNATS(t *testing.T) {
	// Nothing listens on port 1: a push that got as far as connecting
	// would fail with a connection error instead.
	for _, tc := range []struct {
		dir  string
		want string
	}{
		{"syntax", "../../policies/testdata/syntax/broken.rego:"},
		{"failing", "../../policies/testdata/failing/always_test.rego:9: test_failed"},
		{"forbidden", "../../policies/testdata/forbidden/http.rego:4: rego_type_error: undefined function http.send"},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			out, err := runPolicy("--nats-url", "nats://127.0.0.1:1", "policy", "push", "../../policies/testdata/"+tc.dir)
			if err == nil || !strings.Contains(err.Error(), "nothing pushed") {
				t.Fatalf("err %v, want a local refusal\n%s", err, out)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("output lacks %q:\n%s", tc.want, out)
			}
		})
	}
}

func TestPolicyPushAndShow(t *testing.T) {
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "operator")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	op, err := operator.New(operator.Config{Services: []string{operator.Placement}, Replica: "r1"},
		operator.Deps{Bus: b, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	stop, err := operator.Background(ctx, op)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	}()
	url := srv.ClientURL()

	dir := filepath.Join(t.TempDir(), "lab")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	err = fs.WalkDir(policies.Default, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(policies.Default, p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, p), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	// Differ from the shipped set, which is in force already.
	if err := os.WriteFile(filepath.Join(dir, "data.json"), []byte(`{"lab":{"note":"pushed by the topoctl test"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	want, err := policies.CompileDir(dir)
	if err != nil {
		t.Fatal(err)
	}

	out, err := runPolicy("--nats-url", url, "policy", "push", dir)
	if err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	for _, w := range []string{"pushed lab@" + want.Revision[:12], "applied by r1: lab@" + want.Revision[:12] + " from kv", "tests passed"} {
		if !strings.Contains(out, w) {
			t.Errorf("push output lacks %q:\n%s", w, out)
		}
	}
	if got := op.PlacementService().Policies().Revision; got != want.Revision {
		t.Errorf("in force %s, want %s", got, want.Revision)
	}

	out, err = runPolicy("--nats-url", url, "policy", "show")
	if err != nil {
		t.Fatalf("show: %v\n%s", err, out)
	}
	for _, w := range []string{"pushed: lab@" + want.Revision[:12], "r1  ", want.Revision[:12] + "  kv"} {
		if !strings.Contains(out, w) {
			t.Errorf("show output lacks %q:\n%s", w, out)
		}
	}

	out, err = runPolicy("--nats-url", url, "policy", "show", "-o", "json")
	if err != nil {
		t.Fatalf("show -o json: %v\n%s", err, out)
	}
	var v struct {
		Pushed struct {
			Revision string `json:"revision"`
		} `json:"pushed"`
		Replicas []struct {
			Replica  string `json:"replica"`
			Revision string `json:"revision"`
		} `json:"replicas"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil || v.Pushed.Revision != want.Revision ||
		len(v.Replicas) != 1 || v.Replicas[0].Revision != want.Revision {
		t.Errorf("show -o json: %+v %v\n%s", v, err, out)
	}

	// Without --wait push returns once the value is stored.
	out, err = runPolicy("--nats-url", url, "policy", "push", "--wait=false", "--name", "again", dir)
	if err != nil || !strings.Contains(out, "pushed again@") || strings.Contains(out, "applied by") {
		t.Errorf("push --wait=false: %v\n%s", err, out)
	}
}
