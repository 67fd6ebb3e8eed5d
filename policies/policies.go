// Package policies holds toposched's Rego (v1) placement policies and the
// engine that compiles, sandboxes, tests and evaluates them in-process.
//
// A policy set is a directory tree of .rego files (tests in *_test.rego) and
// an optional data.json whose object becomes the base of data (for instance
// data.toposched.config). Two documents are read:
//
//   - data.toposched.nodes (input: NodeInput): deny and warn rules that
//     filter nodes before placement;
//   - data.toposched.placement (input: PlacementInput): deny, warn and score
//     rules that judge a candidate placement.
//
// Each policy is one package under either document, such as
// toposched.placement.tp_nvlink; its deny and warn rules are sets of objects
// {"msg": string, "code": string} and its score rule a number (a penalty,
// added to the candidate's cost; the scores of all packages are summed).
//
// Compile parses every file, compiles the set with restricted capabilities
// (see Forbidden), runs the set's Rego tests and refuses the set if any
// fails; errors name file and line (Errors). A Set is immutable and safe for
// concurrent use; its queries are prepared once.
//
// A set reaches the operator from a directory (Watch) or pushed to a NATS KV
// bucket as one bundle of all its files (Push, WatchKV in kv.go).
package policies

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/tester"
)

//go:embed default/*.rego
var embedded embed.FS

// Default is the shipped policy set, the files of policies/default.
var Default fs.FS = mustSub(embedded, "default")

func mustSub(f fs.FS, dir string) fs.FS {
	s, err := fs.Sub(f, dir)
	if err != nil {
		panic(err)
	}
	return s
}

// Entry points of a set.
const (
	NodesDoc     = "toposched.nodes"
	PlacementDoc = "toposched.placement"
)

// DataFile is the optional file of a set whose JSON object is the base of
// data.
const DataFile = "data.json"

// Forbidden lists the built-ins removed from the capabilities a set is
// compiled with: those reaching outside the process and those whose result
// is not a function of their arguments (clock, randomness, environment). A
// name ending in "." removes every built-in with that prefix. A policy
// calling one fails to compile ("undefined function http.send"). Network
// access is also closed (AllowNet empty).
var Forbidden = []string{
	"http.send",
	"net.",
	"opa.runtime",
	"time.now_ns",
	"rand.",
	"uuid.rfc4122",
	"trace",
	"io.jwt.decode_verify", // reads the clock for exp/nbf
	"crypto.x509.parse_and_verify_certificates", // reads the clock
	"crypto.x509.parse_and_verify_certificates_with_options",
	"providers.aws.sign_req", // reads the clock
}

// Capabilities returns the capabilities sets are compiled with: this OPA
// version's, less Forbidden, with no network access.
func Capabilities() *ast.Capabilities {
	caps := ast.CapabilitiesForThisVersion()
	kept := caps.Builtins[:0]
	for _, b := range caps.Builtins {
		if !forbidden(b.Name) {
			kept = append(kept, b)
		}
	}
	caps.Builtins = kept
	caps.AllowNet = []string{}
	return caps
}

func forbidden(name string) bool {
	for _, f := range Forbidden {
		if name == f || strings.HasSuffix(f, ".") && strings.HasPrefix(name, f) {
			return true
		}
	}
	return false
}

// Error is one reason a set was refused: a parse, compile or data error, or
// a failed Rego test. File is the path inside the set, Line 1-based (0 when
// unknown).
type Error struct {
	File string `json:"file"`
	Line int    `json:"line"`
	Msg  string `json:"msg"`
	// Code is OPA's error code (rego_parse_error, rego_type_error,
	// rego_compile_error, ...), or test_failed, test_error, data_error,
	// io_error.
	Code string `json:"code"`
}

func (e *Error) Error() string {
	loc := e.File
	if e.Line > 0 {
		loc = fmt.Sprintf("%s:%d", e.File, e.Line)
	}
	if loc == "" {
		return e.Code + ": " + e.Msg
	}
	return loc + ": " + e.Code + ": " + e.Msg
}

