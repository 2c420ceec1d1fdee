package ferrytest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
)

// Match selects outbox events; a zero field matches every event.
type Match struct {
	Topic, Key, Type string
	// Payload, when set, must return true for the event's payload.
	// PayloadJSON builds one for a JSON payload.
	Payload func(payload []byte) bool
	// Count, when above zero, is how many events must match exactly
	// (RequireEmitted); otherwise at least one must.
	Count int
}

// PayloadJSON returns a Match.Payload that decodes a JSON payload into a T
// and passes it to fn; a payload that does not decode does not match.
func PayloadJSON[T any](fn func(T) bool) func([]byte) bool {
	return func(p []byte) bool {
		var v T
		if err := json.Unmarshal(p, &v); err != nil {
			return false
		}
		return fn(v)
	}
}

func (m Match) String() string {
	var parts []string
	for _, f := range []struct{ name, v string }{{"topic", m.Topic}, {"key", m.Key}, {"type", m.Type}} {
		if f.v != "" {
			parts = append(parts, fmt.Sprintf("%s %q", f.name, f.v))
		}
	}
	if m.Payload != nil {
		parts = append(parts, "a payload predicate")
	}
	if len(parts) == 0 {
		return "any event"
	}
	return strings.Join(parts, ", ")
}

// readLimit bounds what an assertion reads of the outbox.
const readLimit = 10_000

// RequireEmittedTx fails the test unless tx sees events in the outbox that
// match m (its own, uncommitted ones among them), and returns them, oldest
// first.
func RequireEmittedTx[TTx any](t testing.TB, drv ferrydriver.OutboxReader[TTx], tx TTx, m Match) []*ferryevent.Event {
	t.Helper()
	evs, err := drv.OutboxEventsTx(context.Background(), tx, m.params())
	if err != nil {
		t.Fatalf("ferrytest: read the outbox in the transaction: %v", err)
		return nil
	}
	return requireEmitted(t, evs, m, "the transaction")
}

// RequireNotEmittedTx fails the test if tx sees an event in the outbox that
// matches m.
func RequireNotEmittedTx[TTx any](t testing.TB, drv ferrydriver.OutboxReader[TTx], tx TTx, m Match) {
	t.Helper()
	evs, err := drv.OutboxEventsTx(context.Background(), tx, m.params())
	if err != nil {
		t.Fatalf("ferrytest: read the outbox in the transaction: %v", err)
		return
	}
	requireNotEmitted(t, evs, m, "the transaction")
}

// RequireEmitted fails the test unless committed events in the outbox match
// m, and returns them, oldest first.
func RequireEmitted[TTx any](t testing.TB, drv ferrydriver.OutboxReader[TTx], m Match) []*ferryevent.Event {
	t.Helper()
	evs, err := drv.OutboxEvents(context.Background(), m.params())
	if err != nil {
		t.Fatalf("ferrytest: read the outbox: %v", err)
		return nil
	}
	return requireEmitted(t, evs, m, "the outbox")
}

// RequireNotEmitted fails the test if a committed event in the outbox
// matches m.
func RequireNotEmitted[TTx any](t testing.TB, drv ferrydriver.OutboxReader[TTx], m Match) {
	t.Helper()
	evs, err := drv.OutboxEvents(context.Background(), m.params())
	if err != nil {
		t.Fatalf("ferrytest: read the outbox: %v", err)
		return
	}
	requireNotEmitted(t, evs, m, "the outbox")
}

func (m Match) params() *ferrydriver.OutboxEventsParams {
	return &ferrydriver.OutboxEventsParams{Topic: m.Topic, Key: m.Key, Type: m.Type, Limit: readLimit}
}

// selected narrows the events the store returned (topic, key and type
// matched already) by the payload predicate.
func (m Match) selected(evs []*ferryevent.Event) []*ferryevent.Event {
	if m.Payload == nil {
		return evs
	}
	var out []*ferryevent.Event
	for _, ev := range evs {
		if m.Payload(ev.Payload) {
			out = append(out, ev)
		}
	}
	return out
}

func requireEmitted(t testing.TB, evs []*ferryevent.Event, m Match, where string) []*ferryevent.Event {
	t.Helper()
	got := m.selected(evs)
	switch {
	case m.Count > 0 && len(got) != m.Count:
		t.Fatalf("ferrytest: %s holds %d event(s) matching %s, want %d:\n%s", where, len(got), m, m.Count, list(got))
	case len(got) == 0 && len(evs) == 0:
		t.Fatalf("ferrytest: %s holds no event matching %s", where, m)
	case len(got) == 0:
		t.Fatalf("ferrytest: %s holds no event matching %s: its %d event(s) with that topic, key and type fail the payload predicate:\n%s",
			where, m, len(evs), list(evs))
	}
	return got
}

func requireNotEmitted(t testing.TB, evs []*ferryevent.Event, m Match, where string) {
	t.Helper()
	if got := m.selected(evs); len(got) > 0 {
		t.Fatalf("ferrytest: %s holds %d event(s) matching %s, want none:\n%s", where, len(got), m, list(got))
	}
}

// list prints events a line each, the first twenty.
func list(evs []*ferryevent.Event) string {
	var b strings.Builder
	for i, ev := range evs {
		if i == 20 {
			fmt.Fprintf(&b, "  … and %d more\n", len(evs)-i)
			break
		}
		payload := string(ev.Payload)
		if len(payload) > 120 {
			payload = payload[:120] + "…"
		}
		fmt.Fprintf(&b, "  %s topic %q key %q seq %d type %q payload %s\n", ev.ID, ev.Topic, ev.Key, ev.Seq, ev.Type, payload)
	}
	return b.String()
}
