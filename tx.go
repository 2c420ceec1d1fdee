package ferry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/txdriver"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryshared/backoff"
	"github.com/google/uuid"
)

// TxOptions configure RunTx. The zero value (or nil) gives the defaults.
type TxOptions struct {
	// RequestID makes the call idempotent: the first call that commits
	// stores the result under this ID, in its own transaction; a later call
	// with the same ID and input returns the stored result without running
	// the callback. Use the client's request or idempotency key.
	RequestID string
	// Input is what the request asks for. Its JSON is fingerprinted
	// (SHA-256) and stored with the request: the same RequestID with a
	// different Input is a *RequestConflictError.
	Input any
	// MaxAttempts bounds how many times the callback runs. Default 10.
	MaxAttempts int
	// MaxElapsed bounds the whole call, attempts and backoff together;
	// no attempt starts after it. Default 30 s.
	MaxElapsed time.Duration
	// RetryBase and RetryMax bound the jittered exponential backoff
	// between attempts. Defaults 10 ms and 1 s.
	RetryBase, RetryMax time.Duration
	// ResolveTimeout bounds the wait for the outcome of a commit whose
	// answer was lost. Default 10 s.
	ResolveTimeout time.Duration
	// Logger receives one line per failed attempt. Default: slog.Default().
	Logger *slog.Logger
	// Hooks observe the call (see Hook): each TxHook hears of its start,
	// its retries and their causes, and its end. A tracing hook
	// (ferryotel) records a span of the call there.
	Hooks []ferryhook.Hook
}

