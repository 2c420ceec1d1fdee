package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
)

// ferry bench settle, ingest and e2e: a producer's wait for settlement,
// JetStream into the inbox, and commit to handler across both.

// benchSettle ingests events at rate and measures how long after the
// handler's transaction commits AwaitSettled returns.
func benchSettle[TTx any](ctx context.Context, w io.Writer, db *benchDB[TTx], n, keys, workers, rate int) error {
	if n > 5000 {
		n = 2000
	}
	table, err := db.create(ctx, "projection")
	if err != nil {
		return err
	}
	var mu sync.Mutex
	handled := map[uuid.UUID]time.Time{}
	c, err := benchConsumer(db, db.drv, "bench", table, workers, 1, false, false, func(ev *ferry.Event) {
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
				s, err := ferry.AwaitSettled(ctx, db.drv, "bench", []uuid.UUID{ev.ID}, 30*time.Second)
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

// benchIngest publishes n events to the stream, then times a JetStream
// source ingesting all of them into a group's inbox (a multi-row insert
// per batch, acknowledged after its commit), for each source batch size.
func benchIngest(ctx context.Context, w io.Writer, drv *ferrypg.Driver[pgx.Tx], sink *ferrynats.Sink, js jetstream.JetStream, stream, prefix string, n, keys int) error {
	evs := benchEvents(n, keys)
	for i := 0; i < n; i += 1000 {
		for j, err := range sink.Publish(ctx, evs[i:min(i+1000, n)]) {
			if err != nil {
				return fmt.Errorf("publish event %d: %w", i+j, err)
			}
		}
	}
	for _, batch := range []int{ferrynats.DefaultBatch, 1000} {
		group := "ingest" + strconv.Itoa(batch)
		c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: group, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		src, err := ferrynats.NewSource(ctx, js, &ferrynats.SourceConfig{Stream: stream, Durable: group, SubjectPrefix: prefix, Batch: batch,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		var ingested atomic.Int64
		done := make(chan struct{})
		rctx, cancel := context.WithCancel(ctx)
		cpu0, hasCPU := postgresCPU()
		start := time.Now()
		var elapsed time.Duration
		runErr := make(chan error, 1)
		go func() {
			runErr <- src.Run(rctx, func(ctx context.Context, events []*ferry.Event) error {
				if _, err := c.Ingest(ctx, events); err != nil {
					return err
				}
				if ingested.Add(int64(len(events))) >= int64(n) {
					select {
					case <-done:
					default:
						elapsed = time.Since(start)
						close(done)
					}
				}
				return nil
			})
		}()
		select {
		case <-done:
		case err := <-runErr:
			cancel()
			return fmt.Errorf("source stopped after %d of %d events: %v", ingested.Load(), n, err)
		case <-time.After(5 * time.Minute):
			cancel()
			return fmt.Errorf("ingested %d of %d events in 5 minutes", ingested.Load(), n)
		}
		cpu1, _ := postgresCPU()
		cancel()
		if err := <-runErr; err != nil {
			return err
		}
		cpu := "n/a (not a local server)"
		if hasCPU {
			cpu = ((cpu1 - cpu0) * 10000 / time.Duration(n)).Round(time.Millisecond).String()
		}
		fmt.Fprintf(w, "ingest from JetStream, source batch %4d: %7.0f events/s (%d in %v); database CPU %s per 10k events\n",
			batch, float64(n)/elapsed.Seconds(), n, elapsed.Round(time.Millisecond), cpu)
	}
	return nil
}

// benchE2E produces at rate for d and times each event from its
// producer's commit to the commit of the consumer transaction that applied
// it: outbox → relay → JetStream → source → inbox → handler. With findMax
// it first looks for the highest rate the pipeline sustains (findMaxRate),
// then measures at rate and at half that maximum, through one pipeline.
func benchE2E(ctx context.Context, w io.Writer, pool *pgxpool.Pool, drv *ferrypg.Driver[pgx.Tx], client *ferry.Client[pgx.Tx], relay *ferry.Relay,
	stamps *stageStamps, js jetstream.JetStream, stream, prefix string, rate int, d time.Duration, keys, producers, workers, batch int, findMax bool) error {
	table, err := projection(ctx, pool, drv.Schema(), "projection_e2e")
	if err != nil {
		return err
	}
	stamped := &commitStamper{Driver: drv, stamps: stamps}
	c, err := ferry.NewConsumer(stamped, &ferry.ConsumerConfig{Group: "e2e", Workers: workers, BatchSize: batch, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *ferry.Event) error {
		if _, err := tx.Exec(ctx, upsert(table), ev.Key, ev.Seq); err != nil {
			return err
		}
		stamped.note(ctx, ev)
		stamps.stamp(stageHandled, ev)
		return nil
	})
	nsrc, err := ferrynats.NewSource(ctx, js, &ferrynats.SourceConfig{Stream: stream, Durable: "e2e", SubjectPrefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	src := &stampedSource{Source: nsrc, stamps: stamps}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var g sync.WaitGroup
	errs := make(chan error, 3)
	g.Go(func() { errs <- relay.Run(rctx) })
	g.Go(func() { errs <- c.Run(rctx) })
	g.Go(func() { errs <- c.Consume(rctx, src) })
	time.Sleep(time.Second) // let the relay take its lease
	phase := 0
	// run produces at r for dur and reports; it returns the intended →
	// applied p99 and whether every event was applied within settle of
	// the production's end.
	run := func(r int, dur, settle time.Duration, report bool) (time.Duration, bool) {
		phase++
		n := max(1, int(dur.Seconds()*float64(r)))
		st := newStages(fmt.Sprintf("Bench%d.", phase), n)
		stamps.cur.Store(st)
		applied := st[stageApplied]
		p := producePhase(ctx, w, pgEmitTx(pool, client), applied.prefix, n, r, keys, producers)
		applied.await(n, settle)
		fromCommit, fromIntent := p.latencies(applied)
		all := len(fromCommit) == n
		// What is left drains before the next phase, which must not
		// start behind a backlog.
		applied.await(n, time.Minute)
		p99 := time.Duration(0)
		if len(fromIntent) > 0 {
			slices.Sort(fromIntent)
			p99 = fromIntent[min(len(fromIntent)-1, len(fromIntent)*99/100)]
		}
		if report {
			fmt.Fprintf(w, "end to end at %d events/s for %v (consumer: %d workers, batch size %d): %d of %d applied\n", r, dur, workers, batch, len(fromCommit), n)
			fmt.Fprintf(w, "  commit -> applied:   %s\n", percentiles(fromCommit))
			fmt.Fprintf(w, "  intended -> applied: %s\n", percentiles(fromIntent))
			reportStages(w, p, st)
		}
		return p99, all
	}
	// A deployment's tables are analyzed by autovacuum within a minute of
	// filling, and the inbox's plans are remade then; a fresh schema's say
	// "empty" for the whole run where autovacuum is off or slow, and plans
	// made on them read more (a finish of several keys reads the keys
	// between them: docs/benchmarks.md). So the pipeline warms up for two
	// seconds, then its tables are analyzed.
	run(rate, 2*time.Second, 30*time.Second, false)
	runErr := analyzeSchema(ctx, pool, drv.Schema())
	switch {
	case runErr != nil: // the pipeline stops below
	case findMax:
		best := findMaxRate(w, func(r int) bool {
			p99, all := run(r, 4*time.Second, 3*time.Second, false)
			ok := all && p99 < time.Second
			fmt.Fprintf(w, "  %5d events/s: %s (intended -> applied p99 %v)\n", r, map[bool]string{true: "sustained", false: "not sustained"}[ok], p99.Round(time.Millisecond))
			return ok
		})
		fmt.Fprintf(w, "sustained maximum: about %d events/s (producers: one event per transaction, %d connections)\n", best, producers)
		if _, all := run(rate, d, 30*time.Second, true); !all {
			runErr = fmt.Errorf("events at %d/s did not all arrive within 30 s", rate)
		}
		if _, all := run(max(1, best/2), d, 30*time.Second, true); !all && runErr == nil {
			runErr = fmt.Errorf("events at %d/s did not all arrive within 30 s", best/2)
		}
	default:
		if _, all := run(rate, d, 30*time.Second, true); !all {
			runErr = fmt.Errorf("events at %d/s did not all arrive within 30 s", rate)
		}
	}
	cancel()
	g.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return runErr
}

// findMaxRate steps the rate up by 500 events/s from 1,000 while sustained
// says the pipeline keeps up, then once by 250 past the last sustained
// rate; it returns the highest rate sustained (0: not even the first).
func findMaxRate(w io.Writer, sustained func(rate int) bool) int {
	fmt.Fprintln(w, "looking for the sustained maximum (4 s per step; sustained: every event applied, intended -> applied p99 under 1 s)")
	best := 0
	for r := 1000; r <= 100_000; r += 500 {
		if !sustained(r) {
			break
		}
		best = r
	}
	if best > 0 && sustained(best+250) {
		best += 250
	}
	return best
}

// commitStamper records, for each event its handlers applied, when the
// consumer transaction that applied it committed.
type commitStamper struct {
	*ferrypg.Driver[pgx.Tx]
	stamps *stageStamps
}

type stampKey struct{}

// note is called by the handler: ev is applied in the transaction of ctx.
func (s *commitStamper) note(ctx context.Context, ev *ferry.Event) {
	if evs, ok := ctx.Value(stampKey{}).(*[]*ferry.Event); ok {
		*evs = append(*evs, ev)
	}
}

func (s *commitStamper) RunInTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	var evs []*ferry.Event
	err := s.Driver.RunInTx(context.WithValue(ctx, stampKey{}, &evs), func(ctx context.Context, tx pgx.Tx) error {
		evs = evs[:0] // a rerun starts over
		return fn(ctx, tx)
	})
	if err == nil {
		s.stamps.stamp(stageApplied, evs...)
	}
	return err
}

// analyzeSchema runs ANALYZE on every table of schema.
func analyzeSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	rows, err := pool.Query(ctx, `SELECT format('%I.%I', schemaname, tablename) FROM pg_tables WHERE schemaname = $1`, schema)
	if err != nil {
		return fmt.Errorf("list the schema's tables: %w", err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(tables) == 0 {
		return err
	}
	if _, err := pool.Exec(ctx, `ANALYZE `+strings.Join(tables, ", ")); err != nil {
		return fmt.Errorf("analyze the schema's tables: %w", err)
	}
	return nil
}
