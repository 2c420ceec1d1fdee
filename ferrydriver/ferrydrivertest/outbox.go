package ferrydrivertest

import (
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/stretchr/testify/require"
)

// exerciseOutboxReader runs the tests of ferrydriver.OutboxReader when the
// backend implements it.
func exerciseOutboxReader[TTx any](t *testing.T, h Harness[TTx]) {
	t.Run("OutboxReadsWhatATransactionSees", func(t *testing.T) { t.Parallel(); testOutboxReader(t, h) })
}

func testOutboxReader[TTx any](t *testing.T, h Harness[TTx]) {
	ctx := ctxT(t, time.Minute)
	drv := h.New(t)
	r := drv.(ferrydriver.OutboxReader[TTx])
	paid := Event("orders", "o-1", `{"total":12}`)
	paid.Type, paid.Headers = "OrderPaid", map[string]string{"trace": "t-1"}
	shipped := Event("shipping", "o-1", `{}`)
	shipped.Type = "OrderShipped"
	other := Event("orders", "o-2", `{"total":3}`)
	other.Type = "OrderPaid"

	tx := h.Begin(ctx, t, drv)
	require.NoError(t, drv.AppendTx(ctx, tx.Tx, []*ferryevent.Event{paid, shipped, other}))
	got, err := r.OutboxEventsTx(ctx, tx.Tx, nil)
	require.NoError(t, err)
	require.Equal(t, []string{paid.ID.String(), shipped.ID.String(), other.ID.String()}, ids(got), "the transaction sees its events, in the order it emitted them")
	require.Equal(t, map[string]string{"trace": "t-1"}, got[0].Headers)
	require.Equal(t, []byte(`{"total":12}`), got[0].Payload)
	require.Equal(t, "OrderPaid", got[0].Type)
	if _, ok := drv.(ferrydriver.KeySeqStore); ok {
		require.Equal(t, []int64{0, 0, 0}, []int64{got[0].Seq, got[1].Seq, got[2].Seq}, "no Seq yet: the relay numbers events as it reads them")
	} else {
		require.Equal(t, []int64{1, 2, 1}, []int64{got[0].Seq, got[1].Seq, got[2].Seq}, "per-key sequence numbers")
	}

	for _, c := range []struct {
		p    ferrydriver.OutboxEventsParams
		want []string
	}{
		{ferrydriver.OutboxEventsParams{Topic: "orders"}, []string{paid.ID.String(), other.ID.String()}},
		{ferrydriver.OutboxEventsParams{Key: "o-1"}, []string{paid.ID.String(), shipped.ID.String()}},
		{ferrydriver.OutboxEventsParams{Type: "OrderShipped"}, []string{shipped.ID.String()}},
		{ferrydriver.OutboxEventsParams{Topic: "orders", Key: "o-2", Type: "OrderPaid"}, []string{other.ID.String()}},
		{ferrydriver.OutboxEventsParams{Topic: "nothing"}, []string{}},
		{ferrydriver.OutboxEventsParams{Limit: 2}, []string{paid.ID.String(), shipped.ID.String()}},
	} {
		got, err := r.OutboxEventsTx(ctx, tx.Tx, &c.p)
		require.NoError(t, err)
		require.Equal(t, c.want, ids(got), "%+v", c.p)
	}

	committed, err := r.OutboxEvents(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, committed, "nothing is committed before the transaction is")
	require.NoError(t, tx.Commit())
	committed, err = r.OutboxEvents(ctx, &ferrydriver.OutboxEventsParams{Key: "o-1"})
	require.NoError(t, err)
	require.Equal(t, []string{paid.ID.String(), shipped.ID.String()}, ids(committed))

	rolled := Event("orders", "o-3", `{}`)
	tx = h.Begin(ctx, t, drv)
	require.NoError(t, drv.AppendTx(ctx, tx.Tx, []*ferryevent.Event{rolled}))
	require.NoError(t, tx.Rollback())
	committed, err = r.OutboxEvents(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, []string{paid.ID.String(), shipped.ID.String(), other.ID.String()}, ids(committed), "a rolled-back event is not in the outbox")
}