// Errors is every reason a set was refused, in file and line order. It is
// the error Compile, Check and Watch report.
type Errors []*Error

func (es Errors) Error() string {
	s := make([]string, len(es))
	for i, e := range es {
		s[i] = e.Error()
	}
	return strings.Join(s, "; ")
}

func fromAST(err error) Errors {
	var aes ast.Errors
	if errors.As(err, &aes) {
		out := make(Errors, 0, len(aes))
		for _, ae := range aes {
			e := &Error{Msg: ae.Message, Code: ae.Code}
			if ae.Location != nil {
				e.File, e.Line = ae.Location.File, ae.Location.Row
			}
			out = append(out, e)
		}
		return out
	}
	var ae *ast.Error
	if errors.As(err, &ae) {
		return fromAST(ast.Errors{ae})
	}
	return Errors{{Msg: err.Error(), Code: "rego_error"}}
}

// TestResult is the outcome of one Rego test of a set.
type TestResult struct {
	Package string `json:"package"`
	Name    string `json:"name"`
	File    string `json:"file"`
	Line    int    `json:"line"`
	Pass    bool   `json:"pass"`
	Skip    bool   `json:"skip,omitempty"`
	// Error is the evaluation error of a test that could not run.
	Error string `json:"error,omitempty"`
	// Output is what the test printed.
	Output string `json:"output,omitempty"`
}

// Set is a compiled, tested policy set. It is immutable and safe for
// concurrent use.
type Set struct {
	// Name is the name it was compiled under (a directory, "default").
	Name string
	// Revision is the SHA-256 of its files (names and contents), hex.
	Revision string
	// Files are its .rego files and data file, sorted.
	Files []string
	// Tests are the results of its Rego tests, all passed.
	Tests []TestResult

	nodes, placement        rego.PreparedEvalQuery
	nodePkgs, placementPkgs []policyPkg
	cache                   nodeCache
	// reads is what the policies read of a node's input: the cache's key.
	reads inputReads
	// readsJobID: some rule may read a job's id (ReadsJobID).
	readsJobID bool
}

// policyPkg is a package under a document: its name (the
// Violation.Policy of its rules).
type policyPkg struct {
	name string
	// verdicts are the verdict rules (deny, warn, score) it defines, each
	// with the variable of the document's query that holds its value.
	verdicts []verdict
}

type verdict struct {
	rule, bound string
}

// verdictRules are the rules of a package that the set reads.
var verdictRules = []string{"deny", "warn", "score"}

// verdictQuery is the query of a document's verdicts: one expression per
// verdict rule its packages define (packagesUnder), each the rule's value
// in an array of at most one (a complete rule may be undefined, which
// would make the whole query undefined), bound to the verdict's variable.
// It evaluates the verdicts and what they depend on, where a query of the
// whole document evaluated every rule of every package and built the
// document to hand back: a third of a placement evaluation, and its
// garbage.
func verdictQuery(pkgs []policyPkg) string {
	var exprs []string
	for _, p := range pkgs {
		path := ast.MustParseRef("data." + p.name)
		for _, v := range p.verdicts {
			exprs = append(exprs, fmt.Sprintf("%s := [x | x := %s]", v.bound, path.Append(ast.StringTerm(v.rule))))
		}
	}
	if len(exprs) == 0 {
		return "true"
	}
	return strings.Join(exprs, "; ")
}

// Compile compiles and tests the set in fsys (see Check). name names the
// set in errors and logs.
func Compile(fsys fs.FS, name string) (*Set, error) {
	s, _, err := Check(context.Background(), fsys, name)
	return s, err
}

// CompileDir compiles the set in directory dir.
func CompileDir(dir string) (*Set, error) { return Compile(os.DirFS(dir), dir) }

