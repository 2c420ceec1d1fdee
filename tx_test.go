package ferry_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/txdriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// fakeTx is the transaction of fakeTransactor: its writes apply at commit.
type fakeTx struct{ writes []string }

var errConflict = errors.New("conflict")

// fakeTransactor scripts attempt outcomes: each entry of plan is the error
// the attempt's commit returns (nil commits).
type fakeTransactor struct {
	mu        sync.Mutex
	plan      []error
	attempts  int
	committed [][]string
	requests  map[string]*txdriver.RequestRecord
	pending   map[*fakeTx]*txdriver.RequestRecord
	resolve   txdriver.Outcome
}

func newFake(plan ...error) *fakeTransactor {
	return &fakeTransactor{plan: plan, requests: map[string]*txdriver.RequestRecord{}, pending: map[*fakeTx]*txdriver.RequestRecord{}}
}

func (f *fakeTransactor) AttemptTx(ctx context.Context, fn func(context.Context, *fakeTx) error) error {
	f.mu.Lock()
	f.attempts++
	var planned error
	if len(f.plan) > 0 {
		planned, f.plan = f.plan[0], f.plan[1:]
	}
	f.mu.Unlock()
	tx := &fakeTx{}
	if err := fn(ctx, tx); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var cu *txdriver.CommitUnknownError
	if planned != nil && !(errors.As(planned, &cu) && f.resolve == txdriver.Committed) {
		delete(f.pending, tx)
		return planned
	}
	f.committed = append(f.committed, tx.writes)
	if rec := f.pending[tx]; rec != nil {
		f.requests[rec.ID] = rec
	}
	return planned
}

func (f *fakeTransactor) ClassifyTxError(err error) txdriver.ErrorInfo {
	if errors.Is(err, errConflict) {
		return txdriver.ErrorInfo{Class: txdriver.Retry, Cause: "conflict", Relation: "t"}
	}
	return txdriver.ErrorInfo{Class: txdriver.Permanent}
}

func (f *fakeTransactor) ResolveCommit(context.Context, *txdriver.CommitUnknownError) (txdriver.Outcome, error) {
	return f.resolve, nil
}

func (f *fakeTransactor) ClaimRequestTx(_ context.Context, tx *fakeTx, p *txdriver.ClaimRequestParams) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.requests[p.ID]; ok {
		return txdriver.ErrRequestExists
	}
	f.pending[tx] = &txdriver.RequestRecord{ID: p.ID, Fingerprint: p.Fingerprint}
	return nil
}

func (f *fakeTransactor) FinishRequestTx(_ context.Context, tx *fakeTx, p *txdriver.FinishRequestParams) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending[tx].Result = p.Result
	return nil
}

func (f *fakeTransactor) GetRequest(_ context.Context, id string) (*txdriver.RequestRecord, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r, ok := f.requests[id]; ok {
		return r, nil
	}
	return nil, ferrydriver.ErrNotFound
}

func (f *fakeTransactor) DeleteRequests(context.Context, *txdriver.DeleteRequestsParams) (int64, error) {
	return 0, nil
}

var quiet = &ferry.TxOptions{Logger: slog.New(slog.DiscardHandler), RetryBase: time.Millisecond, RetryMax: 2 * time.Millisecond}

func opts(mod func(o *ferry.TxOptions)) *ferry.TxOptions {
	o := *quiet
	mod(&o)
	return &o
}

func TestRunTxRerunsTheWholeCallbackWithStableIDs(t *testing.T) {
	f := newFake(errConflict, errConflict, nil)
	var named []uuid.UUID
	var attempts []int
	n, err := ferry.RunTx(context.Background(), f, quiet, func(ctx context.Context, tx *fakeTx) (int, error) {
		named = append(named, ferry.StableID(ctx, "company"))
		attempts = append(attempts, ferry.TxAttempt(ctx))
		tx.writes = append(tx.writes, "w")
		return 7, nil
	})
	require.NoError(t, err)
	require.Equal(t, 7, n)
	require.Equal(t, []int{1, 2, 3}, attempts)
	require.Len(t, named, 3)
	require.Equal(t, named[0], named[1])
	require.Equal(t, named[0], named[2])
	require.Len(t, f.committed, 1, "only the last attempt committed")
	require.NotEqual(t, named[0], ferry.StableID(context.Background(), "company"), "outside RunTx each call is new")
}

