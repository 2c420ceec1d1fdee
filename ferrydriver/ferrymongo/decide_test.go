package ferrymongo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/ferry-dev/ferry/ferrydriver/txdriver"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

func cmdErr(code int32, labels ...string) error {
	return mongo.CommandError{Code: code, Message: fmt.Sprintf("error %d", code), Labels: labels}
}

// TestDecideStreamError walks the change-streams specification's rules.
func TestDecideStreamError(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want streamAction
	}{
		{"history lost", cmdErr(286), streamRecover},
		{"history lost, wrapped", fmt.Errorf("read feed: %w", cmdErr(286)), streamRecover},
		{"history lost even if labelled resumable", cmdErr(286, labelResumableChangeStrm), streamRecover},
		{"invalid resume token", cmdErr(260), streamRecover},
		{"change stream fatal", cmdErr(280), streamRecover},
		{"capped position lost", cmdErr(136), streamRecover},
		{"labelled resumable (4.4+)", cmdErr(11602, labelResumableChangeStrm), streamReopen},
		{"labelled resumable, unknown code", cmdErr(99999, labelResumableChangeStrm), streamReopen},
		{"cursor not found", cmdErr(43), streamReopen},
		{"network error label", cmdErr(0, labelNetwork), streamReopen},
		{"net.Error", &net.OpError{Op: "read", Err: errors.New("connection reset")}, streamReopen},
		{"other client-side error", errors.New("client is disconnected"), streamReopen},
		{"pre-4.4 resumable code NotWritablePrimary", cmdErr(10107), streamReopen},
		{"pre-4.4 resumable code ShutdownInProgress", cmdErr(91), streamReopen},
		{"pre-4.4 resumable code NotPrimaryNoSecondaryOk", cmdErr(13435), streamReopen},
		{"pre-4.4 resumable code StaleShardVersion", cmdErr(63), streamReopen},
		{"not a replica set", cmdErr(40573), streamFail},
		{"no replication", cmdErr(76), streamFail},
		{"unauthorized", cmdErr(13), streamFail},
		{"a server error with no resume", cmdErr(2), streamFail},
		{"read concern not majority", cmdErr(72), streamFail},
		{"context cancelled", context.Canceled, streamFail},
		{"deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), streamFail},
	} {
		got, why := decideStreamError(c.err)
		require.Equal(t, c.want, got, "%s: %v (%s)", c.name, c.err, why)
		require.NotEmpty(t, why)
	}
	_, why := decideStreamError(cmdErr(40573))
	require.Contains(t, why, "--replSet")
	require.Contains(t, why, "rs.initiate()")
}

// TestNextToken: which token a read reports as its position.
func TestNextToken(t *testing.T) {
	prev, pbrt, last := []byte("prev"), []byte("pbrt"), []byte("last-event")
	require.Equal(t, pbrt, nextToken(prev, pbrt, nil, 0, 0), "a quiet stream moves to its postBatchResumeToken")
	require.Equal(t, prev, nextToken(prev, nil, nil, 0, 0), "no token yet: keep the previous")
	require.Equal(t, pbrt, nextToken(prev, pbrt, last, 3, 0), "batch consumed: the stream's token")
	require.Equal(t, last, nextToken(prev, pbrt, last, 3, 5), "events left in the batch: the last returned event, never past the others")
	require.Equal(t, last, nextToken(prev, nil, last, 1, 0), "no stream token: the event's _id")
}

