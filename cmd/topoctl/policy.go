package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/toposched/toposched/internal/textout"
	"github.com/toposched/toposched/policies"
)

func newPolicy(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Work with Rego placement policy sets",
	}
	cmd.AddCommand(newPolicyTest(g), newPolicyPush(g), newPolicyShow(g))
	return cmd
}

func newPolicyTest(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "test [DIR]",
		Short: "Compile a policy set as the operator does and run its Rego tests",
		Long: `test compiles every .rego file of DIR (Rego v1) with the operator's restricted
built-ins (no http.send, net.*, opa.runtime, clock or randomness), runs the
*_test.rego tests and prints each test's outcome and a summary. It exits
non-zero when a file does not compile (naming file and line) or a test fails.
Without DIR it tests the shipped set.`,
		Example: "  topoctl policy test policies/default",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			fsys := policies.Default
			name, prefix := "default", ""
			if len(args) == 1 {
				st, err := os.Stat(args[0])
				if err != nil {
					return err
				}
				if !st.IsDir() {
					return fmt.Errorf("%s: not a directory", args[0])
				}
				fsys, name, prefix = os.DirFS(args[0]), args[0], args[0]
			}
			return policyTest(cmd, g, fsys, name, prefix)
		},
	}
}

func policyTest(cmd *cobra.Command, g *globals, fsys fs.FS, name, prefix string) error {
	out := cmd.OutOrStdout()
	set, results, err := policies.Check(cmd.Context(), fsys, name)
	var errs policies.Errors
	if err != nil && !errors.As(err, &errs) {
		return err
	}
	for _, e := range errs {
		if e.File != "" {
			e.File = filepath.Join(prefix, e.File)
		}
	}
	for i := range results {
		results[i].File = filepath.Join(prefix, results[i].File)
	}
	passed, failed := 0, 0
	for _, r := range results {
		if r.Pass || r.Skip {
			passed++
		} else {
			failed++
		}
	}
	if g.format == "json" {
		rev := ""
		if set != nil {
			rev = set.Revision
		}
		if err := json.NewEncoder(out).Encode(struct {
			Revision string                `json:"revision,omitempty"`
			Tests    []policies.TestResult `json:"tests"`
			Errors   policies.Errors       `json:"errors,omitempty"`
			Passed   int                   `json:"passed"`
			Failed   int                   `json:"failed"`
		}{rev, results, errs, passed, failed}); err != nil {
			return err
		}
	} else if err := writePolicyTests(out, results, errs, passed, failed); err != nil {
		return err
	}
	switch {
	case results == nil && len(errs) > 0:
		return fmt.Errorf("policy set %s does not compile (%d error(s))", name, len(errs))
	case failed > 0:
		return fmt.Errorf("policy set %s: %d test(s) failed", name, failed)
	case len(errs) > 0:
		return fmt.Errorf("policy set %s refused: %w", name, errs)
	}
	return nil
}

func writePolicyTests(out io.Writer, results []policies.TestResult, errs policies.Errors, passed, failed int) error {
	w := textout.New(out)
	for _, e := range errs {
		if e.Code != "test_failed" && e.Code != "test_error" {
			w.Println(e.Error())
		}
	}
	for _, r := range results {
		outcome := "PASS"
		switch {
		case r.Skip:
			outcome = "SKIP"
		case r.Error != "":
			outcome = "ERROR"
		case !r.Pass:
			outcome = "FAIL"
		}
		w.Printf("%-5s %s.%s (%s:%d)", outcome, r.Package, r.Name, r.File, r.Line)
		if r.Error != "" {
			w.Printf(": %s", r.Error)
		}
		w.Println()
		if !r.Pass && r.Output != "" {
			w.Print(r.Output)
		}
	}
	if len(errs) == 0 || passed+failed > 0 {
		w.Printf("%d passed, %d failed\n", passed, failed)
	}
	return w.Err()
}
