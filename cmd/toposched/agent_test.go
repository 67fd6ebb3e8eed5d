package main

import (
	"bytes"
	"testing"
)

// runAgent runs toposched agent with args, as the command line would.
func runAgent(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"agent"}, args...))
	err := root.Execute()
	return out.String(), err
}