func TestRunTxStopsOnPermanentErrorsAndBudgets(t *testing.T) {
	boom := errors.New("boom")
	f := newFake()
	_, err := ferry.RunTx(context.Background(), f, quiet, func(context.Context, *fakeTx) (int, error) { return 0, boom })
	require.ErrorIs(t, err, boom)
	require.Equal(t, 1, f.attempts, "a permanent error is not retried")

	f = newFake(errConflict, errConflict, errConflict, errConflict, errConflict)
	_, err = ferry.RunTx(context.Background(), f, opts(func(o *ferry.TxOptions) { o.MaxAttempts = 3 }), func(context.Context, *fakeTx) (int, error) { return 1, nil })
	var ex *ferry.TxRetriesExhaustedError
	require.ErrorAs(t, err, &ex)
	require.Equal(t, 3, ex.Attempts)
	require.Equal(t, "conflict", ex.Cause)
	require.ErrorIs(t, err, errConflict)
	require.Equal(t, 3, f.attempts)

	f = newFake(errConflict, errConflict, errConflict, errConflict, errConflict)
	_, err = ferry.RunTx(context.Background(), f, opts(func(o *ferry.TxOptions) {
		o.MaxElapsed, o.RetryBase, o.RetryMax = 30*time.Millisecond, 20*time.Millisecond, 20*time.Millisecond
	}), func(context.Context, *fakeTx) (int, error) { return 1, nil })
	require.ErrorAs(t, err, &ex)
	require.Less(t, ex.Attempts, 5, "the time budget stops it first")

	f = newFake(errConflict, errConflict, errConflict)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = ferry.RunTx(ctx, f, opts(func(o *ferry.TxOptions) { o.RetryBase, o.RetryMax = time.Second, time.Second }), func(context.Context, *fakeTx) (int, error) { return 1, nil })
	require.ErrorIs(t, err, context.Canceled)
}

func TestRunTxResolvesALostCommitAnswer(t *testing.T) {
	lost := &txdriver.CommitUnknownError{Token: "1", Err: errors.New("connection reset")}
	for _, c := range []struct {
		outcome  txdriver.Outcome
		attempts int
		err      error
	}{
		{txdriver.Committed, 1, nil},                         // committed: fn's result, not run again
		{txdriver.Aborted, 2, nil},                           // rolled back: run again
		{txdriver.OutcomeUnknown, 1, ferry.ErrCommitUnknown}, // cannot tell: say so
	} {
		f := newFake(lost)
		f.resolve = c.outcome
		n, err := ferry.RunTx(context.Background(), f, quiet, func(context.Context, *fakeTx) (int, error) { return 5, nil })
		require.Equal(t, c.attempts, f.attempts, "outcome %v", c.outcome)
		if c.err != nil {
			require.ErrorIs(t, err, c.err)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, 5, n)
		require.Len(t, f.committed, 1)
	}
}

type linkResult struct {
	ID    uuid.UUID `json:"id"`
	Count int       `json:"count"`
}

func TestRunTxIdempotentRequests(t *testing.T) {
	f := newFake()
	runs := 0
	call := func(input string) (linkResult, error) {
		return ferry.RunTx(context.Background(), f, opts(func(o *ferry.TxOptions) { o.RequestID, o.Input = "req-1", input }),
			func(ctx context.Context, tx *fakeTx) (linkResult, error) {
				runs++
				return linkResult{ID: ferry.StableID(ctx, "x"), Count: runs}, nil
			})
	}
	first, err := call("a")
	require.NoError(t, err)
	again, err := call("a")
	require.NoError(t, err)
	require.Equal(t, first, again, "a resend returns the stored result")
	require.Equal(t, 1, runs, "without running the callback")
	_, err = call("b")
	var conflict *ferry.RequestConflictError
	require.ErrorAs(t, err, &conflict)
	require.Equal(t, 1, runs)

	// The answer of the first commit was lost and nobody can tell: the
	// request record can.
	f = newFake(&txdriver.CommitUnknownError{Err: errors.New("reset")})
	f.resolve = txdriver.Committed
	n, err := ferry.RunTx(context.Background(), f, opts(func(o *ferry.TxOptions) { o.RequestID = "r" }), func(context.Context, *fakeTx) (int, error) { return 3, nil })
	require.NoError(t, err)
	require.Equal(t, 3, n)
}

// Events emitted with EmitTx in RunTx get the same IDs on every attempt.
func TestEmitTxIDsAreStableAcrossAttempts(t *testing.T) {
	drv := newCapturingDriver()
	c, err := ferry.NewClient[*fakeTx](drv, nil)
	require.NoError(t, err)
	f := newFake(errConflict, nil)
	var ids [][]uuid.UUID
	_, err = ferry.RunTx(context.Background(), f, quiet, func(ctx context.Context, tx *fakeTx) (int, error) {
		a := &ferry.Event{Topic: "t", Key: "k", Type: "A"}
		b := &ferry.Event{Topic: "t", Key: "k", Type: "B"}
		if err := c.EmitTx(ctx, tx, a, b); err != nil {
			return 0, err
		}
		ids = append(ids, []uuid.UUID{a.ID, b.ID})
		return 0, nil
	})
	require.NoError(t, err)
	require.Len(t, ids, 2)
	require.Equal(t, ids[0], ids[1])
	require.NotEqual(t, ids[0][0], ids[0][1])
}

// capturingDriver is a Driver whose AppendTx records into the fake tx.
type capturingDriver struct {
	ferrydriver.Store // not used by these tests
}

func newCapturingDriver() *capturingDriver { return &capturingDriver{} }

