package ferry_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// lateClaims is a PostgreSQL driver whose next claim, once armed, behaves
// as one the database received but had not read yet when the consumer
// stopped: it waits for release, then runs to its commit whatever its
// context says (the server does not know the client gave up), and returns
// the rows with its context's error, as pgx does.
type lateClaims struct {
	*ferrypg.Driver[pgx.Tx]
	mu      sync.Mutex
	armed   bool
	entered chan struct{}
	release chan struct{}
}

func (d *lateClaims) ClaimInbox(ctx context.Context, p *ferrydriver.ClaimInboxParams) ([]*ferrydriver.InboxRow, error) {
	d.mu.Lock()
	armed := d.armed
	d.armed = false
	d.mu.Unlock()
	if !armed {
		return d.Driver.ClaimInbox(ctx, p)
	}
	close(d.entered)
	<-d.release
	rows, err := d.Driver.ClaimInbox(context.WithoutCancel(ctx), p)
	if err == nil {
		err = ctx.Err()
	}
	return rows, err
}

// TestStopDoesNotStrandAClaimInFlight: the consumer is stopped while a
// claim is on its way to the database, and the claim then commits, taking
// an event that arrived meanwhile. That event must still run (during the
// stop, or at once after a restart), not sit PROCESSING until its claim
// expires: the claim loop used to take a claim whose context had ended for
// "nothing claimed" (a CI failure: an event stuck for the 30 s of its
// claim after a restart).
func TestStopDoesNotStrandAClaimInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := &lateClaims{Driver: newPG(t), entered: make(chan struct{}), release: make(chan struct{})}
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "g", PollInterval: 20 * time.Millisecond, ClaimTTL: 5 * time.Minute})
	require.NoError(t, err)
	c.HandleAll(func(context.Context, pgx.Tx, *ferry.Event) error { return nil })
	state := func(id uuid.UUID) *ferrydriver.InboxRow {
		rows, err := drv.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: "g", EventIDs: []uuid.UUID{id}})
		require.NoError(t, err)
		require.Contains(t, rows, id)
		return rows[id]
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	drv.mu.Lock()
	drv.armed = true
	drv.mu.Unlock()
	go func() { done <- c.Run(runCtx) }()
	select {
	case <-drv.entered:
	case <-time.After(time.Minute):
		t.Fatal("the consumer never claimed")
	}
	stop() // while the claim is on its way
	ev := &ferryevent.Event{Topic: "t", Key: "k", Type: "T"}
	require.NoError(t, ferryevent.Prepare(ev, 0, 0, time.Now()))
	_, err = c.Ingest(ctx, []*ferryevent.Event{ev})
	require.NoError(t, err)
	close(drv.release) // the database reads the claim now: it takes ev
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("Run did not return")
	}
	if state(ev.ID).State != ferrydriver.InboxProcessed {
		// Not run during the stop: a restart must run it now, not when its
		// claim expires in five minutes.
		runCtx, stop := context.WithCancel(ctx)
		defer stop()
		go func() { done <- c.Run(runCtx) }()
		defer func() { stop(); require.NoError(t, <-done) }()
	}
	require.Eventually(t, func() bool { return state(ev.ID).State == ferrydriver.InboxProcessed }, 30*time.Second, 10*time.Millisecond,
		"the event the late claim took runs: %+v", state(ev.ID))
	require.Equal(t, 1, state(ev.ID).Attempts)
}

