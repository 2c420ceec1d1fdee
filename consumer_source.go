// Where a consumer's events come from: the inbox as a relay's sink, and
// a broker source run into the inbox, with a lease where the source must
// have one reader at a time.

package ferry

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
)

// Sink returns a ferrysink.Sink that ingests into the consumer's inbox, for
// consuming an outbox directly, without a broker: run a Relay from the
// producer's store to it, with a feed name of the group's own:
//
//	relay, err := ferry.NewRelay(drv, consumer.Sink(), &ferry.RelayConfig{Feed: "billing"})
//
// The relay keeps the group's position in the outbox like any relay.
func (c *Consumer[TTx]) Sink() ferrysink.Sink { return &inboxSink[TTx]{c: c} }

type inboxSink[TTx any] struct{ c *Consumer[TTx] }

// System returns "ferry": the relay writes into the inbox itself, with no
// broker between (ferrysink.Describer), and its deliveries say so.
func (s *inboxSink[TTx]) System() string { return DefaultSystem }

// Publish ingests events in one statement: all or none.
func (s *inboxSink[TTx]) Publish(ctx context.Context, events []*ferryevent.Event) []error {
	errs := make([]error, len(events))
	if _, err := s.c.Ingest(ferrysink.WithSystem(ctx, DefaultSystem), events); err != nil {
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}

// OrderedBatches implements ferrysink.OrderedBatcher: one call is one
// statement that inserts in order or not at all.
func (s *inboxSink[TTx]) OrderedBatches() bool { return true }

func (s *inboxSink[TTx]) Close(context.Context) error { return nil }

// Consume runs src (ferrynats, ferrykafka or ferryrabbit's Source) into the
// consumer's inbox until ctx ends, returning what src.Run returns. Run the
// consumer itself next to it (Run). A source that names its broker
// (ferrysink.Describer) has its deliveries reported with that system.
//
// A source whose broker would split one ordering line between several
// readers (ferrysink.SingleReader: a JetStream durable) is read by one
// process at a time: Consume holds a lease named after it in the
// consumer's store (a driver with leases: every Ferry backend), renewed
// every SourceLeaseTTL/3. The other processes that run Consume on it stand
// by and take over within SourceLeaseTTL when the reader dies, or at once
// when it stops; a reader that cannot renew the lease in time stops
// ingesting and stands by too.
func (c *Consumer[TTx]) Consume(ctx context.Context, src ferrysink.Source) error {
	system := ""
	if d, ok := src.(ferrysink.Describer); ok {
		system = d.System()
	}
	ingest := func(ctx context.Context, events []*Event) error {
		if system != "" {
			ctx = ferrysink.WithSystem(ctx, system)
		}
		_, err := c.Ingest(ctx, events)
		return err
	}
	sr, ok := src.(ferrysink.SingleReader)
	l, ok2 := c.driver.(sourceLeaser)
	if !ok || !ok2 {
		return src.Run(ctx, ingest)
	}
	return c.consumeLeased(ctx, src, "consumer-sources/"+sr.ReaderName(), l, ingest)
}

// sourceLeaser is the part of a driver's leases that Consume uses.
type sourceLeaser interface {
	AcquireLease(ctx context.Context, p *ferrydriver.AcquireLeaseParams) (*ferrydriver.Lease, error)
	RenewLease(ctx context.Context, p *ferrydriver.RenewLeaseParams) (*ferrydriver.Lease, error)
	ReleaseLease(ctx context.Context, p *ferrydriver.ReleaseLeaseParams) error
}

// errSourceLeaseLost ends a source's run when its lease could not be
// renewed in time, or another process took it.
var errSourceLeaseLost = errors.New("the source's lease was lost: another process may read it now")

// consumeLeased runs src while this process holds the lease name, and
// stands by while another does, until ctx ends.
func (c *Consumer[TTx]) consumeLeased(ctx context.Context, src ferrysink.Source, name string, l sourceLeaser, ingest func(context.Context, []*Event) error) error {
	ttl := c.cfg.SourceLeaseTTL
	log := c.log.With("source", name, "holder", c.worker)
	standing := ""
	for attempt := 1; ctx.Err() == nil; {
		asked := time.Now()
		lease, err := l.AcquireLease(ctx, &ferrydriver.AcquireLeaseParams{Name: name, Holder: c.worker, TTL: ttl})
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && fatal(err):
			return fmt.Errorf("ferry: consumer %s: take the lease of source %s: %w", c.cfg.Group, name, err)
		case err != nil:
			log.Warn("ferry: taking the source's lease failed; retrying", "err", err, "attempt", attempt)
			c.retry.Sleep(ctx.Done(), attempt)
			attempt++
			continue
		}
		attempt = 1
		if !lease.Held(c.worker) {
			if standing != lease.Holder {
				standing = lease.Holder
				log.Info("ferry: another process reads the source (one reader per ordering line); standing by to take over when it stops or dies",
					"reader", lease.Holder, "source_lease_ttl", ttl)
			}
			// Try again when the lease would expire (the store's clock),
			// and at least every quarter of its TTL.
			sleepCtx(ctx, min(max(lease.ExpiresAt.Sub(lease.Now), 0)+10*time.Millisecond, ttl/4))
			continue
		}
		standing = ""
		log.Info("ferry: reading the source", "term", lease.Term)
		err = c.readLeased(ctx, src, name, l, lease, asked, ingest)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, errSourceLeaseLost):
			log.Warn("ferry: stopped reading the source: its lease could not be renewed in time, or another process took it; standing by",
				"source_lease_ttl", ttl)
		case err != nil:
			return err
		default:
			return nil // the source ended by itself
		}
	}
	return nil
}

