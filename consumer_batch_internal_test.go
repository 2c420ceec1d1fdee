package ferry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestBatchSavepointsOnFailure follows the handler calls of batches in
// which the last event fails (MaxAttempts 1: it goes DEAD at once), one
// worker, one batch at a time.
//
// By default the first batch runs without savepoints and stops
// at the failure; it runs again with them, where the failing event is not
// called again and the ones before it are. Within the cooldown the next
// batch takes savepoints from the start: one call each. SavepointEach: one
// call each from the first batch on. Either way every other event is
// applied once, with one attempt.
func TestBatchSavepointsOnFailure(t *testing.T) {
	for _, each := range []bool{false, true} {
		t.Run(map[bool]string{false: "OnFailure", true: "SavepointEach"}[each], func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			drv, err := ferrypg.New(ferrypgtest.Pool(t), &ferrypg.Config{Schema: ferrypgtest.Schema(t)})
			require.NoError(t, err)
			_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
			require.NoError(t, err)
			table := pgx.Identifier{drv.Schema(), "effects"}.Sanitize()
			_, err = ferrypgtest.Pool(t).Exec(ctx, `CREATE TABLE `+table+` (event_id uuid PRIMARY KEY)`)
			require.NoError(t, err)

			c, err := NewConsumer(drv, &ConsumerConfig{Group: "g", Workers: 1, BatchSize: 32, MaxAttempts: 1, DeadPolicy: Continue,
				SavepointEach: each, PollInterval: 10 * time.Millisecond})
			require.NoError(t, err)
			// Under load the second batch may start long after the first
			// failure: the cooldown must not end between them.
			c.savepointCooldown = time.Hour
			var mu sync.Mutex
			var calls []uuid.UUID
			poison := map[uuid.UUID]bool{}
			c.HandleAll(func(ctx context.Context, tx pgx.Tx, ev *Event) error {
				mu.Lock()
				calls = append(calls, ev.ID)
				bad := poison[ev.ID]
				mu.Unlock()
				if _, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1)`, ev.ID); err != nil {
					return err
				}
				if bad {
					return errors.New("poison")
				}
				return nil
			})
			done := make(chan error, 1)
			rctx, stop := context.WithCancel(ctx)
			defer func() { stop(); require.NoError(t, <-done) }()
			batch := func(name string) (evs []*ferryevent.Event, got []uuid.UUID) {
				for i := range 10 {
					evs = append(evs, &ferryevent.Event{ID: ferryevent.NewID(), Topic: "t", Key: fmt.Sprintf("%s-k%d", name, i), Seq: 1,
						Type: "T", Payload: []byte(`{}`), CreatedAt: time.Now()})
				}
				mu.Lock()
				poison[evs[9].ID] = true
				from := len(calls)
				mu.Unlock()
				_, err := c.Ingest(ctx, evs)
				require.NoError(t, err)
				if name == "first" {
					go func() { done <- c.Run(rctx) }()
				}
				all := make([]uuid.UUID, len(evs))
				for i, ev := range evs {
					all[i] = ev.ID
				}
				var rows map[uuid.UUID]*ferrydriver.InboxRow
				require.Eventually(t, func() bool {
					rows, err = drv.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: "g", EventIDs: all})
					require.NoError(t, err)
					r := rows[evs[9].ID]
					return r != nil && r.State == ferrydriver.InboxDead
				}, time.Minute, 10*time.Millisecond)
				require.Eventually(t, func() bool {
					rows, err = drv.InboxStates(ctx, &ferrydriver.InboxIDsParams{Group: "g", EventIDs: all[:9]})
					require.NoError(t, err)
					return !slices.ContainsFunc(evs[:9], func(ev *ferryevent.Event) bool {
						return rows[ev.ID] == nil || rows[ev.ID].State != ferrydriver.InboxProcessed
					})
				}, time.Minute, 10*time.Millisecond)
				for _, ev := range evs[:9] {
					require.Equal(t, 1, rows[ev.ID].Attempts, "event of key %s", ev.Key)
				}
				mu.Lock()
				got = slices.Clone(calls[from:])
				mu.Unlock()
				return evs, got
			}

			evs, got := batch("first")
			ids := func(evs []*ferryevent.Event) []uuid.UUID {
				out := make([]uuid.UUID, len(evs))
				for i, ev := range evs {
					out[i] = ev.ID
				}
				return out
			}
			j := slices.Index(got, evs[9].ID)
			require.GreaterOrEqual(t, j, 0)
			require.Equal(t, 1, countOf(got, evs[9].ID), "the failing event's handler is called once")
			if !each {
				require.Equal(t, got[:j], got[j+1:2*j+1], "the run with savepoints calls again the handlers before the failure")
				require.Len(t, got, 2*j+1+(9-j), "and the rest once")
				require.Positive(t, j, "the failing event came last")
			} else {
				require.Len(t, got, 10)
			}
			seen := map[uuid.UUID]bool{}
			for _, id := range got {
				seen[id] = true
			}
			require.Len(t, seen, 10, "every event's handler was called")

			evs, got = batch("second")
			require.ElementsMatch(t, ids(evs), got, "within the cooldown, savepoints from the start: one call each")

			var n int
			require.NoError(t, ferrypgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n))
			require.Equal(t, 18, n, "every event but the two failing ones applied once")
		})
	}
}

func countOf(ids []uuid.UUID, id uuid.UUID) (n int) {
	for _, x := range ids {
		if x == id {
			n++
		}
	}
	return n
}
