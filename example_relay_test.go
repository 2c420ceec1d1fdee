package ferry_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/jackc/pgx/v5/pgxpool"
)

// printSink is a minimal ferrysink.Sink: it prints events and acknowledges
// them. Real sinks publish to a broker (see ferrynats).
type printSink struct {
	mu   sync.Mutex
	seen chan struct{}
}

func (s *printSink) Publish(_ context.Context, events []*ferryevent.Event) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range events {
		fmt.Printf("%s %s #%d %s\n", ev.Key, ev.Type, ev.Seq, ev.Payload)
		s.seen <- struct{}{}
	}
	return make([]error, len(events))
}

func (s *printSink) Close(context.Context) error { return nil }

// Emit events in the transaction that changes the data, and relay them.
// The rolled-back transaction's event is never published.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, exampleURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	schema := fmt.Sprintf("ferry_example_%d", time.Now().UnixNano()%1e6)
	defer pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")

	drv, err := ferrypg.New(pool, &ferrypg.Config{Schema: schema})
	if err != nil {
		panic(err)
	}
	if _, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{}); err != nil {
		panic(err)
	}
	client, err := ferry.NewClient(drv, nil)
	if err != nil {
		panic(err)
	}

	for i, commit := range []bool{true, false, true} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			panic(err)
		}
		// ... the business write goes here, in tx ...
		err = client.EmitTx(ctx, tx, &ferry.Event{
			Topic: "orders", Key: "order-42", Type: "OrderUpdated",
			Payload: fmt.Appendf(nil, `{"step":%d}`, i),
		})
		if err != nil {
			panic(err)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			panic(err)
		}
	}

	sink := &printSink{seen: make(chan struct{}, 10)}
	relay, err := ferry.NewRelay(drv, sink, &ferry.RelayConfig{PollInterval: 50 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- relay.Run(runCtx) }()
	<-sink.seen
	<-sink.seen
	stop()
	if err := <-done; err != nil {
		panic(err)
	}
	// Output:
	// order-42 OrderUpdated #1 {"step":0}
	// order-42 OrderUpdated #2 {"step":2}
}
