package bus

import (
	"strings"
	"testing"
	"time"
)

// The zero Transport is what the bus always did: these are the literals
// the bus carried before they were named (HealCheck came later).
func TestDefaultTransportIsTheOldBehaviour(t *testing.T) {
	t.Parallel()
	want := Transport{
		ReconnectWait: 250 * time.Millisecond, MaxReconnects: -1,
		SetupRetryFor: time.Minute, SetupAttemptTimeout: 10 * time.Second,
		SetupRetryInitial: 100 * time.Millisecond, SetupRetryMax: 2 * time.Second,
		HandlerTimeout: 30 * time.Second, CloseGrace: 5 * time.Second,
		HandlerRetries: 5, HandlerRetryInitial: 100 * time.Millisecond, HandlerRetryMax: 5 * time.Second,
		HandlerRetryMultiplier: 2, NakDelay: 2 * time.Second, DeadLetterTimeout: 10 * time.Second,
		AckWait: 30 * time.Second, MaxAckPending: 1024, MaxDeliver: -1, PullExpiry: 5 * time.Second,
		PullPerWorker: 2, PullBase: 8, ReplayFetchSize: 256, HealCheck: 10 * time.Second,
	}
	if got := DefaultTransport(); got != want {
		t.Errorf("DefaultTransport() =\n%+v\nwant\n%+v", got, want)
	}
	if got := DefaultTransport().pullMaxMessages(3); got != 2*3+8 {
		t.Errorf("pullMaxMessages(3) = %d, want 14", got)
	}
	if err := (Transport{}).Validate(); err != nil {
		t.Errorf("zero Transport: %v", err)
	}
	if err := DefaultTransport().Validate(); err != nil {
		t.Errorf("DefaultTransport: %v", err)
	}
	// A set field is kept; the others still default.
	got := Transport{AckWait: time.Minute}.withDefaults()
	if got.AckWait != time.Minute || got.NakDelay != DefaultNakDelay {
		t.Errorf("withDefaults kept AckWait %v, NakDelay %v", got.AckWait, got.NakDelay)
	}
}

func TestTransportValidateNamesTheField(t *testing.T) {
	t.Parallel()
	tests := []struct {
		tr   Transport
		want string
	}{
		{Transport{AckWait: -time.Second}, "AckWait"},
		{Transport{NakDelay: -1}, "NakDelay"},
		{Transport{HandlerTimeout: -1}, "HandlerTimeout"},
		{Transport{HandlerRetries: -1}, "HandlerRetries"},
		{Transport{HandlerRetryMultiplier: 0.5}, "HandlerRetryMultiplier"},
		{Transport{HandlerRetryInitial: 10 * time.Second}, "HandlerRetryInitial"}, // above the default max
		{Transport{SetupRetryInitial: time.Second, SetupRetryMax: time.Millisecond}, "SetupRetryInitial"},
		{Transport{MaxDeliver: -2}, "MaxDeliver"},
		{Transport{MaxAckPending: -5}, "MaxAckPending"},
		{Transport{MaxReconnects: -3}, "MaxReconnects"},
		{Transport{PullPerWorker: -1}, "PullPerWorker"},
		{Transport{ReplayFetchSize: -1}, "ReplayFetchSize"},
		{Transport{PullExpiry: -1}, "PullExpiry"},
		{Transport{HealCheck: -1}, "HealCheck"},
	}
	for _, tc := range tests {
		err := tc.tr.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want it to name %s", tc.tr, err, tc.want)
		}
	}
	// Every problem is reported at once, and Config.Validate includes them.
	err := Config{URL: "nats://x", Transport: Transport{AckWait: -1, NakDelay: -1}}.Validate()
	if err == nil || !strings.Contains(err.Error(), "AckWait") || !strings.Contains(err.Error(), "NakDelay") {
		t.Errorf("Config.Validate() = %v, want AckWait and NakDelay named", err)
	}
	for _, ok := range []Transport{{MaxDeliver: 1}, {MaxAckPending: -1}, {MaxReconnects: 3}, {HandlerRetryMultiplier: 1}} {
		if err := ok.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", ok, err)
		}
	}
}
