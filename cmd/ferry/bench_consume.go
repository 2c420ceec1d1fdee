package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// benchEvents returns n events over keys with per-key Seq.
func benchEvents(n, keys int) []*ferry.Event {
	out := make([]*ferry.Event, n)
	seq := map[string]int64{}
	for i := range out {
		k := "customer-" + strconv.Itoa(i%keys)
		seq[k]++
		out[i] = &ferry.Event{ID: ferry.NewID(), Topic: "orders", Key: k, Type: "OrderPlaced", Seq: seq[k], Payload: payload(i), CreatedAt: time.Now()}
	}
	return out
}

// projection creates the table the bench handler writes: one row per
// customer, updated by each event (the exactly-once effect).
func projection(ctx context.Context, pool *pgxpool.Pool, schema string) (string, error) {
	t := pgx.Identifier{schema, "projection"}.Sanitize()
	_, err := pool.Exec(ctx, `CREATE TABLE `+t+` (customer text PRIMARY KEY, orders bigint NOT NULL, last_seq bigint NOT NULL)`)
	return t, err
}

func benchConsumer(drv *ferrypg.Driver[pgx.Tx], table string, workers int, onCommit func(ev *ferry.Event)) (*ferry.Consumer[pgx.Tx], error) {
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "bench", Workers: workers, PollInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (customer, orders, last_seq) VALUES ($1, 1, $2)
			ON CONFLICT (customer) DO UPDATE SET orders = `+table+`.orders + 1, last_seq = excluded.last_seq`, ev.Key, ev.Seq)
		if err == nil && onCommit != nil {
			onCommit(ev)
		}
		return err
	})
	return c, nil
}

// benchConsume measures how fast a consumer applies a backlog with
// exactly-once effect (inbox + projection update in one transaction).
func benchConsume(ctx context.Context, w io.Writer, pool *pgxpool.Pool, drv *ferrypg.Driver[pgx.Tx], n, keys, workers int) error {
	table, err := projection(ctx, pool, drv.Schema())
	if err != nil {
		return err
	}
	var applied atomic.Int64
	c, err := benchConsumer(drv, table, workers, func(*ferry.Event) { applied.Add(1) })
	if err != nil {
		return err
	}
	evs := benchEvents(n, keys)
	for i := 0; i < n; i += 1000 {
		if _, err := c.Ingest(ctx, evs[i:min(i+1000, n)]); err != nil {
			return err
		}
	}
	start := time.Now()
	stop := runConsumer(ctx, c)
	var total int64
	for {
		if err := pool.QueryRow(ctx, `SELECT COALESCE(sum(orders), 0) FROM `+table).Scan(&total); err != nil {
			return err
		}
		if total >= int64(n) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(start)
	if err := stop(); err != nil {
		return err
	}
	fmt.Fprintf(w, "consume: %d events applied with exactly-once effect in %v = %.0f events/s (handler: one upsert)\n", n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds())
	return nil
}

// benchSettle ingests events at rate and measures how long after the
// handler's transaction commits AwaitSettled returns.
func benchSettle(ctx context.Context, w io.Writer, pool *pgxpool.Pool, drv *ferrypg.Driver[pgx.Tx], n, keys, workers, rate int) error {
	if n > 5000 {
		n = 2000
	}
	table, err := projection(ctx, pool, drv.Schema())
	if err != nil {
		return err
	}
	var mu sync.Mutex
	handled := map[uuid.UUID]time.Time{}
	c, err := benchConsumer(drv, table, workers, func(ev *ferry.Event) {
		mu.Lock()
		handled[ev.ID] = time.Now() // just before the commit
		mu.Unlock()
	})
	if err != nil {
		return err
	}
	stop := runConsumer(ctx, c)
	defer func() { _ = stop() }()
	evs := benchEvents(n, keys)
	lat := make([]time.Duration, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := time.Now()
	for i, ev := range evs {
		if wait := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); wait > 0 {
			time.Sleep(wait)
		}
		wg.Go(func() {
			done := make(chan struct{})
			go func() {
				defer close(done)
				s, err := ferry.AwaitSettled(ctx, drv, "bench", []uuid.UUID{ev.ID}, 30*time.Second)
				if err == nil && !s.Done() {
					err = fmt.Errorf("event %s not settled in 30 s", ev.ID)
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				lat[i] = time.Since(handled[ev.ID])
				mu.Unlock()
			}()
			time.Sleep(5 * time.Millisecond) // the waiter is in place before the event arrives
			if _, err := c.Ingest(ctx, []*ferry.Event{ev}); err != nil {
				errs <- err
			}
			<-done
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	fmt.Fprintf(w, "settle: %d events at %d/s; handler commit -> AwaitSettled returns: %s\n", n, rate, percentiles(lat))
	return nil
}

// runConsumer runs c until stop is called, which returns what Run did.
func runConsumer[TTx any](ctx context.Context, c *ferry.Consumer[TTx]) (stop func() error) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return func() error {
		cancel()
		return <-done
	}
}
