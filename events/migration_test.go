package events

import (
	"math"
	"testing"
)

func TestBreakEven(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                string
		restart, step, gain float64
		want                float64
	}{
		// 300 s restart, 3 s steps, 0.75 s saved per step: 400 steps of
		// catching up, 1200 s of wall time.
		{"typical", 300, 3, 0.75, 1200},
		{"no gain", 300, 3, 0, 0},
		{"negative gain", 300, 3, -1, 0},
		{"free restart", 0, 3, 0.5, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := BreakEven(tt.restart, tt.step, tt.gain)
			if math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("BreakEven(%v, %v, %v) = %v, want %v", tt.restart, tt.step, tt.gain, got, tt.want)
			}
			if tt.gain <= 0 {
				return
			}
			// At the break-even time both ways have done the same steps.
			steps := got / tt.step
			migrated := (got - tt.restart) / (tt.step - tt.gain)
			if math.Abs(steps-migrated) > 1e-9 {
				t.Errorf("at %v s: %v steps without moving, %v with", got, steps, migrated)
			}
		})
	}
}

func TestMigrationKeys(t *testing.T) {
	t.Parallel()
	for _, v := range []any{&PlacementMigration{JobID: "j"}, &JobMigrationAccepted{JobID: "j"}, &PlacementMigrationRefused{JobID: "j"}} {
		if got := KeyOf(v); got != "j" {
			t.Errorf("KeyOf(%T) = %q, want j", v, got)
		}
		n, err := NameOf(v)
		if err != nil {
			t.Fatalf("NameOf(%T): %v", v, err)
		}
		if got := KeyOfBody(n, []byte(`{"job_id":"j"}`)); got != "j" {
			t.Errorf("KeyOfBody(%s) = %q, want j", n, got)
		}
	}
}
