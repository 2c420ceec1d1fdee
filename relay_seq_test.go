package ferry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/memsink"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// writeUnnumbered writes events as a producer that leaves Seq to the relay
// does (Seq 0), or with the given Seq (as a producer that numbered it).
func writeUnnumbered(t *testing.T, drv *ferrypg.Driver[pgx.Tx], key string, seq int64, payloads ...string) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	err := pgx.BeginFunc(ctx, ferrypgtest.Pool(t), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_current_xact_id()"); err != nil { // the xid before the id, as the feed needs
			return err
		}
		for _, p := range payloads {
			id := ferryevent.NewID()
			ids = append(ids, id.String())
			if _, err := tx.Exec(ctx, `INSERT INTO `+drv.Schema()+`.outbox (partition, event_id, topic, key, seq, type, payload, created_at)
				VALUES (0, $1, 'orders', $2, $3, 'T', $4, now())`, id, key, seq, []byte(p)); err != nil {
				return err
			}
			if seq != 0 {
				seq++
			}
		}
		return nil
	})
	require.NoError(t, err)
	return ids
}

// seqsOf returns the Seqs the sink stored, by event ID (the last one stored).
func seqsOf(sink *memsink.Sink) map[string]int64 {
	out := map[string]int64{}
	for _, ev := range sink.Stored() {
		out[ev.ID.String()] = ev.Seq
	}
	return out
}

// failingCheckpoints is a store whose checkpoints are never saved.
type failingCheckpoints struct{ *ferrypg.Driver[pgx.Tx] }

func (failingCheckpoints) SaveCheckpoint(context.Context, *ferrydriver.SaveCheckpointParams) error {
	return errors.New("checkpoints are down")
}

// TestRelayNumbersWhatTheOutboxLeftUnnumbered: events written without a Seq
// get their key's next numbers from the relay, in commit order; the numbers
// are saved with the checkpoint, so that the next leader goes on from them,
// and an event delivered again after a leader failed to save carries the
// number it had. Events written with a Seq keep it.
func TestRelayNumbersWhatTheOutboxLeftUnnumbered(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	deliver := func(store ferrydriver.Store, want int) *memsink.Sink {
		t.Helper()
		sink := &memsink.Sink{}
		stop := run(t, quickRelay(t, store, sink, "r"))
		require.Eventually(t, func() bool { return sink.Len() >= want }, 30*time.Second, 10*time.Millisecond)
		stop()
		return sink
	}

	a := writeUnnumbered(t, drv, "a", 0, "a1", "a2")
	a = append(a, writeUnnumbered(t, drv, "a", 0, "a3")...)
	b := writeUnnumbered(t, drv, "b", 0, "b1")
	old := writeUnnumbered(t, drv, "old", 7, "old7", "old8")
	got := seqsOf(deliver(drv, 6))
	for i, id := range a {
		require.EqualValues(t, i+1, got[id], "a's event %d", i+1)
	}
	require.EqualValues(t, 1, got[b[0]])
	require.EqualValues(t, 7, got[old[0]], "an event written with a Seq keeps it")
	require.EqualValues(t, 8, got[old[1]])

	// The next leader goes on from the numbers saved with the checkpoint.
	more := writeUnnumbered(t, drv, "a", 0, "a4", "a5")
	got = seqsOf(deliver(drv, 2))
	require.EqualValues(t, 4, got[more[0]], "numbers go on across leaders")
	require.EqualValues(t, 5, got[more[1]])

	// A leader that cannot save its checkpoint numbers a6..a8; the next one
	// delivers them again with the same numbers.
	again := writeUnnumbered(t, drv, "a", 0, "a6", "a7", "a8")
	first := seqsOf(deliver(failingCheckpoints{drv}, 3))
	second := seqsOf(deliver(drv, 3))
	for i, id := range again {
		require.EqualValues(t, 6+i, first[id], "a%d, first delivery", 6+i)
		require.EqualValues(t, 6+i, second[id], "a%d delivered again keeps its number", 6+i)
	}
	saved, err := drv.LoadKeySeqs(context.Background(), "default/0", []string{"a", "b", "never"})
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"a": 8, "b": 1}, saved, "the numbers saved with the checkpoint")
}

// TestUpgradeGoesOnFromTheKeysNumbers: a schema of 0.1, whose producers
// numbered events in the keys table, upgraded: every feed with a
// checkpoint goes on from the keys' numbers, an event a 0.1 producer wrote
// and no relay delivered yet keeps its Seq, and the keys table is gone (a
// 0.1 producer fails instead of writing out of order). Going down again
// gives 0.1 producers the highest numbers back.
func TestUpgradeGoesOnFromTheKeysNumbers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drv := newPG(t)
	pool := ferrypgtest.Pool(t)
	s := drv.Schema()
	res, err := drv.Migrate(ctx, &ferrydriver.MigrateParams{Down: true})
	require.NoError(t, err)
	require.Equal(t, 18, res.Applied[0].Version)
	for _, q := range []string{
		`INSERT INTO ` + s + `.keys (key, seq) VALUES ('done', 5), ('pending', 3)`,
		`INSERT INTO ` + s + `.checkpoints (feed, partition, cursor, term) VALUES ('default/0', 0, NULL, 0)`,
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	old := writeUnnumbered(t, drv, "pending", 3, "pending3") // written by a 0.1 producer, not delivered
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	var gone bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1) IS NULL`, s+".keys").Scan(&gone))
	require.True(t, gone, "the keys table is dropped")

	c, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	var done, pending *ferry.Event
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		done = &ferry.Event{Topic: "orders", Key: "done", Type: "T", Payload: []byte("done6")}
		pending = &ferry.Event{Topic: "orders", Key: "pending", Type: "T", Payload: []byte("pending4")}
		return c.EmitTx(ctx, tx, done, pending)
	}))
	sink := &memsink.Sink{}
	stop := run(t, quickRelay(t, drv, sink, "r"))
	require.Eventually(t, func() bool { return sink.Len() >= 3 }, 30*time.Second, 10*time.Millisecond)
	stop()
	got := seqsOf(sink)
	require.EqualValues(t, 3, got[old[0]], "a 0.1 producer's event keeps its Seq")
	require.EqualValues(t, 4, got[pending.ID.String()], "and its key goes on after it")
	require.EqualValues(t, 6, got[done.ID.String()], "a delivered key goes on from the keys table's number")

	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{Down: true})
	require.NoError(t, err)
	var doneSeq int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT seq FROM `+s+`.keys WHERE key = 'done'`).Scan(&doneSeq))
	require.EqualValues(t, 6, doneSeq, "down again, 0.1 producers go on from the relay's numbers")
}
