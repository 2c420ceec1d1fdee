package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The demo's relay and consumer, each run in this process on connections
// of its own, which the crash loop kills without a clean shutdown and
// starts again.

type demoRelay struct {
	cancel context.CancelFunc
	done   chan error
	nc     *nats.Conn
	sink   *ferrynats.Sink
}

func (d *demo) startRelay(ctx context.Context) error {
	nc, err := nats.Connect(d.natsURL, nats.Name("ferry-demo-relay"), ferrynats.WriteFence())
	if err != nil {
		return err
	}
	sink, err := ferrynats.New(ctx, nc, &ferrynats.Config{Stream: demoStream, SubjectPrefix: demoPrefix, CreateStream: true})
	if err != nil {
		nc.Close()
		return err
	}
	relay, err := ferry.NewRelay(d.drv, sink, &ferry.RelayConfig{
		PollInterval: 100 * time.Millisecond, LeaseTTL: 2 * time.Second, HeartbeatInterval: time.Second,
		// A crash does not shut down cleanly: no final checkpoint, the lease
		// is not released.
		ShutdownTimeout: time.Nanosecond,
		// The verification checks that every key's Seq goes up by one
		// without gaps: keep every key's sequence (Seq restarts at 1 for a
		// key forgotten after KeyRetention).
		KeyRetention: -1,
		Logger:       d.log,
	})
	if err != nil {
		nc.Close()
		return err
	}
	rctx, cancel := context.WithCancel(ctx)
	r := &demoRelay{cancel: cancel, done: make(chan error, 1), nc: nc, sink: sink}
	go func() { r.done <- relay.Run(rctx) }()
	d.mu.Lock()
	d.relay = r
	d.mu.Unlock()
	return nil
}

// kill drops the relay's connection mid-flight and abandons it.
func (r *demoRelay) kill() uint64 {
	r.nc.Close()
	r.cancel()
	<-r.done
	return r.sink.Duplicates()
}

type demoConsumer struct {
	cancel context.CancelFunc
	done   chan error // the consumer's Run, then the source's
	nc     *nats.Conn
}

func (d *demo) startConsumer(ctx context.Context) error {
	c, err := ferry.NewConsumer(d.drv, &ferry.ConsumerConfig{
		Group: demoGroup, Workers: 4, PollInterval: 100 * time.Millisecond,
		// Short, so that the rows a killed consumer held run again soon.
		ClaimTTL:  3 * time.Second,
		RetryBase: 100 * time.Millisecond, RetryMax: time.Second,
		// Short too: a kill cancels the running handlers almost at once.
		ShutdownTimeout: 200 * time.Millisecond,
		Logger:          d.log,
	})
	if err != nil {
		return err
	}
	ferry.Handle(c, "OrderPlaced", d.apply)
	nc, err := nats.Connect(d.natsURL, nats.Name("ferry-demo-consumer"))
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return err
	}
	src, err := ferrynats.NewSource(ctx, js, &ferrynats.SourceConfig{
		Stream: demoStream, Durable: demoGroup, SubjectPrefix: demoPrefix, AckWait: ferrynats.MinAckWait, Logger: d.log,
	})
	if err != nil {
		nc.Close()
		return err
	}
	cctx, cancel := context.WithCancel(ctx)
	dc := &demoConsumer{cancel: cancel, done: make(chan error, 2), nc: nc}
	go func() {
		err := c.Run(cctx)
		if err != nil {
			d.log.Error("demo: the consumer stopped", "err", err)
		}
		dc.done <- err
	}()
	go func() {
		dc.done <- src.Run(cctx, func(ctx context.Context, events []*ferry.Event) error {
			n, err := c.Ingest(ctx, events)
			if err == nil {
				d.dupInbox.Add(int64(len(events) - n))
			}
			return err
		})
	}()
	d.mu.Lock()
	d.consumer = dc
	d.mu.Unlock()
	return nil
}

// kill drops the consumer's connection and cancels its running handlers
// (ShutdownTimeout is short): their transactions roll back, their claims
// lapse after ClaimTTL.
func (c *demoConsumer) kill() {
	c.nc.Close()
	c.cancel()
	<-c.done
	<-c.done
}

// apply is the consumer's handler: the projection update, in the
// transaction that also completes the event's inbox row.
func (d *demo) apply(ctx context.Context, tx *sql.Tx, ev *ferry.Event, o order) error {
	var last int64
	err := tx.QueryRowContext(ctx, `SELECT last_seq FROM customer_totals WHERE customer = ?`, ev.Key).Scan(&last)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	if ev.Seq != last+1 {
		if _, err := tx.ExecContext(ctx, `INSERT INTO order_violations (customer, want_seq, got_seq) VALUES (?, ?, ?)`, ev.Key, last+1, ev.Seq); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, `
INSERT INTO customer_totals (customer, orders, total_cents, last_seq) VALUES (?, 1, ?, ?)
ON CONFLICT (customer) DO UPDATE SET orders = orders + 1, total_cents = total_cents + excluded.total_cents, last_seq = excluded.last_seq`,
		ev.Key, o.AmountCents, ev.Seq); err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO applications (event_id, order_id) VALUES (?, ?)`, ev.ID.String(), o.OrderID)
	return err
}

// crashLoop kills the relay, the consumer or both at random moments while
// orders are produced, and starts new ones.
func (d *demo) crashLoop(ctx context.Context) {
	rng := rand.New(rand.NewPCG(d.cfg.seed, 99))
	for d.produced.Load() < int64(d.cfg.events) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(700*time.Millisecond + time.Duration(rng.Int64N(int64(1800*time.Millisecond)))):
		}
		if d.produced.Load() >= int64(d.cfg.events) {
			return
		}
		which := rng.IntN(5) // 0,1: relay; 2,3: consumer; 4: both
		var what []string
		if which <= 1 || which == 4 {
			d.mu.Lock()
			r := d.relay
			d.mu.Unlock()
			d.dupPublish.Add(r.kill())
			d.relayCrashes.Add(1)
			if err := d.startRelay(ctx); err != nil {
				d.log.Error("restart relay", "err", err)
				return
			}
			what = append(what, "relay")
		}
		if which >= 2 {
			d.mu.Lock()
			c := d.consumer
			d.mu.Unlock()
			c.kill()
			d.consumerCrashs.Add(1)
			if err := d.startConsumer(ctx); err != nil {
				d.log.Error("restart consumer", "err", err)
				return
			}
			what = append(what, "consumer")
		}
		d.line(fmt.Sprintf("killed the %s at %s produced; restarted", strings.Join(what, " and the "), thousands(d.produced.Load())))
	}
}

func (d *demo) stopAll() {
	d.mu.Lock()
	r, c := d.relay, d.consumer
	d.mu.Unlock()
	if r != nil {
		d.dupPublish.Add(r.kill())
	}
	if c != nil {
		c.kill()
	}
}
