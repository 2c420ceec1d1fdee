package ferrytest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrysink"
)

// DrainTimeout is how long Drain waits for the feed to catch up before it
// fails the test.
const DrainTimeout = time.Minute

// Drain publishes every event committed to the store's outbox into sink
// with a real Relay (one per partition), and returns once each partition's
// feed has passed every committed event (published, or dead-lettered when
// the sink refused it for good). cfg configures the relays (nil: the
// defaults; Drain polls every 10 ms unless cfg says otherwise); Partition
// is ignored. Run it where the service's own relay would run, with no
// other relay of cfg.Feed running: Drain waits for the feed's lease.
//
// Drain fails the test when a relay stops with an error or the feed has
// not caught up within DrainTimeout.
func Drain(t testing.TB, store ferrydriver.Store, sink ferrysink.Sink, cfg *ferry.RelayConfig) {
	t.Helper()
	c := ferry.RelayConfig{}
	if cfg != nil {
		c = *cfg
	}
	if c.PollInterval == 0 {
		c.PollInterval = 10 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Feed = c.WithDefaults().Feed
	ctx, cancel := context.WithTimeout(context.Background(), DrainTimeout)
	defer cancel()
	n, err := store.StoredPartitions(ctx)
	if err != nil {
		t.Fatalf("ferrytest: Drain: read the partition count: %v", err)
		return
	}
	partitions := max(n, 1)
	run, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, partitions)
	for p := range partitions {
		rc := c
		rc.Partition = p
		relay, err := ferry.NewRelay(store, sink, &rc)
		if err != nil {
			t.Fatalf("ferrytest: Drain: %v", err)
			return
		}
		go func() { done <- relay.Run(run) }()
	}
	stopped, err := caughtUp(ctx, store, c.Feed, partitions, done)
	stop()
	for range partitions - stopped {
		if rerr := <-done; rerr != nil && !errors.Is(rerr, context.Canceled) && err == nil {
			err = fmt.Errorf("a relay stopped: %w", rerr)
		}
	}
	if err != nil {
		t.Fatalf("ferrytest: Drain of feed %s: %v", c.Feed, err)
	}
}

// caughtUp waits until every partition's feed has no committed event after
// its checkpoint.
// It returns early, with how many relays returned (one), when a relay
// returns.
func caughtUp(ctx context.Context, store ferrydriver.Store, feed string, partitions int, done <-chan error) (int, error) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var left string
	for {
		left = ""
		for p := range partitions {
			name := feed + "/" + strconv.Itoa(p)
			lag, err := store.FeedLag(ctx, &ferrydriver.FeedLagParams{Feed: name, Partition: p})
			if err != nil {
				if ctx.Err() != nil {
					break
				}
				return 0, fmt.Errorf("read the lag of partition %d: %w", p, err)
			}
			if lag.Events > 0 {
				left = name + " has " + strconv.FormatInt(lag.Events, 10) + " event(s) to publish"
				break
			}
		}
		if left == "" && ctx.Err() == nil {
			return 0, nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("not caught up after %s: %s (is another relay holding the feed's lease, or does the sink refuse events with a retryable error?)", DrainTimeout, left)
		case err := <-done:
			if err == nil {
				err = errors.New("its Run returned nil")
			}
			return 1, fmt.Errorf("a relay stopped before the feed caught up: %w", err)
		case <-tick.C:
		}
	}
}