// readLeased runs src under the lease it holds until ctx ends (then it
// releases the lease, for a standby to take over at once), src.Run
// returns, or the lease is lost (errSourceLeaseLost). The lease is trusted
// for less than its TTL on the local monotonic clock, counted from before
// each renewal was asked: past that, ingest refuses the events (the source
// retries them, and stops as its context ends), so that a reader paused
// past its lease cannot ingest behind its successor's back.
func (c *Consumer[TTx]) readLeased(ctx context.Context, src ferrysink.Source, name string, l sourceLeaser, lease *ferrydriver.Lease, asked time.Time, ingest func(context.Context, []*Event) error) error {
	ttl := c.cfg.SourceLeaseTTL
	margin := min(ttl/5, 2*time.Second)
	var trusted atomic.Int64 // Unix ns on the monotonic clock's reading of asked
	base := time.Now()
	trust := func(asked time.Time, l *ferrydriver.Lease) {
		trusted.Store(int64(asked.Sub(base) + l.ExpiresAt.Sub(l.Now) - margin))
	}
	trust(asked, lease)
	valid := func() bool { return time.Since(base) < time.Duration(trusted.Load()) }
	runCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		t := time.NewTicker(ttl / 3)
		defer t.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-t.C:
			}
			asked := time.Now()
			rctx, cancel := context.WithTimeout(runCtx, ttl/3)
			renewed, err := l.RenewLease(rctx, &ferrydriver.RenewLeaseParams{Name: name, Holder: c.worker, Term: lease.Term, TTL: ttl})
			cancel()
			switch {
			case err == nil:
				trust(asked, renewed)
			case errors.Is(err, ferrydriver.ErrLeaseLost):
				stop(errSourceLeaseLost)
				return
			case !valid():
				stop(errSourceLeaseLost)
				return
			}
		}
	}()
	err := src.Run(runCtx, func(ictx context.Context, events []*Event) error {
		if !valid() {
			stop(errSourceLeaseLost)
			return errSourceLeaseLost
		}
		ictx, cancel := context.WithDeadline(ictx, base.Add(time.Duration(trusted.Load())))
		defer cancel()
		return ingest(ictx, events)
	})
	stop(nil)
	<-kept
	if ctx.Err() != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_ = l.ReleaseLease(rctx, &ferrydriver.ReleaseLeaseParams{Name: name, Holder: c.worker, Term: lease.Term})
		cancel()
		return nil
	}
	if cause := context.Cause(runCtx); errors.Is(cause, errSourceLeaseLost) {
		return errSourceLeaseLost
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	_ = l.ReleaseLease(rctx, &ferrydriver.ReleaseLeaseParams{Name: name, Holder: c.worker, Term: lease.Term})
	cancel()
	return err
}