// TestStopWhileARescuedHandlerHangs: a stop while a rescued event's
// handler blocks on its context returns within about ShutdownTimeout. The
// rescue used to run the event on the claim loop under a context that a
// stop never cancelled, so Run waited for the handler's deadline (0.9 ×
// ClaimTTL) instead.
func TestStopWhileARescuedHandlerHangs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newPG(t)
	const claimTTL = 3 * time.Second
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "g", PollInterval: 20 * time.Millisecond, ClaimTTL: claimTTL,
		ShutdownTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	running := make(chan struct{})
	var once sync.Once
	c.HandleAll(func(ctx context.Context, _ pgx.Tx, _ *ferry.Event) error {
		once.Do(func() { close(running) })
		<-ctx.Done()
		return ctx.Err()
	})
	ev := &ferryevent.Event{Topic: "t", Key: "k", Type: "T"}
	require.NoError(t, ferryevent.Prepare(ev, 0, 0, time.Now()))
	_, err = c.Ingest(ctx, []*ferryevent.Event{ev})
	require.NoError(t, err)
	// A process that crashed claimed it: its claim expires, and the event
	// is rescued.
	rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "g", Worker: "crashed", Limit: 1, TTL: 100 * time.Millisecond})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	time.Sleep(150 * time.Millisecond)

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	select {
	case <-running:
	case <-time.After(time.Minute):
		t.Fatal("the rescued event never ran")
	}
	stopped := time.Now()
	stop()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("Run did not return")
	}
	took := time.Since(stopped)
	t.Logf("Run returned %v after the stop (ShutdownTimeout 300ms, ClaimTTL %v)", took.Round(time.Millisecond), claimTTL)
	require.Less(t, took, claimTTL/2, "Run waited for the rescued handler's deadline, past ShutdownTimeout")
}

// TestRescuesRunInGroups: the events of a crashed process's claims (here
// 16 keys' heads) are rescued in groups, not one at a time with a drain
// before each: on their first rescue, up to Workers of them run at once.
func TestRescuesRunInGroups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newPG(t)
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "g", Workers: 4, PollInterval: 20 * time.Millisecond, ClaimTTL: 5 * time.Second})
	require.NoError(t, err)
	var mu sync.Mutex
	running, most, done := 0, 0, 0
	c.HandleAll(func(ctx context.Context, _ pgx.Tx, _ *ferry.Event) error {
		mu.Lock()
		running++
		most = max(most, running)
		mu.Unlock()
		// Until another one runs beside it (its group's), for a second at
		// most: a loaded machine may start them apart.
		for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			mu.Lock()
			together := most > 1
			mu.Unlock()
			if together {
				break
			}
		}
		mu.Lock()
		running--
		done++
		mu.Unlock()
		return nil
	})
	var evs []*ferryevent.Event
	for i := range 16 {
		ev := &ferryevent.Event{Topic: "t", Key: fmt.Sprintf("k%d", i), Type: "T"}
		require.NoError(t, ferryevent.Prepare(ev, 0, 0, time.Now()))
		evs = append(evs, ev)
	}
	_, err = c.Ingest(ctx, evs)
	require.NoError(t, err)
	rows, err := drv.ClaimInbox(ctx, &ferrydriver.ClaimInboxParams{Group: "g", Worker: "crashed", Limit: 16, TTL: 100 * time.Millisecond})
	require.NoError(t, err)
	require.Len(t, rows, 16)
	time.Sleep(150 * time.Millisecond)
	startConsumer(t, c)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return done == 16 }, time.Minute, 10*time.Millisecond)
	// A handler's return comes before its transaction's commit: wait for
	// the last commits.
	ids := make([]uuid.UUID, len(evs))
	for i, ev := range evs {
		ids[i] = ev.ID
	}
	st, err := drv.AwaitSettled(ctx, &ferrydriver.AwaitSettledParams{Group: "g", EventIDs: ids, Deadline: time.Now().Add(time.Minute)})
	require.NoError(t, err)
	for _, ev := range evs {
		require.Equal(t, ferrydriver.InboxProcessed, st[ev.ID].State)
		require.Equal(t, 2, st[ev.ID].Attempts, "each ran once more, on its rescue")
	}
	mu.Lock()
	defer mu.Unlock()
	require.Greater(t, most, 1, "the rescued events ran one at a time")
	require.LessOrEqual(t, most, 4, "at most Workers at once")
}