func (d *capturingDriver) AppendTx(_ context.Context, tx *fakeTx, events []*ferryevent.Event) error {
	for _, ev := range events {
		tx.writes = append(tx.writes, ev.ID.String())
	}
	return nil
}

type countingPruner struct {
	mu    sync.Mutex
	calls int
	left  int64
}

func (p *countingPruner) DeleteRequests(_ context.Context, d *txdriver.DeleteRequestsParams) (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	n := min(p.left, int64(d.Limit))
	p.left -= n
	return n, nil
}

func TestKeepRequestsDeletesInBatchesUntilStopped(t *testing.T) {
	p := &countingPruner{left: 12000}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ferry.KeepRequests(ctx, p, time.Hour, 10*time.Millisecond) }()
	require.Eventually(t, func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.left == 0 && p.calls >= 4 }, 5*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.Error(t, ferry.KeepRequests(context.Background(), p, 0, 0))
}

// An event built outside the callback keeps the ID it got on the first
// attempt, and the events emitted after it keep theirs: no two events of
// one commit share an ID.
func TestEmitTxIDsStayAlignedWithReusedEvents(t *testing.T) {
	c, err := ferry.NewClient[*fakeTx](newCapturingDriver(), nil)
	require.NoError(t, err)
	outer := &ferry.Event{Topic: "t", Key: "k", Type: "Outer"}
	f := newFake(errConflict, nil)
	var inner []uuid.UUID
	_, err = ferry.RunTx(context.Background(), f, quiet, func(ctx context.Context, tx *fakeTx) (int, error) {
		b := &ferry.Event{Topic: "t", Key: "k", Type: "Inner"}
		err := c.EmitTx(ctx, tx, outer, b)
		inner = append(inner, b.ID)
		return 0, err
	})
	require.NoError(t, err)
	require.Equal(t, inner[0], inner[1])
	require.NotEqual(t, outer.ID, inner[1])
	require.Equal(t, []string{outer.ID.String(), inner[1].String()}, f.committed[0])
}

func TestRerunTxRunsTheCallbackAgain(t *testing.T) {
	f := newFake()
	taken := errors.New("duplicate key")
	n := 0
	v, err := ferry.RunTx(context.Background(), f, quiet, func(ctx context.Context, tx *fakeTx) (int, error) {
		n++
		if n < 3 {
			return 0, ferry.RerunTx(taken)
		}
		return n, nil
	})
	require.NoError(t, err)
	require.Equal(t, 3, v)
	_, err = ferry.RunTx(context.Background(), newFake(), opts(func(o *ferry.TxOptions) { o.MaxAttempts = 2 }), func(context.Context, *fakeTx) (int, error) {
		return 0, ferry.RerunTx(taken)
	})
	var ex *ferry.TxRetriesExhaustedError
	require.ErrorAs(t, err, &ex)
	require.ErrorIs(t, err, taken)
	require.Equal(t, "rerun_requested", ex.Cause)
}

// TestRunTxRerunsAnEmitDeadlock: each EmitTx holds its keys' row locks until
// commit, so two transactions that emit the same two keys in opposite orders
// (two EmitTx calls each) deadlock; PostgreSQL aborts one and RunTx runs it
// again. Emitting once, as the transaction's last statement, avoids it: one
// EmitTx call locks its keys in key order.
func TestRunTxRerunsAnEmitDeadlock(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	ctx := context.Background()
	var (
		both     sync.WaitGroup
		attempts atomic.Int64
	)
	both.Add(2)
	rec := &logRecorder{}
	emit := func(first, second string) error {
		var once sync.Once
		_, err := ferry.RunTx(ctx, drv, &ferry.TxOptions{Logger: slog.New(rec)}, func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
			attempts.Add(1)
			if err := c.EmitTx(ctx, tx, &ferry.Event{Topic: "t", Key: first, Type: "T"}); err != nil {
				return struct{}{}, err
			}
			// On the first attempt, wait until the other transaction holds
			// its first key too.
			once.Do(func() { both.Done(); both.Wait() })
			return struct{}{}, c.EmitTx(ctx, tx, &ferry.Event{Topic: "t", Key: second, Type: "T"})
		})
		return err
	}
	errs := make(chan error, 2)
	go func() { errs <- emit("a", "b") }()
	go func() { errs <- emit("b", "a") }()
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	// Usually one deadlock and one rerun (3 attempts). On a loaded machine
	// the rerun can meet the other transaction again and lose once more;
	// every rerun must have been for a deadlock, and each must show.
	causes := rec.attrs("lost a race", "cause")
	require.NotEmpty(t, causes, "one of the two ran again")
	require.EqualValues(t, 2+len(causes), attempts.Load(), "one attempt more per logged deadlock, no other rerun")
	for _, c := range causes {
		require.Equal(t, "deadlock_detected", c)
	}
	st, err := drv.FeedStatus(ctx, &ferrydriver.FeedStatusParams{Feed: "default/0"})
	require.NoError(t, err)
	require.EqualValues(t, 4, st.LagEvents, "both transactions committed their two events once")
}
