package ferrymongo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
)

// The decisions this backend takes on MongoDB's errors live here, as small
// functions of the error and the state, so that each rule of the driver
// specifications (change streams, transactions) is unit-tested without a
// server. The code that talks to the server only carries them out.

// Server error codes the decisions depend on.
const (
	codeCursorNotFound          = 43
	codeMaxTimeMSExpired        = 50
	codeNotReplicaSet           = 40573 // "$changeStream stage is only supported on replica sets"
	codeNoReplicationEnabled    = 76
	codeIllegalOperation        = 20 // "Transaction numbers are only allowed on a replica set member or mongos"
	codeUnauthorized            = 13
	codeInvalidResumeToken      = 260
	codeChangeStreamFatal       = 280
	codeChangeStreamHistoryLost = 286
	codeCappedPositionLost      = 136
	codeWriteConflict           = 112
)

// Error labels (transactions and retryable-reads specifications).
const (
	labelTransient           = "TransientTransactionError"
	labelUnknownCommit       = "UnknownTransactionCommitResult"
	labelResumableChangeStrm = "ResumableChangeStreamError"
	labelNetwork             = "NetworkError"
)

// resumableCodes are the codes a server older than 4.4 (no
// ResumableChangeStreamError label) reports for errors a change stream
// resumes after (change-streams spec).
var resumableCodes = map[int]bool{
	6: true, 7: true, 89: true, 91: true, 189: true, 262: true, 9001: true, 10107: true, 11600: true,
	11602: true, 13435: true, 13436: true, 63: true, 150: true, 13388: true, 234: true, 133: true,
}

// streamAction is what the feed does after its change stream failed.
type streamAction int

const (
	// streamReopen: open the stream again after the last acknowledged
	// token (the driver's own single resume did not cover this error).
	streamReopen streamAction = iota
	// streamRecover: the oplog no longer holds the position (history lost,
	// token unusable): publish what the outbox says is unpublished, then
	// open a new stream.
	streamRecover
	// streamFail: stop and say why; no retry can help.
	streamFail
)

func (a streamAction) String() string {
	switch a {
	case streamReopen:
		return "reopen"
	case streamRecover:
		return "recover"
	}
	return "fail"
}

func serverErr(err error) (mongo.ServerError, bool) {
	var se mongo.ServerError
	if errors.As(err, &se) {
		return se, true
	}
	return nil, false
}

func hasCode(err error, code int) bool {
	se, ok := serverErr(err)
	return ok && se.HasErrorCode(code)
}

func hasLabel(err error, label string) bool {
	var le mongo.LabeledError
	return errors.As(err, &le) && le.HasErrorLabel(label)
}

// decideStreamError chooses what to do when opening or reading the
// feed's change stream failed. It returns why, for the log.
func decideStreamError(err error) (streamAction, string) {
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return streamFail, "the context ended"
	case hasCode(err, codeChangeStreamHistoryLost):
		return streamRecover, "ChangeStreamHistoryLost (286): the oplog no longer holds the saved position"
	case hasCode(err, codeInvalidResumeToken):
		return streamRecover, "InvalidResumeToken (260): the saved token cannot be used"
	case hasCode(err, codeChangeStreamFatal):
		return streamRecover, "ChangeStreamFatalError (280): the stream cannot resume from the saved position"
	case hasCode(err, codeCappedPositionLost):
		return streamRecover, "CappedPositionLost (136): the oplog rolled over the stream's position"
	case hasCode(err, codeNotReplicaSet) || hasCode(err, codeNoReplicationEnabled) || hasCode(err, codeIllegalOperation):
		return streamFail, notReplicaSetHelp
	case hasCode(err, codeUnauthorized):
		return streamFail, "not authorized to watch the outbox: grant the changeStream and find actions on it"
	case hasLabel(err, labelResumableChangeStrm):
		return streamReopen, "a resumable change stream error"
	case hasCode(err, codeCursorNotFound):
		return streamReopen, "the server forgot the cursor (43)"
	case hasLabel(err, labelNetwork) || mongo.IsTimeout(err):
		return streamReopen, "a network error or timeout"
	}
	if se, ok := serverErr(err); ok {
		for _, c := range se.ErrorCodes() {
			if resumableCodes[c] {
				return streamReopen, fmt.Sprintf("a resumable server error (%d)", c)
			}
		}
		return streamFail, "a server error no resume can fix"
	}
	// Any other error not from the server (a closed client, a socket
	// error without a label) is treated as transient: reopen after backoff.
	return streamReopen, "a client-side error"
}

const notReplicaSetHelp = "MongoDB is running without a replica set: change streams and transactions need one. " +
	"Start mongod with --replSet rs0 and run rs.initiate() once in mongosh (a single-node replica set is enough for development)"

// nextToken is the token a feed reports after a read, to be saved as the
// checkpoint once the sink acknowledged the batch:
//   - no event read: the stream's current token (its postBatchResumeToken
//     on an empty batch), so that a quiet outbox's position keeps up with
//     the oplog and never ages out of it; the previous one if the stream
//     has none yet;
//   - events read and the driver's batch consumed: the stream's token
//     (the postBatchResumeToken, or the last event's _id);
//   - events read but more remain in the driver's batch: the last event's
//     own _id, never a token past events not yet returned.
func nextToken(prev, stream, lastEventID []byte, read int, remainingInBatch int) []byte {
	switch {
	case read == 0 && len(stream) > 0:
		return stream
	case read == 0:
		return prev
	case remainingInBatch == 0 && len(stream) > 0:
		return stream
	default:
		return lastEventID
	}
}

// txAction is what RunTx's attempt does after a MongoDB transaction error.
type txAction int

const (
	txRerun       txAction = iota // run the whole callback again
	txRetryCommit                 // commit again (majority), not the callback
	txGiveUp                      // stop: report the error
)

// decideTxError applies the transactions specification: a
// TransientTransactionError anywhere reruns the whole callback (its reads
// are stale); an UnknownTransactionCommitResult on commit retries only
// the commit, unless it is MaxTimeMSExpired or the budget is spent; all
// else stops.
func decideTxError(err error, inCommit bool, deadline, now time.Time) txAction {
	if !now.Before(deadline) {
		return txGiveUp
	}
	if inCommit && hasLabel(err, labelUnknownCommit) {
		if hasCode(err, codeMaxTimeMSExpired) || isWriteConcernTimeout(err) {
			return txGiveUp
		}
		return txRetryCommit
	}
	if hasLabel(err, labelTransient) {
		return txRerun
	}
	return txGiveUp
}

func isWriteConcernTimeout(err error) bool {
	var we mongo.WriteException
	return errors.As(err, &we) && we.WriteConcernError != nil && we.WriteConcernError.IsMaxTimeMSExpiredError()
}

// retentionCheck compares how long the outbox keeps published events with
// how far back the oplog reaches, plus the longest relay outage to
// survive. It returns a warning, or "" when retention is long enough.
// Unpublished events are never removed; retention too short only means a
// relay down longer than the oplog window recovers from the outbox scan
// rather than the stream, which is slower, not lossy.
func retentionCheck(retention, oplogWindow, outageAllowance time.Duration) string {
	if retention <= 0 || oplogWindow <= 0 {
		return ""
	}
	need := oplogWindow + outageAllowance
	if retention >= need {
		return ""
	}
	return fmt.Sprintf("outbox retention %v is shorter than the oplog window %v plus the outage allowance %v: "+
		"raise the retention to at least %v, or the oplog (replSetResizeOplog) to cover the longest relay outage",
		retention, oplogWindow.Round(time.Minute), outageAllowance, need.Round(time.Minute))
}
