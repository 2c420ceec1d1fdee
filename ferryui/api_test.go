package ferryui_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferryui/uiapi"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryshared/memsink"
	"github.com/ferry-dev/ferry/ferryui"
	"github.com/ferry-dev/ferry/ferryui/ferryuitest"
)

func TestMain(m *testing.M) { ferrypgtest.Main(m) }

func TestAPISuitePostgres(t *testing.T) {
	t.Parallel()
	drv, err := ferrypg.New(ferrypgtest.Pool(t), &ferrypg.Config{Schema: ferrypgtest.Schema(t)})
	require.NoError(t, err)
	_, err = drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	ferryuitest.Run(t, drv, drv)
}

// TestFeedsNameTheOpenOutboxTransaction: a producer's transaction left
// open (its event emitted, not committed) is named, pid, state and age,
// while the relay publishes everything else; once it commits, its event is
// published and none is named.
func TestFeedsNameTheOpenOutboxTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := ferrypgtest.Pool(t)
	drv, err := ferrypg.New(pool, &ferrypg.Config{Schema: ferrypgtest.Schema(t)})
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	client, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	sink := &memsink.Sink{}
	relay, err := ferry.NewRelay(drv, sink, &ferry.RelayConfig{PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	t.Cleanup(func() { stop(); require.NoError(t, <-done) })

	h, err := ferryui.New(&ferryui.Config{Store: drv, ReadOnly: true, OpenReads: true})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	oldest := func() *uiapi.OpenTxJSON {
		resp, err := http.Get(srv.URL + "/api/v1/feeds")
		require.NoError(t, err)
		defer resp.Body.Close()
		var out struct {
			Tx *uiapi.OpenTxJSON `json:"oldest_outbox_tx"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return out.Tx
	}
	require.Nil(t, oldest())

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var pid int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	require.NoError(t, client.EmitTx(ctx, tx, &ferry.Event{Topic: "orders", Key: "slow", Type: "T"}))
	require.NoError(t, client.Emit(ctx, &ferry.Event{Topic: "orders", Key: "fast", Type: "T"}))
	require.Eventually(t, func() bool { return sink.Len() == 1 }, 30*time.Second, 10*time.Millisecond, "the committed event goes")
	o := oldest()
	require.NotNil(t, o, "the open transaction is named")
	require.Equal(t, pid, o.PID)
	require.Equal(t, "idle in transaction", o.State)
	require.GreaterOrEqual(t, o.AgeSeconds, 0.0)

	require.NoError(t, tx.Commit(ctx))
	require.Eventually(t, func() bool { return sink.Len() == 2 }, 30*time.Second, 10*time.Millisecond, "committed, its event is published")
	// (the relay's own retention takes the same lock, for a moment)
	require.Eventually(t, func() bool { return oldest() == nil }, 10*time.Second, 10*time.Millisecond, "no open transaction has written to the outbox")
}

// blockingStore opens feeds only once release is closed, saying on opened
// that it was asked.
type blockingStore struct {
	ferrydriver.Store
	opened  chan struct{}
	release chan struct{}
}

func (s *blockingStore) OpenFeed(ctx context.Context, p *ferrydriver.OpenFeedParams) (ferrydriver.Feed, error) {
	s.opened <- struct{}{}
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Store.OpenFeed(ctx, p)
}

// TestBacklogLookupsAreBounded: an event looked for in the backlog opens
// a feed per partition (on MariaDB a replication connection): two lookups
// run at a time, a third is answered 503 at once, and a lookup reads at
// most 20,000 events.
func TestBacklogLookupsAreBounded(t *testing.T) {
	t.Parallel()
	drv, err := ferrypg.New(ferrypgtest.Pool(t), &ferrypg.Config{Schema: ferrypgtest.Schema(t)})
	require.NoError(t, err)
	_, err = drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	store := &blockingStore{Store: drv, opened: make(chan struct{}, 2), release: make(chan struct{})}
	h, err := ferryui.New(&ferryui.Config{Store: store, ReadOnly: true, OpenReads: true})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	get := func(path string) *http.Response {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}
	done := make(chan int, 2)
	for range 2 {
		go func() { done <- get("/api/v1/events/" + ferry.NewID().String()).StatusCode }()
	}
	<-store.opened
	<-store.opened
	resp := get("/api/v1/events/" + ferry.NewID().String())
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "a third lookup while two run")
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	close(store.release)
	require.Equal(t, http.StatusNotFound, <-done)
	require.Equal(t, http.StatusNotFound, <-done)
	require.Equal(t, http.StatusBadRequest, get("/api/v1/events/"+ferry.NewID().String()+"?scan=20001").StatusCode)
	go func() { <-store.opened }()
	require.Equal(t, http.StatusNotFound, get("/api/v1/events/"+ferry.NewID().String()+"?scan=20000").StatusCode)
}