// TestDecideTxError walks the transactions specification's rules.
func TestDecideTxError(t *testing.T) {
	now := time.Now()
	later := now.Add(time.Minute)
	for _, c := range []struct {
		name     string
		err      error
		inCommit bool
		deadline time.Time
		want     txAction
	}{
		{"transient in the callback", cmdErr(112, labelTransient), false, later, txRerun},
		{"transient at commit", cmdErr(251, labelTransient), true, later, txRerun},
		{"unknown commit result", cmdErr(91, labelUnknownCommit), true, later, txRetryCommit},
		{"unknown commit result, network", cmdErr(0, labelUnknownCommit, labelNetwork), true, later, txRetryCommit},
		{"unknown commit result but MaxTimeMSExpired", cmdErr(50, labelUnknownCommit), true, later, txGiveUp},
		{"unknown commit with a write concern timeout", mongo.WriteException{WriteConcernError: &mongo.WriteConcernError{Code: 50}, Labels: []string{labelUnknownCommit}}, true, later, txGiveUp},
		{"unknown-commit label outside commit is not a commit retry", cmdErr(91, labelUnknownCommit), false, later, txGiveUp},
		{"budget spent", cmdErr(112, labelTransient), false, now, txGiveUp},
		{"budget spent at commit", cmdErr(91, labelUnknownCommit), true, now.Add(-time.Second), txGiveUp},
		{"duplicate key", mongo.WriteException{WriteErrors: []mongo.WriteError{{Code: 11000}}}, false, later, txGiveUp},
		{"plain error", errors.New("boom"), false, later, txGiveUp},
	} {
		require.Equal(t, c.want, decideTxError(c.err, c.inCommit, c.deadline, now), c.name)
	}
}

func TestRetentionCheck(t *testing.T) {
	require.Empty(t, retentionCheck(48*time.Hour, 24*time.Hour, 12*time.Hour))
	w := retentionCheck(24*time.Hour, 20*time.Hour, 12*time.Hour)
	require.Contains(t, w, "shorter than the oplog window")
	require.Contains(t, w, "32h0m0s")
	require.Empty(t, retentionCheck(0, 20*time.Hour, time.Hour), "keep-forever retention needs no check")
	require.Empty(t, retentionCheck(time.Hour, 0, time.Hour), "unknown oplog window: nothing to compare")

	// A TTL index shorter than the relay's retention is what counts.
	require.Equal(t, 6*time.Hour, effectiveRetention(48*time.Hour, 6*time.Hour))
	require.Equal(t, 6*time.Hour, effectiveRetention(0, 6*time.Hour))
	require.Equal(t, 48*time.Hour, effectiveRetention(48*time.Hour, 0))
	require.Equal(t, 2*time.Hour, effectiveRetention(2*time.Hour, 6*time.Hour))
	require.Zero(t, effectiveRetention(0, 0))
}

// TestClassifyTxError: what RunTx does with each MongoDB transaction error.
func TestClassifyTxError(t *testing.T) {
	d := &Driver{}
	info := d.ClassifyTxError(cmdErr(codeWriteConflict, labelTransient))
	require.Equal(t, "retry", info.Class.String())
	require.Equal(t, "WriteConflict", info.Cause)
	require.Equal(t, "retry", d.ClassifyTxError(cmdErr(251, labelTransient)).Class.String(), "NoSuchTransaction after a failover")
	require.Equal(t, "permanent", d.ClassifyTxError(cmdErr(11000)).Class.String())
	require.Equal(t, "permanent", d.ClassifyTxError(errors.New("boom")).Class.String())
	require.Equal(t, "commit_unknown", d.ClassifyTxError(&txdriver.CommitUnknownError{Err: cmdErr(91, labelUnknownCommit)}).Class.String())
}

// TestDocumentKeyString: how a captured document's _id becomes an event key.
func TestDocumentKeyString(t *testing.T) {
	key := func(v any) string {
		raw, err := bson.Marshal(bson.D{{Key: "_id", Value: v}})
		require.NoError(t, err)
		return documentKeyString(raw)
	}
	oid := bson.NewObjectID()
	require.Equal(t, "c-1", key("c-1"))
	require.Equal(t, oid.Hex(), key(oid))
	require.Equal(t, "42", key(int32(42)))
	require.Equal(t, `{"tenant":"t1","n":7}`, key(bson.D{{Key: "tenant", Value: "t1"}, {Key: "n", Value: int64(7)}}))
	require.Empty(t, documentKeyString(bson.Raw{}), "no _id: an empty key, which validation rejects")
}
