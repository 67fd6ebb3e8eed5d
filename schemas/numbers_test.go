package schemas

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// vocabSchemas compiles a test schema, at id, as compile does (its plain
// numeric schemas and uniqueItems rewritten into the package's vocabulary:
// ours) and as the library reads it (theirs).
func vocabSchemas(t testing.TB, id, schemaText string) (ours, theirs *jsonschema.Schema) {
	t.Helper()
	compile := func(rewrite bool) *jsonschema.Schema {
		doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schemaText))
		if err != nil {
			t.Fatal(err)
		}
		c := jsonschema.NewCompiler()
		if rewrite {
			rewriteNumbers(doc)
			rewriteUnique(doc)
			c.RegisterVocabulary(numberVocab)
			c.RegisterVocabulary(uniqueVocab)
			c.AssertVocabs()
		}
		if err := c.AddResource(id, doc); err != nil {
			t.Fatal(err)
		}
		s, err := c.Compile(id)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	return compile(true), compile(false)
}

// The number vocabulary (numbers.go) answers as the library does: seeded
// values of every JSON type, numbers at, near and far from each bound
// (plain integers, decimals, exponents, beyond int64 and float64), against
// integer and number schemas with integer, decimal and huge bounds, get
// the same errors, in the same words, from a schema compiled with the
// vocabulary and from the same schema compiled as the library reads it.
func TestNumberVocabularyAgrees(t *testing.T) {
	t.Parallel()
	schemaText := `{"$id": "https://toposched.dev/test/n.json", "type": "object", "properties": {
		"i": {"type": "integer"},
		"i0": {"type": "integer", "minimum": 0, "description": "d"},
		"i1": {"type": "integer", "minimum": 1, "maximum": 65535},
		"ix": {"type": "integer", "exclusiveMinimum": 0, "maximum": 64},
		"n0": {"type": "number", "minimum": 0},
		"nx": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
		"nd": {"type": "number", "minimum": 0.1, "exclusiveMaximum": 2.5e3},
		"nb": {"type": "number", "maximum": 1e400, "minimum": -9223372036854775809},
		"nm": {"type": "number", "multipleOf": 0.5},
		"im": {"type": "integer", "multipleOf": 3, "minimum": -6},
		"arr": {"type": "array", "items": {"type": "integer", "minimum": 2}},
		"keep": {"type": "integer", "enum": [1, 2]}
	}}`
	ours, theirs := vocabSchemas(t, "https://toposched.dev/test/n.json", schemaText)
	if ext := ours.Properties["i1"].Extensions; len(ext) != 1 || ours.Properties["keep"].Extensions != nil {
		t.Fatalf("the plain numeric schemas are not rewritten, or one with enum is")
	}
	values := []string{`null`, `true`, `"7"`, `[]`, `{}`, `0`, `-0`, `1`, `-1`, `2`, `3`, `64`, `65`, `65535`, `65536`,
		`0.5`, `1.0`, `1e0`, `1E2`, `-6`, `-7`, `-9`, `0.1`, `0.09999999999999999999`, `0.10000000000000000001`,
		`2500`, `2499.9999999999999999`, `2.5e3`, `1e400`, `-1e400`, `9223372036854775807`, `9223372036854775808`,
		`-9223372036854775809`, `-9223372036854775810`, `123456789012345678901234567890`, `1e-400`, `-1e-400`, `1.5`, `2.25`}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 400 {
		switch rng.IntN(4) {
		case 0:
			values = append(values, fmt.Sprint(rng.IntN(200)-100))
		case 1:
			values = append(values, fmt.Sprintf("%.*f", rng.IntN(20), rng.Float64()*3-1))
		case 2:
			values = append(values, fmt.Sprintf("%de%d", rng.IntN(2000)-1000, rng.IntN(10)-5))
		default:
			values = append(values, fmt.Sprint(rng.Int64()))
		}
	}
	checked := 0
	for _, prop := range []string{"i", "i0", "i1", "ix", "n0", "nx", "nd", "nb", "nm", "im", "arr", "keep"} {
		for _, v := range values {
			body := fmt.Sprintf(`{%q: %s}`, prop, v)
			if prop == "arr" {
				body = fmt.Sprintf(`{"arr": [3, %s, 2]}`, v)
			}
			doc, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(body)))
			if err != nil {
				continue // not JSON (a decimal Sprintf spelled oddly)
			}
			got, want := fmt.Sprint(ours.Validate(doc)), fmt.Sprint(theirs.Validate(doc))
			if got != want {
				t.Errorf("%s: vocabulary says %s\nthe library says %s", body, got, want)
			}
			checked++
		}
	}
	if checked < 3000 {
		t.Fatalf("only %d bodies checked", checked)
	}
}
