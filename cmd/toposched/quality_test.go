package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestQualityQuick(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	root := newRoot()
	root.SetOut(&out)
	root.SetArgs([]string{"quality", "--quick", "--seed", "3"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"(a) single nodes", "within 2% of the optimum:", "(b) fragmented clusters", "median reduction of predicted comm time per step vs blind:"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
}