// Check parses every .rego file of fsys (Rego v1), compiles the set with
// Capabilities, runs its tests and prepares its queries. It returns the
// test results whenever the tests ran; the Set is nil, and err an Errors,
// when anything failed.
func Check(ctx context.Context, fsys fs.FS, name string) (*Set, []TestResult, error) {
	src, err := readSet(fsys)
	if err != nil {
		return nil, nil, err
	}
	return compileSources(ctx, src, name)
}

// sources is a set as read from its files.
type sources struct {
	files    map[string][]byte // .rego files and data.json, by path
	revision string
}

func readSet(fsys fs.FS) (*sources, error) {
	s := &sources{files: map[string][]byte{}}
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return fs.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".rego") && p != DataFile {
			return nil
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		s.files[p] = b
		return nil
	})
	if err != nil {
		return nil, Errors{{Msg: err.Error(), Code: "io_error"}}
	}
	s.revision = revisionOf(s.files)
	return s, nil
}

// revisionOf is the revision of a set's files: the same files give the
// same revision whether read from a directory or a pushed bundle.
func revisionOf(files map[string][]byte) string {
	h := sha256.New()
	for _, p := range slices.Sorted(mapsKeys(files)) {
		h.Write(fmt.Appendf(nil, "%s\x00%d\x00", p, len(files[p])))
		h.Write(files[p])
	}
	return hex.EncodeToString(h.Sum(nil))
}

func mapsKeys(m map[string][]byte) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func isTest(p string) bool { return strings.HasSuffix(p, "_test.rego") }

func compileSources(ctx context.Context, src *sources, name string) (*Set, []TestResult, error) {
	files := slices.Sorted(mapsKeys(src.files))
	var errs Errors
	modules := map[string]*ast.Module{} // every module, tests included
	prod := map[string]*ast.Module{}    // without tests
	data := map[string]any{}
	popts := ast.ParserOptions{RegoVersion: ast.RegoV1, ProcessAnnotation: true}
	for _, p := range files {
		if p == DataFile {
			if err := json.Unmarshal(src.files[p], &data); err != nil {
				errs = append(errs, &Error{File: p, Msg: err.Error(), Code: "data_error"})
			}
			continue
		}
		m, err := ast.ParseModuleWithOpts(p, string(src.files[p]), popts)
		if err != nil {
			errs = append(errs, fromAST(err)...)
			continue
		}
		modules[p] = m
		if !isTest(p) {
			prod[p] = m
		}
	}
	if len(errs) > 0 {
		return nil, nil, errs
	}
	if len(modules) == 0 {
		return nil, nil, Errors{{Msg: "no .rego files", Code: "io_error", File: name}}
	}

	// The production compiler: what queries run against.
	comp := newCompiler()
	if comp.Compile(prod); comp.Failed() {
		return nil, nil, sortErrs(fromAST(comp.Errors))
	}

	// The tests, with their own compiler (the runner adds stages to it).
	store := inmem.NewFromObject(data)
	results, err := runTests(ctx, modules, store)
	if err != nil {
		return nil, nil, sortErrs(fromAST(err))
	}
	for _, r := range results {
		switch {
		case r.Pass || r.Skip:
		case r.Error != "":
			errs = append(errs, &Error{File: r.File, Line: r.Line, Code: "test_error", Msg: r.Package + "." + r.Name + ": " + r.Error})
		default:
			errs = append(errs, &Error{File: r.File, Line: r.Line, Code: "test_failed", Msg: r.Package + "." + r.Name + " failed"})
		}
	}
	if len(errs) > 0 {
		return nil, results, sortErrs(errs)
	}

	s := &Set{Name: name, Revision: src.revision, Files: files, Tests: results}
	s.nodePkgs = packagesUnder(prod, NodesDoc)
	s.reads = readsOf(comp)
	s.readsJobID = readsJobID(comp)
	s.placementPkgs = packagesUnder(prod, PlacementDoc)
	prep := func(pkgs []policyPkg) (rego.PreparedEvalQuery, error) {
		return rego.New(
			rego.Query(verdictQuery(pkgs)),
			rego.Compiler(comp),
			rego.Store(store),
			rego.StrictBuiltinErrors(true),
		).PrepareForEval(ctx)
	}
	if s.nodes, err = prep(s.nodePkgs); err != nil {
		return nil, results, fromAST(err)
	}
	if s.placement, err = prep(s.placementPkgs); err != nil {
		return nil, results, fromAST(err)
	}
	s.cache.init()
	return s, results, nil
}

