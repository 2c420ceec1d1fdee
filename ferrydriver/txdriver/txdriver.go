// Package txdriver is the seam between ferry.RunTx and a backend: it runs
// application transactions one attempt at a time, classifies their errors
// by the database's own rules, settles commits whose outcome is unknown,
// and keeps the records of idempotent requests. Every backend of this
// repository implements Transactor.
package txdriver

import (
	"context"
	"errors"
	"time"
)

// Transactor is implemented by backends that run application transactions
// for ferry.RunTx: one attempt at a time, each classified by the database's
// own rules, and request records for idempotent requests.
type Transactor[TTx any] interface {
	// AttemptTx begins a transaction, runs fn in it and commits. A failure
	// is returned as is for ClassifyTxError; a commit whose outcome the
	// client cannot know (the connection broke after COMMIT was sent) is
	// returned as a *CommitUnknownError that ResolveCommit can settle.
	// Backends whose protocol retries a commit by itself (MongoDB's
	// UnknownTransactionCommitResult) do so inside AttemptTx.
	AttemptTx(ctx context.Context, fn func(ctx context.Context, tx TTx) error) error
	// ClassifyTxError says what an attempt's error means.
	ClassifyTxError(err error) ErrorInfo
	// ResolveCommit finds out whether the transaction of a
	// CommitUnknownError committed, waiting (bounded by ctx) for it to end.
	ResolveCommit(ctx context.Context, e *CommitUnknownError) (Outcome, error)

	// ClaimRequestTx records, in tx, that request p.ID is being processed
	// with input fingerprint p.Fingerprint. If a committed record exists
	// it returns ErrRequestExists (the caller reads it with GetRequest);
	// a concurrent claim waits for the other transaction, or fails with an
	// error ClassifyTxError calls retryable.
	ClaimRequestTx(ctx context.Context, tx TTx, p *ClaimRequestParams) error
	// FinishRequestTx stores the request's result in tx.
	FinishRequestTx(ctx context.Context, tx TTx, p *FinishRequestParams) error
	// GetRequest reads a committed request record, or ferrydriver.ErrNotFound.
	GetRequest(ctx context.Context, id string) (*RequestRecord, error)
	RequestPruner
}

// RequestPruner removes old request records (every Transactor is one:
// ferry.KeepRequests takes it).
type RequestPruner interface {
	// DeleteRequests removes records created more than p.OlderThan ago, at
	// most p.Limit; it returns how many.
	DeleteRequests(ctx context.Context, p *DeleteRequestsParams) (int64, error)
}

// ErrRequestExists is returned by ClaimRequestTx when the request ID was
// already recorded by a committed transaction.
var ErrRequestExists = errors.New("request already recorded")

// ErrorClass is what to do after a failed attempt.
type ErrorClass int

const (
	// Permanent: the error is the caller's; do not run again.
	Permanent ErrorClass = iota
	// Retry: the transaction was rolled back and its reads may be stale:
	// run the whole callback again (serialization failure, deadlock,
	// MongoDB TransientTransactionError, SQLITE_BUSY).
	Retry
	// CommitUnknown: the commit was sent and its outcome is unknown.
	CommitUnknown
)

func (c ErrorClass) String() string {
	switch c {
	case Retry:
		return "retry"
	case CommitUnknown:
		return "commit_unknown"
	}
	return "permanent"
}

// ErrorInfo classifies an attempt's error.
type ErrorInfo struct {
	Class ErrorClass
	// Cause names the condition: "serialization_failure",
	// "deadlock_detected", "TransientTransactionError", "busy",
	// "commit_unknown", or the backend's code.
	Cause string
	// Relation and Key name the contended table (collection) and key when
	// the error says; empty otherwise.
	Relation, Key string
}

// CommitUnknownError means a commit was sent and no answer came back.
type CommitUnknownError struct {
	// Token is the backend's handle on the transaction (PostgreSQL: its
	// transaction ID), for ResolveCommit.
	Token string
	Err   error
}

func (e *CommitUnknownError) Error() string {
	return "commit outcome unknown: the connection broke after COMMIT was sent: " + e.Err.Error()
}

func (e *CommitUnknownError) Unwrap() error { return e.Err }

// Outcome is what ResolveCommit found.
type Outcome int

const (
	// OutcomeUnknown: the backend cannot tell (yet).
	OutcomeUnknown Outcome = iota
	Committed
	Aborted
)

// ClaimRequestParams name a request and its input.
type ClaimRequestParams struct {
	ID          string
	Fingerprint string
}

// FinishRequestParams store a request's result.
type FinishRequestParams struct {
	ID     string
	Result []byte
}

// RequestRecord is a stored request.
type RequestRecord struct {
	ID          string
	Fingerprint string
	// Result is the callback's result as JSON; nil while the claiming
	// transaction has not finished it (never visible once committed).
	Result    []byte
	CreatedAt time.Time
}

// DeleteRequestsParams bound request retention.
type DeleteRequestsParams struct {
	OlderThan time.Duration
	// Limit caps the records removed; 0 means ferrydriver.RetentionChunk.
	Limit int
}