func (o *TxOptions) withDefaults() TxOptions {
	out := TxOptions{}
	if o != nil {
		out = *o
	}
	if out.MaxAttempts <= 0 {
		out.MaxAttempts = 10
	}
	for _, d := range []struct {
		p *time.Duration
		v time.Duration
	}{{&out.MaxElapsed, 30 * time.Second}, {&out.RetryBase, 10 * time.Millisecond}, {&out.RetryMax, time.Second}, {&out.ResolveTimeout, 10 * time.Second}} {
		if *d.p <= 0 {
			*d.p = d.v
		}
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

// ErrCommitUnknown means the connection broke after COMMIT was sent and
// neither the database nor a request record could tell whether the
// transaction committed. The callback was not run again: check the effect
// yourself, or use TxOptions.RequestID so that a resend can tell.
var ErrCommitUnknown = errors.New("ferry: the commit's outcome is unknown")

// RequestConflictError is returned when a request ID is reused with a
// different input: the stored result belongs to another request.
type RequestConflictError struct {
	RequestID string
}

func (e *RequestConflictError) Error() string {
	return fmt.Sprintf("ferry: request %q was already made with a different input; use a new request ID for a new request", e.RequestID)
}

// TxRetriesExhaustedError is returned when the attempts or the time budget
// ran out while the database kept asking for a retry.
type TxRetriesExhaustedError struct {
	Attempts int
	Elapsed  time.Duration
	// Cause is the class of the last error ("serialization_failure", ...).
	Cause string
	Err   error
}

func (e *TxRetriesExhaustedError) Error() string {
	return fmt.Sprintf("ferry: transaction gave up after %d attempts in %v (last: %s): %v", e.Attempts, e.Elapsed.Round(time.Millisecond), e.Cause, e.Err)
}

func (e *TxRetriesExhaustedError) Unwrap() error { return e.Err }

// RerunTx asks RunTx to run the whole callback again (within the same
// attempt and time bounds) after err: for a race only the application can
// recognise, such as a unique index on a business key that a concurrent
// request filled first. On databases where that error ends the
// transaction (MongoDB), the rerun is the only way to read the winner.
func RerunTx(err error) error { return &rerunError{err: err} }

type rerunError struct{ err error }

func (e *rerunError) Error() string { return "rerun requested: " + e.err.Error() }
func (e *rerunError) Unwrap() error { return e.err }

// txRun is the state of one RunTx call that outlives its attempts: the IDs
// minted for it. It travels in the attempt's context.
type txRun struct {
	mu      sync.Mutex
	named   map[string]uuid.UUID
	emitted []uuid.UUID
	next    int // index into emitted for this attempt
	attempt int
}

type txRunKey struct{}

func runFrom(ctx context.Context) *txRun {
	r, _ := ctx.Value(txRunKey{}).(*txRun)
	return r
}

// StableID returns an ID for name that is the same on every attempt of the
// RunTx call whose context ctx is: use it for entities the callback may
// create (a candidate company ID, say), so that a retry does not mint a new
// one. Outside RunTx it returns a new ID each time.
func StableID(ctx context.Context, name string) uuid.UUID {
	r := runFrom(ctx)
	if r == nil {
		return NewID()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if id, ok := r.named[name]; ok {
		return id
	}
	id := NewID()
	r.named[name] = id
	return id
}

// TxAttempt returns the attempt number (1 for the first) of the RunTx call
// whose context ctx is, or 0 outside RunTx.
func TxAttempt(ctx context.Context) int {
	if r := runFrom(ctx); r != nil {
		return r.attempt
	}
	return 0
}

// nextEventID gives the n-th event emitted in an attempt the same ID as the
// n-th event of the previous attempts.
func nextEventID(ctx context.Context) uuid.UUID {
	r := runFrom(ctx)
	if r == nil {
		return uuid.Nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.next == len(r.emitted) {
		r.emitted = append(r.emitted, NewID())
	}
	id := r.emitted[r.next]
	r.next++
	return id
}

// RunTx runs fn in a transaction of t's database and commits it, running
// it again when the database says the transaction lost a race
// (PostgreSQL serialization failures and deadlocks, SQLite's busy lock,
// MongoDB's TransientTransactionError): the whole callback, since its
// reads are stale. Attempts and total time are bounded, with jittered
// backoff between attempts; ctx cancels.
//
// A commit whose answer was lost is never blindly run again: RunTx asks the
// database whether that transaction committed (and returns fn's result if
// it did), or reads the request record; if neither can tell, it returns
// ErrCommitUnknown.
//
// With opts.RequestID, the request ID, a fingerprint of opts.Input and the
// JSON of the result are stored in the same transaction: a resend returns
// the stored result without running fn, a different input under the same
// ID is a *RequestConflictError, and of concurrent duplicates one runs and
// the others return its result. R must therefore round-trip through JSON.
//
// IDs are stable across attempts: events emitted with EmitTx on ctx get the
// same IDs on every attempt (in emit order), and StableID(ctx, name) names
// other entities. fn must have no effect outside the transaction (no
// e-mail, no HTTP call): emit an event with EmitTx and act on it in a
// consumer, which sees it once the transaction committed.
func RunTx[R any, TTx any](ctx context.Context, t txdriver.Transactor[TTx], opts *TxOptions, fn func(ctx context.Context, tx TTx) (R, error)) (R, error) {
	o := opts.withDefaults()
	call := &txCall{m: newCallMetrics(o.Hooks)}
	for _, th := range ferryhook.Of[ferryhook.TxHook](o.Hooks) {
		var obs ferryhook.TxObserver
		if ctx, obs = th.OnTxStart(ctx, o.RequestID); obs != nil {
			call.observers = append(call.observers, obs)
		}
	}
	r, err := runTx(ctx, t, &o, fn, call)
	for _, obs := range call.observers {
		obs.OnEnd(max(call.attempts, 1), err)
	}
	return r, err
}

// txCall is what one RunTx call reports: its metrics, its observers, and
// how many attempts began.
type txCall struct {
	m         *callMetrics
	observers []ferryhook.TxObserver
	attempts  int
}

// retry reports that attempt failed for cause and runs again.
func (c *txCall) retry(attempt int, cause string, err error) {
	c.m.txRetries.Add(1, cause)
	for _, obs := range c.observers {
		obs.OnRetry(attempt, cause, err)
	}
}

// runTx is RunTx once the hooks have started: call hears of its attempts
// and retries.
func runTx[R any, TTx any](ctx context.Context, t txdriver.Transactor[TTx], o *TxOptions, fn func(ctx context.Context, tx TTx) (R, error), call *txCall) (R, error) {
	m := call.m
	var zero R
	start := time.Now()
	log := o.Logger
	var fp string
	if o.RequestID != "" {
		var err error
		if fp, err = fingerprint(o.Input); err != nil {
			return zero, err
		}
		log = log.With("request_id", o.RequestID)
		rec, err := t.GetRequest(ctx, o.RequestID)
		switch {
		case err == nil:
			return replay[R](m, rec, o.RequestID, fp)
		case !errors.Is(err, ferrydriver.ErrNotFound):
			return zero, fmt.Errorf("ferry: read request %s: %w", o.RequestID, err)
		}
	}
	run := &txRun{named: map[string]uuid.UUID{}}
	ctx = context.WithValue(ctx, txRunKey{}, run)
	policy := backoff.Policy{Base: o.RetryBase, Max: o.RetryMax}
	for attempt := 1; ; attempt++ {
		run.mu.Lock()
		run.next, run.attempt = 0, attempt
		run.mu.Unlock()
		call.attempts = attempt
		var result R
		err := t.AttemptTx(ctx, func(ctx context.Context, tx TTx) error {
			if o.RequestID != "" {
				if err := t.ClaimRequestTx(ctx, tx, &txdriver.ClaimRequestParams{ID: o.RequestID, Fingerprint: fp}); err != nil {
					return err
				}
			}
			r, err := fn(ctx, tx)
			if err != nil {
				return err
			}
			result = r
			if o.RequestID != "" {
				b, err := json.Marshal(r)
				if err != nil {
					return fmt.Errorf("ferry: the result of request %s must encode as JSON to be stored: %w", o.RequestID, err)
				}
				return t.FinishRequestTx(ctx, tx, &txdriver.FinishRequestParams{ID: o.RequestID, Result: b})
			}
			return nil
		})
		if err == nil {
			m.txCalls.Add(1, "committed")
			return result, nil
		}
		if errors.Is(err, txdriver.ErrRequestExists) {
			// A duplicate committed first: its result is the answer.
			rec, gerr := t.GetRequest(ctx, o.RequestID)
			if gerr != nil {
				return zero, fmt.Errorf("ferry: read request %s after a concurrent duplicate: %w", o.RequestID, gerr)
			}
			log.Debug("ferry: a concurrent duplicate of the request committed first", "attempt", attempt)
			return replay[R](m, rec, o.RequestID, fp)
		}
		cause := ""
		var cu *txdriver.CommitUnknownError
		if errors.As(err, &cu) {
			outcome := resolveCommit(ctx, t, cu, o, log, attempt)
			switch outcome {
			case txdriver.Committed:
				m.txCalls.Add(1, "committed")
				return result, nil
			case txdriver.OutcomeUnknown:
				if o.RequestID != "" {
					rec, gerr := t.GetRequest(ctx, o.RequestID)
					if gerr == nil {
						m.txCalls.Add(1, "committed")
						return replay[R](m, rec, o.RequestID, fp)
					}
				}
				m.txCalls.Add(1, "commit_unknown")
				return zero, fmt.Errorf("%w: %w", ErrCommitUnknown, err)
			}
			cause = "commit_aborted" // rolled back: safe to run again
		} else if rr := (*rerunError)(nil); errors.As(err, &rr) {
			cause = "rerun_requested"
			log.Info("ferry: the callback asked for a rerun; running it again", "attempt", attempt, "cause", cause, "err", rr.err)
		} else {
			info := t.ClassifyTxError(err)
			if info.Class != txdriver.Retry {
				m.txCalls.Add(1, "failed")
				return zero, err
			}
			cause = info.Cause
			attrs := []any{"attempt", attempt, "cause", cause, "err", err}
			if info.Relation != "" {
				attrs = append(attrs, "relation", info.Relation)
			}
			if info.Key != "" {
				attrs = append(attrs, "key", info.Key)
			}
			log.Info("ferry: transaction lost a race; running it again", attrs...)
		}
		delay := policy.Delay(attempt)
		if attempt >= o.MaxAttempts || time.Since(start)+delay > o.MaxElapsed {
			m.txCalls.Add(1, "exhausted")
			return zero, &TxRetriesExhaustedError{Attempts: attempt, Elapsed: time.Since(start), Cause: cause, Err: err}
		}
		call.retry(attempt, cause, err)
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return zero, ctx.Err()
		case <-timer.C:
		}
	}
}

func resolveCommit[TTx any](ctx context.Context, t txdriver.Transactor[TTx], cu *txdriver.CommitUnknownError, o *TxOptions, log *slog.Logger, attempt int) txdriver.Outcome {
	// Resolved even if ctx ended: the caller must learn what happened.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.ResolveTimeout)
	defer cancel()
	outcome, err := t.ResolveCommit(rctx, cu)
	if err != nil {
		log.Warn("ferry: could not find out whether the transaction committed", "attempt", attempt, "err", err, "commit_err", cu.Err)
		return txdriver.OutcomeUnknown
	}
	if outcome == txdriver.OutcomeUnknown {
		log.Warn("ferry: the connection broke after COMMIT and the database cannot tell whether it committed (no request record to read)",
			"attempt", attempt, "err", cu.Err)
		return outcome
	}
	log.Info("ferry: the connection broke after COMMIT; resolved the outcome from the database",
		"attempt", attempt, "committed", outcome == txdriver.Committed, "err", cu.Err)
	return outcome
}

// replay returns a stored result, or a conflict when the input differs.
func replay[R any](m *callMetrics, rec *txdriver.RequestRecord, id, fp string) (R, error) {
	var r R
	if rec.Fingerprint != fp {
		m.txCalls.Add(1, "conflict")
		return r, &RequestConflictError{RequestID: id}
	}
	if err := json.Unmarshal(rec.Result, &r); err != nil {
		return r, fmt.Errorf("ferry: decode the stored result of request %s: %w", id, err)
	}
	m.txCalls.Add(1, "replayed")
	return r, nil
}

// fingerprint is the SHA-256 of the input's JSON.
func fingerprint(input any) (string, error) {
	b, err := json.Marshal(input)
	if err != nil {
		return "", fmt.Errorf("ferry: TxOptions.Input must encode as JSON to be fingerprinted: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// KeepRequests removes request records older than retention every
// interval (default: retention/10, at most an hour), in batches, until ctx
// ends. Keep records as long as clients may resend a request: a resend
// after its record is gone runs again. Run it in one goroutine per
// database:
//
//	go ferry.KeepRequests(ctx, drv, 7*24*time.Hour, 0)
func KeepRequests(ctx context.Context, p txdriver.RequestPruner, retention, interval time.Duration) error {
	if retention <= 0 {
		return fmt.Errorf("ferry: KeepRequests needs a positive retention, got %v", retention)
	}
	if interval <= 0 {
		interval = min(retention/10, time.Hour)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		for {
			n, err := p.DeleteRequests(ctx, &txdriver.DeleteRequestsParams{OlderThan: retention, Limit: ferrydriver.RetentionChunk})
			if err != nil && ctx.Err() == nil {
				slog.Default().Warn("ferry: could not delete old request records", "err", err)
			}
			if err != nil || n < ferrydriver.RetentionChunk {
				break
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