func newCompiler() *ast.Compiler {
	return ast.NewCompiler().
		WithCapabilities(Capabilities()).
		WithStrict(true).
		WithDefaultRegoVersion(ast.RegoV1)
}

func runTests(ctx context.Context, modules map[string]*ast.Module, store storage.Store) ([]TestResult, error) {
	txn, err := store.NewTransaction(ctx)
	if err != nil {
		return nil, err
	}
	defer store.Abort(ctx, txn)
	ch, err := tester.NewRunner().
		SetCompiler(newCompiler()).
		SetStore(store).
		SetModules(modules).
		SetDefaultRegoVersion(ast.RegoV1).
		RaiseBuiltinErrors(true).
		CapturePrintOutput(true).
		RunTests(ctx, txn)
	if err != nil {
		return nil, err
	}
	var out []TestResult
	for r := range ch {
		tr := TestResult{Package: strings.TrimPrefix(r.Package, "data."), Name: r.Name, Pass: r.Pass(), Skip: r.Skip, Output: string(r.Output)}
		if r.Location != nil {
			tr.File, tr.Line = r.Location.File, r.Location.Row
		}
		if r.Error != nil {
			tr.Error = r.Error.Error()
		}
		out = append(out, tr)
	}
	slices.SortFunc(out, func(a, b TestResult) int {
		if c := strings.Compare(a.File, b.File); c != 0 {
			return c
		}
		return a.Line - b.Line
	})
	return out, nil
}

func sortErrs(es Errors) Errors {
	slices.SortStableFunc(es, func(a, b *Error) int {
		if c := strings.Compare(a.File, b.File); c != 0 {
			return c
		}
		return a.Line - b.Line
	})
	return es
}

// packagesUnder lists the packages at or under data.<doc>, sorted, with
// the verdict rules each defines and their variables in the document's
// query (v0, v1, ...). The paths compare as refs, so that a package whose
// next segment is no identifier (toposched.placement["gpu-quota"]) is
// under the document too.
func packagesUnder(mods map[string]*ast.Module, doc string) []policyPkg {
	under := ast.MustParseRef("data." + doc)
	defines := map[string]map[string]bool{} // package -> rule names
	for _, m := range mods {
		if !m.Package.Path.HasPrefix(under) {
			continue
		}
		name := strings.TrimPrefix(m.Package.Path.String(), "data.")
		if defines[name] == nil {
			defines[name] = map[string]bool{}
		}
		for _, r := range m.Rules {
			// The rule's first name: deny.x contains ... makes deny an
			// object, which reads as no verdict, as the document did.
			defines[name][r.Head.Ref()[0].String()] = true
		}
	}
	out := make([]policyPkg, 0, len(defines))
	n := 0
	for _, name := range slices.Sorted(maps.Keys(defines)) {
		p := policyPkg{name: name}
		for _, rule := range verdictRules {
			if defines[name][rule] {
				p.verdicts = append(p.verdicts, verdict{rule: rule, bound: fmt.Sprintf("v%d", n)})
				n++
			}
		}
		out = append(out, p)
	}
	return out
}

// String names the set and its revision.
func (s *Set) String() string {
	return fmt.Sprintf("policy set %s@%s (%d files)", s.Name, short(s.Revision), len(s.Files))
}

func short(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}
