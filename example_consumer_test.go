package ferry_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"
)

type orderPlaced struct {
	Order string `json:"order"`
	Total int    `json:"total"`
}

// A consumer group applies events with exactly-once effect: the handler's
// writes and the inbox record commit in one transaction. Here it reads the
// outbox of the same database directly (a relay into its inbox), and the
// request path waits for the group to settle the event.
func Example_consumer() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, exampleURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	schema := fmt.Sprintf("ferry_example_c%d", time.Now().UnixNano()%1e6)
	defer pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
	drv, err := ferrypg.New(pool, &ferrypg.Config{Schema: schema})
	if err != nil {
		panic(err)
	}
	if _, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{}); err != nil {
		panic(err)
	}
	quiet := slog.New(slog.DiscardHandler)

	billing, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "billing", Logger: quiet})
	if err != nil {
		panic(err)
	}
	ferry.Handle(billing, "OrderPlaced", func(ctx context.Context, tx pgx.Tx, ev *ferry.Event, o orderPlaced) error {
		// Writes through tx commit together with the inbox record.
		fmt.Printf("invoice %s for %d (key %s, #%d)\n", o.Order, o.Total, ev.Key, ev.Seq)
		return nil
	})
	relay, err := ferry.NewRelay(drv, billing.Sink(), &ferry.RelayConfig{Feed: "billing", Logger: quiet})
	if err != nil {
		panic(err)
	}
	// The relay feeds the inbox, the consumer runs it: one shape, Run(ctx),
	// which returns nil once ctx ends and everything stopped.
	runCtx, stop := context.WithCancel(ctx)
	var g errgroup.Group
	g.Go(func() error { return billing.Run(runCtx) })
	g.Go(func() error { return relay.Run(runCtx) })
	defer func() {
		stop()
		if err := g.Wait(); err != nil {
			panic(err)
		}
	}()

	client, err := ferry.NewClient(drv, nil)
	if err != nil {
		panic(err)
	}
	var ids []uuid.UUID
	for i, total := range []int{30, 45} {
		ev := &ferry.Event{ID: ferry.NewID(), Topic: "orders", Key: "customer-7", Type: "OrderPlaced",
			Payload: fmt.Appendf(nil, `{"order":"o-%d","total":%d}`, i+1, total)}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return client.EmitTx(ctx, tx, ev) }); err != nil {
			panic(err)
		}
		ids = append(ids, ev.ID)
	}
	s, err := ferry.AwaitSettled(ctx, drv, "billing", ids, 10*time.Second)
	if err != nil {
		panic(err)
	}
	fmt.Println("settled:", len(s.Settled), "failed:", len(s.Failed), "pending:", len(s.Pending))
	// Output:
	// invoice o-1 for 30 (key customer-7, #1)
	// invoice o-2 for 45 (key customer-7, #2)
	// settled: 2 failed: 0 pending: 0
}
