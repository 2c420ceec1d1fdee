package ferry

import (
	"context"
	"errors"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// memberLeaser is the part of a driver's leases that a consumer's
// membership of its group uses.
type memberLeaser interface {
	AcquireLease(ctx context.Context, p *ferrydriver.LeaseParams) (*ferrydriver.Lease, error)
	ReleaseLease(ctx context.Context, p *ferrydriver.LeaseParams) error
	GetLease(ctx context.Context, name string) (*ferrydriver.Lease, error)
}

// memberLease names worker's membership of the group: a lease per process,
// as the relays' balancer keeps ("members/<feed>/<holder>").
func (c *Consumer[TTx]) memberLease(worker string) string {
	return "consumer-members/" + c.cfg.Group + "/" + worker
}

// startMembership makes this process a member of its group (a lease it
// renews every LivenessTTL/3) when the driver keeps leases, and from
// then on ends the claims of members whose lease lapsed. It takes the lease before returning, so that the
// process claims nothing as a member nobody could see lapse. The returned
// function stops it and gives the membership up; nil when there is none.
func (c *Consumer[TTx]) startMembership(ctx context.Context) (stop func()) {
	l, ok := c.driver.(memberLeaser)
	if !ok || c.cfg.LivenessTTL <= 0 {
		return nil
	}
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	term := c.renewMembership(ctx, l)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.membership(mctx, l, term)
	}()
	return func() { cancel(); <-done }
}

// renewMembership takes or renews the membership lease; it returns the
// lease's term (0 when it could not).
func (c *Consumer[TTx]) renewMembership(ctx context.Context, l memberLeaser) int64 {
	lease, err := l.AcquireLease(ctx, &ferrydriver.LeaseParams{Name: c.memberLease(c.worker), Holder: c.worker, TTL: c.cfg.LivenessTTL})
	if err != nil || !lease.Held(c.worker) {
		return 0
	}
	return lease.Term
}

// membership renews the membership and reaps the claims of lapsed members
// every LivenessTTL/3 until ctx ends; then it gives the membership up, so
// that the others end at once the claims of handlers it abandoned.
func (c *Consumer[TTx]) membership(ctx context.Context, l memberLeaser, term int64) {
	t := time.NewTicker(c.cfg.LivenessTTL / 3)
	defer t.Stop()
	failing := false
	for {
		err := c.reap(ctx, l)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			failing = true
			c.log.Warn("ferry: looking for consumer processes of the group that died failed; retrying (logged once until it works)", "err", err)
		case err == nil && failing:
			failing = false
		}
		select {
		case <-ctx.Done():
			if term != 0 {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
				_ = l.ReleaseLease(rctx, &ferrydriver.LeaseParams{Name: c.memberLease(c.worker), Holder: c.worker, Term: term})
				cancel()
			}
			return
		case <-t.C:
		}
		if tm := c.renewMembership(ctx, l); tm != 0 {
			term = tm
		}
	}
}

// reap ends the claims of the group's members whose membership lapsed. A
// claim holder without a membership lease (a process of a Ferry version
// before memberships, or with LivenessTTL negative) keeps its claims for
// their TTL.
func (c *Consumer[TTx]) reap(ctx context.Context, l memberLeaser) error {
	holders, err := c.driver.ClaimHolders(ctx, c.cfg.Group)
	if err != nil {
		return err
	}
	for _, h := range holders {
		if h == c.worker {
			continue
		}
		lease, err := l.GetLease(ctx, c.memberLease(h))
		switch {
		case errors.Is(err, ferrydriver.ErrNotFound):
			continue
		case err != nil:
			return err
		case lease.ExpiresAt.After(lease.Now):
			continue // alive
		}
		n, err := c.driver.ExpireClaims(ctx, &ferrydriver.ExpireClaimsParams{Group: c.cfg.Group, Worker: h})
		if err != nil {
			return err
		}
		if n > 0 {
			c.log.Warn("ferry: a consumer process of the group stopped renewing its membership (it crashed, or lost its database): its claims end now, and its events run again here or elsewhere",
				"member", h, "claims", n, "liveness_ttl", c.cfg.LivenessTTL, "lapsed_for", lease.Now.Sub(lease.ExpiresAt).Round(time.Millisecond))
			c.Notify()
		}
	}
	return nil
}
