package ferrymysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql"
	"github.com/ferry-dev/ferry/ferryevent"
)

// TestTwoConsumerProcessesShareAGroup: two consumers of one group, each
// over a driver of its own (two processes, as far as the database can
// tell), one in batches, ingest and run 1,200 events of 40 keys, each
// delivered to both: every event is applied once, each key in order, and
// no transaction of either driver was a deadlock's victim or timed out on
// a lock (claims skip what others hold; finishes and ingestion lock rows,
// then keys, in one order).
func TestTwoConsumerProcessesShareAGroup(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a := newDriver(t, nil)
	b, err := ferrymysql.New(a.DB(), &ferrymysql.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	record, counts := effects(t, a)
	var mu sync.Mutex
	order := map[string][]int64{}
	handler := func(ctx context.Context, tx *sql.Tx, ev *ferryevent.Event) error {
		if err := record(ctx, tx, ev); err != nil {
			return err
		}
		mu.Lock()
		order[ev.Key] = append(order[ev.Key], ev.Seq)
		mu.Unlock()
		return nil
	}
	const n, keys = 1200, 40
	evs := make([]*ferryevent.Event, n)
	for i := range evs {
		evs[i] = ferrydrivertest.Event("t", fmt.Sprintf("k%02d", i%keys), strconv.Itoa(i))
		evs[i].Seq = int64(i/keys + 1)
	}
	var consumers []*ferry.Consumer[*sql.Tx]
	for i, drv := range []*ferrymysql.Driver{a, b} {
		c, err := ferry.NewConsumer[*sql.Tx](drv, &ferry.ConsumerConfig{Group: "g", Workers: 3, BatchSize: 1 + 15*i,
			PollInterval: 20 * time.Millisecond})
		require.NoError(t, err)
		c.HandleAll(handler)
		consumers = append(consumers, c)
	}
	var wg sync.WaitGroup
	runCtx, stop := context.WithCancel(ctx)
	for _, c := range consumers {
		wg.Go(func() {
			if err := c.Run(runCtx); err != nil {
				t.Errorf("run: %v", err)
			}
		})
	}
	// Each consumer ingests every event (a redelivery for the other),
	// a hundred at a time, as two lines of a broker would.
	var ingest sync.WaitGroup
	for _, c := range consumers {
		ingest.Go(func() {
			for i := 0; i < n; i += 100 {
				if _, err := c.Ingest(ctx, evs[i:i+100]); err != nil {
					t.Errorf("ingest: %v", err)
					return
				}
			}
		})
	}
	ingest.Wait()
	require.Eventually(t, func() bool {
		got, err := counts(ctx)
		require.NoError(t, err)
		return len(got) == n
	}, 2*time.Minute, 20*time.Millisecond)
	stop()
	wg.Wait()
	got, err := counts(ctx)
	require.NoError(t, err)
	for _, ev := range evs {
		require.Equal(t, 1, got[ev.ID], "event %s applied once", ev.ID)
	}
	for k, seqs := range order {
		// A call for an event called before means that the earlier call,
		// and every call of the key after it, rolled back.
		var committed []int64
		for _, s := range seqs {
			if i := slices.Index(committed, s); i >= 0 {
				committed = committed[:i]
			}
			committed = append(committed, s)
		}
		require.True(t, slices.IsSorted(committed), "key %s ran out of order: %v", k, committed)
		require.Len(t, committed, n/keys, "key %s", k)
	}
	st, err := a.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: "g", EventIDs: []uuid.UUID{evs[0].ID, evs[n-1].ID}})
	require.NoError(t, err)
	require.Equal(t, ferrydriver.InboxProcessed, st[evs[n-1].ID].State)
	require.Zero(t, a.Reruns()+b.Reruns(), "no transaction was a deadlock's victim or timed out on a lock")
	t.Logf("ingestions run again after meeting the other consumer's delivery: %d", a.Duplicates()+b.Duplicates())
}
