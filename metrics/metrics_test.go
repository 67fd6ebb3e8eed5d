package metrics

import (
	"errors"
	"testing"
	"time"
)

func TestHandledCountsErrorsAndRedeliveries(t *testing.T) {
	m := New()
	m.Handled("h", time.Millisecond, nil, 1)
	m.Handled("h", time.Millisecond, errors.New("boom"), 2)
	m.Handled("h", time.Millisecond, nil, 3)
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, mt := range f.GetMetric() {
			if c := mt.GetCounter(); c != nil {
				got[f.GetName()] += c.GetValue()
			}
		}
	}
	if got["toposched_handler_errors_total"] != 1 || got["toposched_handler_redeliveries_total"] != 2 {
		t.Fatalf("errors %v, redeliveries %v; want 1 and 2", got["toposched_handler_errors_total"], got["toposched_handler_redeliveries_total"])
	}
}
