package ferrymongo

import (
	"errors"
	"testing"

	"github.com/ferry-dev/ferry/ferrydriver/txdriver"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// An append refused by the outbox's validator is a configuration error
// only for a driver that asserts a count the database does not store; a
// driver that follows the count (or one whose count is the stored one,
// during a change) runs the transaction again.
func TestDecideRefusal(t *testing.T) {
	for _, tc := range []struct {
		configured, stored int
		want               refusalAction
	}{
		{0, 8, refusalRetry},          // follows: now knows 8
		{0, 4, refusalRetry},          // follows, count unchanged: a change is under way
		{4, 4, refusalRetry},          // asserts the stored count: a change is under way
		{4, 8, refusalMisconfigured},  // asserts another count
		{16, 8, refusalMisconfigured}, // likewise
	} {
		require.Equal(t, tc.want, decideRefusal(tc.configured, tc.stored), "configured %d, stored %d", tc.configured, tc.stored)
	}
}

func TestPartitionValidator(t *testing.T) {
	unguarded := bson.D{{Key: "pc", Value: bson.D{{Key: "$exists", Value: false}}}}
	require.Equal(t, unguarded, partitionValidator(0), "while a change is checked, every guarded event is refused")
	require.Equal(t, bson.D{{Key: "$or", Value: bson.A{unguarded, bson.D{{Key: "pc", Value: 4}}}}}, partitionValidator(4))
}

// The error of a refused append that should run again is a
// TransientTransactionError for WithTransaction and for RunTx.
func TestPartitionsChangedIsTransient(t *testing.T) {
	err := error(&partitionsChangedError{used: 4, stored: 8, err: errors.New("Document failed validation")})
	var le mongo.LabeledError
	require.True(t, errors.As(err, &le))
	require.True(t, le.HasErrorLabel("TransientTransactionError"))
	require.Equal(t, txdriver.Retry, (&Driver{}).ClassifyTxError(err).Class)
	require.Contains(t, err.Error(), "from 4 to 8")
	require.Contains(t, (&partitionsChangedError{used: 4, stored: 4, err: err}).Error(), "ferry migrate up")
}
