// Where a consumer's events come from: the inbox as a relay's sink, and
// a broker source run into the inbox, with a lease where the source must
// have one reader at a time.

package ferry

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryhook"
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
func (s *inboxSink[TTx]) System() string { return ferryhook.DefaultSystem }

// Publish ingests events in one statement: all or none.
func (s *inboxSink[TTx]) Publish(ctx context.Context, events []*ferryevent.Event) []error {
	errs := make([]error, len(events))
	if _, err := s.c.Ingest(ferrysink.WithSystem(ctx, ferryhook.DefaultSystem), events); err != nil {
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
//
// A source divided into shares (ferrysink.Shared: a JetStream source with
// SourceConfig.Shares) is read by every process that runs Consume on it,
// each reading at most ceil(shares / processes) shares, each share under a
// lease of its own as above: the processes balance the shares as relays
// balance a feed's partitions (Balancer), and take a dead one's shares over
// within SourceLeaseTTL.
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
	name := "consumer-sources/" + sr.ReaderName()
	if sh, ok := src.(ferrysink.Shared); ok && sh.Shares() > 1 {
		return c.consumeShares(ctx, sh, name, l, ingest)
	}
	return c.consumeLeased(ctx, src.Run, name, l, ingest, nil)
}

// sourceLeaser is the part of a driver's leases that Consume uses.
type sourceLeaser interface {
	AcquireLease(ctx context.Context, p *ferrydriver.LeaseParams) (*ferrydriver.Lease, error)
	RenewLease(ctx context.Context, p *ferrydriver.LeaseParams) (*ferrydriver.Lease, error)
	ReleaseLease(ctx context.Context, p *ferrydriver.LeaseParams) error
}

// errSourceLeaseLost ends a source's run when its lease could not be
// renewed in time, or another process took it.
var errSourceLeaseLost = errors.New("the source's lease was lost: another process may read it now")

// errShareYielded ends a share's run when the balancer hands it over.
var errShareYielded = errors.New("the share was handed over to balance the group")

// runFunc runs a source, or one share of it.
type runFunc func(ctx context.Context, ingest func(context.Context, []*Event) error) error

// consumeLeased runs the source (or share, when share is non-nil) while
// this process holds the lease name, and stands by while another does,
// until ctx ends. A share is tried for only while its balancer reserves it
// to this process, and handed over when the balancer asks for it back.
func (c *Consumer[TTx]) consumeLeased(ctx context.Context, run runFunc, name string, l sourceLeaser, ingest func(context.Context, []*Event) error, share *shareSlot) error {
	ttl := c.cfg.SourceLeaseTTL
	log := c.log.With("source", name, "holder", c.worker)
	standing := ""
	for attempt := 1; ctx.Err() == nil; {
		if !share.reserve(ctx) {
			sleepCtx(ctx, ttl/4)
			continue
		}
		asked := time.Now()
		lease, err := l.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: name, Holder: c.worker, TTL: ttl})
		if err != nil || !lease.Held(c.worker) {
			share.release()
		}
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
			sleepCtx(ctx, standbyPause(lease, ttl))
			continue
		}
		standing = ""
		log.Info("ferry: reading the source", "term", lease.Term)
		err = c.readLeased(ctx, run, name, l, lease, asked, share.yielding(), ingest)
		share.release()
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, errShareYielded):
			log.Info("ferry: handed the share over to balance the group")
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

// shareSlot is share i of a shared source, as its balancer gives it to
// this process. A nil slot is an unshared source: always this process's
// to try for, never asked back.
type shareSlot struct {
	b *Balancer
	i int
}

func (s *shareSlot) reserve(ctx context.Context) bool { return s == nil || s.b.reserve(ctx, s.i) }

func (s *shareSlot) release() {
	if s != nil {
		s.b.release(s.i)
	}
}

// yielding is closed when the share must be handed over; nil (never) for
// an unshared source.
func (s *shareSlot) yielding() <-chan struct{} {
	if s == nil {
		return nil
	}
	return s.b.yielding(s.i)
}

// standbyPause is how long a standby waits before it asks for a lease
// held by another again: until it would expire (the store's clock), and
// at most a quarter of its TTL.
func standbyPause(lease *ferrydriver.Lease, ttl time.Duration) time.Duration {
	return min(max(lease.ExpiresAt.Sub(lease.Now), 0)+10*time.Millisecond, ttl/4)
}

// consumeShares runs the shares of src that this process is given, until
// ctx ends or a share's run fails for good: a balancer over the processes
// that run Consume on src, and per share a loop that reserves it, takes
// its lease and reads it until the lease is lost or the balancer asks for
// it back.
func (c *Consumer[TTx]) consumeShares(ctx context.Context, src ferrysink.Shared, name string, l sourceLeaser, ingest func(context.Context, []*Event) error) error {
	leases, ok := c.driver.(memberLeases)
	if !ok {
		return fmt.Errorf("ferry: consumer %s: the inbox keeps no leases (ferrydriver.Store.ListLeases), which a shared source needs to balance its %d shares; set the source's shares to 1", c.cfg.Group, src.Shares())
	}
	ttl := c.cfg.SourceLeaseTTL
	b := newBalancer(leases, BalancerConfig{Feed: name, Partitions: src.Shares(), HolderID: c.worker, LeaseTTL: ttl, Logger: c.log}, "share")
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := b.Run(ctx); err != nil {
			cancel(fmt.Errorf("ferry: consumer %s: balance the shares of source %s: %w", c.cfg.Group, name, err))
		}
	})
	for i := range src.Shares() {
		wg.Go(func() {
			run := func(ctx context.Context, ingest func(context.Context, []*Event) error) error {
				return src.RunShare(ctx, i, ingest)
			}
			if err := c.consumeLeased(ctx, run, name+"/"+strconv.Itoa(i), l, ingest, &shareSlot{b, i}); err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// readLeased runs the source under the lease it holds until ctx ends or
// yield is closed (then it releases the lease, for a standby to take over
// at once: errShareYielded for yield), run returns, or the lease is lost
// (errSourceLeaseLost). The lease is trusted
// for less than its TTL on the local monotonic clock, counted from before
// each renewal was asked: past that, ingest refuses the events (the source
// retries them, and stops as its context ends), so that a reader paused
// past its lease cannot ingest behind its successor's back.
func (c *Consumer[TTx]) readLeased(ctx context.Context, run runFunc, name string, l sourceLeaser, lease *ferrydriver.Lease, asked time.Time, yield <-chan struct{}, ingest func(context.Context, []*Event) error) error {
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
			case <-yield:
				stop(errShareYielded)
				return
			case <-t.C:
			}
			asked := time.Now()
			rctx, cancel := context.WithTimeout(runCtx, ttl/3)
			renewed, err := l.RenewLease(rctx, &ferrydriver.LeaseParams{Name: name, Holder: c.worker, Term: lease.Term, TTL: ttl})
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
	err := run(runCtx, func(ictx context.Context, events []*Event) error {
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
	cause := context.Cause(runCtx)
	if ctx.Err() != nil || errors.Is(cause, errShareYielded) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_ = l.ReleaseLease(rctx, &ferrydriver.LeaseParams{Name: name, Holder: c.worker, Term: lease.Term})
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		return errShareYielded
	}
	if errors.Is(cause, errSourceLeaseLost) {
		return errSourceLeaseLost
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	_ = l.ReleaseLease(rctx, &ferrydriver.LeaseParams{Name: name, Holder: c.worker, Term: lease.Term})
	cancel()
	return err
}
