package ferrydrivertest

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/txdriver"
	"github.com/stretchr/testify/require"
)

// TransactorDriver is a backend that runs application transactions.
type TransactorDriver[TTx any] interface {
	ferrydriver.Store
	txdriver.Transactor[TTx]
}

// ExerciseTransactor runs the request-record part of the suite.
// newDriver returns a driver over a fresh, migrated, isolated namespace.
func ExerciseTransactor[TTx any](t *testing.T, newDriver func(t *testing.T) TransactorDriver[TTx]) {
	t.Run("RequestRecordRoundTrip", func(t *testing.T) { t.Parallel(); testRequestRoundTrip(t, newDriver(t)) })
	t.Run("RolledBackClaimLeavesNothing", func(t *testing.T) { t.Parallel(); testRequestRollback(t, newDriver(t)) })
	t.Run("ConcurrentClaimsOneWins", func(t *testing.T) { t.Parallel(); testRequestConcurrentClaims(t, newDriver(t)) })
	t.Run("RequestRetention", func(t *testing.T) { t.Parallel(); testRequestRetention(t, newDriver(t)) })
}

func claimAndFinish[TTx any](ctx context.Context, d TransactorDriver[TTx], id, fp, result string) error {
	return d.AttemptTx(ctx, func(ctx context.Context, tx TTx) error {
		if err := d.ClaimRequestTx(ctx, tx, &txdriver.ClaimRequestParams{ID: id, Fingerprint: fp}); err != nil {
			return err
		}
		return d.FinishRequestTx(ctx, tx, &txdriver.FinishRequestParams{ID: id, Result: []byte(result)})
	})
}

func testRequestRoundTrip[TTx any](t *testing.T, d TransactorDriver[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	_, err := d.GetRequest(ctx, "r1")
	require.ErrorIs(t, err, ferrydriver.ErrNotFound)
	require.NoError(t, claimAndFinish(ctx, d, "r1", "fp1", `{"n":1}`))
	rec, err := d.GetRequest(ctx, "r1")
	require.NoError(t, err)
	require.Equal(t, "fp1", rec.Fingerprint)
	require.JSONEq(t, `{"n":1}`, string(rec.Result))
	require.WithinDuration(t, time.Now(), rec.CreatedAt, time.Minute)
	err = claimAndFinish(ctx, d, "r1", "fp2", `{"n":2}`)
	require.ErrorIs(t, err, txdriver.ErrRequestExists, "a committed request cannot be claimed again")
	rec, err = d.GetRequest(ctx, "r1")
	require.NoError(t, err)
	require.JSONEq(t, `{"n":1}`, string(rec.Result), "the first result stays")
}

func testRequestRollback[TTx any](t *testing.T, d TransactorDriver[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	boom := context.Canceled
	err := d.AttemptTx(ctx, func(ctx context.Context, tx TTx) error {
		require.NoError(t, d.ClaimRequestTx(ctx, tx, &txdriver.ClaimRequestParams{ID: "r", Fingerprint: "fp"}))
		return boom
	})
	require.ErrorIs(t, err, boom)
	_, err = d.GetRequest(ctx, "r")
	require.ErrorIs(t, err, ferrydriver.ErrNotFound, "a rolled-back claim leaves no record")
	require.NoError(t, claimAndFinish(ctx, d, "r", "fp", `"ok"`), "and the request can run")
	require.Equal(t, txdriver.Permanent, d.ClassifyTxError(boom).Class)
}

// Many transactions claim the same request at once: exactly one commits;
// each other one ends with ErrRequestExists or an error the backend calls
// retryable (the caller runs it again and then sees ErrRequestExists).
func testRequestConcurrentClaims[TTx any](t *testing.T, d TransactorDriver[TTx]) {
	ctx := ctxT(t, 60*time.Second)
	const n = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for i := range n {
		wg.Go(func() {
			for attempt := 0; attempt < 50; attempt++ {
				err := claimAndFinish(ctx, d, "hot", "fp", strconv.Itoa(i))
				switch {
				case err == nil:
					mu.Lock()
					won++
					mu.Unlock()
					return
				case errors.Is(err, txdriver.ErrRequestExists):
					return
				case d.ClassifyTxError(err).Class == txdriver.Retry:
					continue
				default:
					t.Errorf("claim %d: %v", i, err)
					return
				}
			}
			t.Errorf("claim %d: still retrying after 50 attempts", i)
		})
	}
	wg.Wait()
	require.Equal(t, 1, won, "exactly one claim commits")
	rec, err := d.GetRequest(ctx, "hot")
	require.NoError(t, err)
	require.NotEmpty(t, rec.Result)
}

func testRequestRetention[TTx any](t *testing.T, d TransactorDriver[TTx]) {
	ctx := ctxT(t, 30*time.Second)
	require.NoError(t, claimAndFinish(ctx, d, "old", "fp", `1`))
	n, err := d.DeleteRequests(ctx, &txdriver.DeleteRequestsParams{OlderThan: time.Hour})
	require.NoError(t, err)
	require.Zero(t, n, "young records stay")
	time.Sleep(20 * time.Millisecond)
	n, err = d.DeleteRequests(ctx, &txdriver.DeleteRequestsParams{OlderThan: 10 * time.Millisecond})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	_, err = d.GetRequest(ctx, "old")
	require.ErrorIs(t, err, ferrydriver.ErrNotFound)
}
