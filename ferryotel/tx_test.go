package ferryotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryotel/ferryoteltest"
)

// TestRunTxSpanRecordsEachRetry: a RunTx call whose first two attempts
// lose (a serialization failure, then a rerun the callback asks for) is one
// span with two retry events naming their causes, and the callback's own
// spans are its children.
func TestRunTxSpanRecordsEachRetry(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, tp, rec := ferryoteltest.Recorder(t)
	drv := ferryoteltest.Driver(ctx, t)

	calls := 0
	n, err := ferry.RunTx(ctx, drv, &ferry.TxOptions{Hooks: []ferryhook.Hook{tr}, RetryBase: time.Millisecond, RetryMax: 2 * time.Millisecond},
		func(ctx context.Context, tx pgx.Tx) (int, error) {
			calls++
			_, span := tp.Tracer("app").Start(ctx, "callback")
			defer span.End()
			switch calls {
			case 1:
				// What PostgreSQL says when a serializable transaction loses.
				_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'lost a race' USING ERRCODE = '40001'; END $$`)
				return 0, err
			case 2:
				return 0, ferry.RerunTx(errors.New("stale read"))
			}
			return calls, nil
		})
	require.NoError(t, err)
	require.Equal(t, 3, n)

	var runTx sdktrace.ReadOnlySpan
	callbacks := 0
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "RunTx":
			runTx = s
		case "callback":
			callbacks++
		}
	}
	require.NotNil(t, runTx)
	require.Equal(t, trace.SpanKindInternal, runTx.SpanKind())
	require.Equal(t, 3, callbacks)
	for _, s := range rec.Ended() {
		if s.Name() == "callback" {
			require.Equal(t, runTx.SpanContext().SpanID(), s.Parent().SpanID(), "each attempt's spans are children of the RunTx span")
		}
	}
	events := runTx.Events()
	require.Len(t, events, 2, "one event per retry")
	attr := func(e sdktrace.Event, key string) string {
		for _, kv := range e.Attributes {
			if string(kv.Key) == key {
				return kv.Value.String()
			}
		}
		return ""
	}
	require.Equal(t, "retry", events[0].Name)
	require.Equal(t, "1", attr(events[0], "ferry.tx.attempt"))
	require.Equal(t, "serialization_failure", attr(events[0], "ferry.tx.cause"))
	require.Contains(t, attr(events[0], "exception.message"), "lost a race")
	require.Equal(t, "2", attr(events[1], "ferry.tx.attempt"))
	require.Equal(t, "rerun_requested", attr(events[1], "ferry.tx.cause"))
	require.Contains(t, attr(events[1], "exception.message"), "stale read")
	var attempts string
	for _, kv := range runTx.Attributes() {
		if kv.Key == "ferry.tx.attempts" {
			attempts = kv.Value.String()
		}
	}
	require.Equal(t, "3", attempts)
}
