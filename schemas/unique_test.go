package schemas

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// uniqueSchemas compiles one schema of arrays with uniqueItems at several
// depths with the vocabulary (ours) and as the library reads it (theirs).
func uniqueSchemas(t testing.TB) (ours, theirs *jsonschema.Schema) {
	schemaText := `{"$id": "https://toposched.dev/test/u.json", "type": "object", "properties": {
		"any": {"type": "array", "uniqueItems": true},
		"ints": {"type": "array", "uniqueItems": true, "items": {"type": "integer", "minimum": 0}},
		"off": {"type": "array", "uniqueItems": false},
		"deep": {"type": "object", "properties": {"in": {"type": "array", "minItems": 1, "uniqueItems": true}}}
	}}`
	return vocabSchemas(t, "https://toposched.dev/test/u.json", schemaText)
}

// FuzzUniqueVocabularyAgrees holds the vocabulary to the library's answers
// on any body: an array under each of the schema's properties.
func FuzzUniqueVocabularyAgrees(f *testing.F) {
	for _, s := range []string{`[1, 1.0]`, `[{"a":1,"b":2},{"b":2,"a":1e0}]`, `["1", 1]`, `[[], {}]`, `[0, false, null]`,
		`[9223372036854775808, 9.223372036854775808e18]`, `[1e-400, 0]`, `[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 3]`} {
		f.Add(s)
	}
	ours, theirs := uniqueSchemas(f)
	f.Fuzz(func(t *testing.T, arr string) {
		for _, body := range []string{`{"any": ` + arr + `}`, `{"ints": ` + arr + `}`, `{"deep": {"in": ` + arr + `}}`} {
			// Through the package's own reading, as Validate reads a
			// body: what it refuses never reaches a schema.
			doc, verr := decode([]byte(body))
			if verr != nil {
				continue
			}
			if got, want := sortedLines(ours.Validate(doc)), sortedLines(theirs.Validate(doc)); got != want {
				t.Errorf("%s: vocabulary says %s\nthe library says %s", body, got, want)
			}
		}
	})
}

// sortedLines is the error's text, its lines sorted.
func sortedLines(err error) string {
	lines := strings.Split(fmt.Sprint(err), "\n")
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// The unique-items vocabulary (unique.go) answers as the library does:
// seeded arrays of up to 30 items (past the library's 20, where it hashes)
// drawn from values that are equal in JSON but spelled apart (1, 1.0,
// 1e0, 10e-1; objects with their keys in another order), values that only
// look alike ("1" and 1, 0 and false, [] and {}), nested arrays and
// objects, and numbers beyond int64, get the same errors from a schema
// compiled with the vocabulary as from the same schema as the library
// reads it, under "items" of each kind and in an object's property
// (errors in any order: Validate sorts them).
func TestUniqueVocabularyAgrees(t *testing.T) {
	t.Parallel()
	ours, theirs := uniqueSchemas(t)
	if ours.Properties["ints"].UniqueItems || ours.Properties["ints"].Extensions == nil || ours.Properties["off"].Extensions != nil {
		t.Fatal("uniqueItems: true is not rewritten, or false is")
	}
	pool := []string{`null`, `true`, `false`, `0`, `-0`, `0.0`, `1`, `1.0`, `1e0`, `10e-1`, `"1"`, `2`, `3`, `7`, `"a"`, `"A"`,
		`"é"`, `"\u00e9"`, `[]`, `{}`, `[1]`, `[1.0]`, `[1,2]`, `[2,1]`, `{"a":1,"b":2}`, `{"b":2,"a":1}`, `{"b":2.0,"a":1e0}`,
		`{"a":[1,{"c":null}]}`, `{"a":[1.0,{"c":null}]}`, `9223372036854775807`, `9223372036854775808`, `9.223372036854775808e18`,
		`123456789012345678901234567890`, `1.23456789012345678901234567890e29`, `0.1`, `1e-1`, `0.10000000000000000001`, `-5`, `-5.0`}
	rng := rand.New(rand.NewPCG(3, 4))
	checked, dups := 0, 0
	for range 3000 {
		n := rng.IntN(31)
		items := make([]string, n)
		for i := range items {
			if rng.IntN(3) == 0 {
				items[i] = fmt.Sprint(rng.IntN(1000))
			} else {
				items[i] = pool[rng.IntN(len(pool))]
			}
		}
		arr := "[" + strings.Join(items, ",") + "]"
		for _, prop := range []string{"any", "ints", "off", "deep"} {
			body := fmt.Sprintf(`{%q: %s}`, prop, arr)
			if prop == "deep" {
				body = fmt.Sprintf(`{"deep": {"in": %s}}`, arr)
			}
			doc, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(body)))
			if err != nil {
				t.Fatal(err)
			}
			// The vocabulary's error comes after the items' own, where
			// the library's comes first; Validate sorts problems, so
			// only the set matters.
			got, want := sortedLines(ours.Validate(doc)), sortedLines(theirs.Validate(doc))
			if got != want {
				t.Errorf("%s: vocabulary says %s\nthe library says %s", body, got, want)
			}
			if prop == "any" && strings.Contains(want, "are equal") {
				dups++
			}
			checked++
		}
	}
	// Arrays with and without a duplicate, each in number.
	if checked < 12000 || dups < 500 || dups > 3000-500 {
		t.Fatalf("%d bodies checked, %d of 3,000 arrays with a duplicate", checked, dups)
	}
}
