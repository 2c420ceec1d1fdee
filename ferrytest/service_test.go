package ferrytest_test

// The tests of a small order service on PostgreSQL, written as a team
// would write its own: what a transaction emits, what a handler does with
// an event, and the whole flow in one process.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferrytest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { ferrypgtest.Main(m) }

type orderPlaced struct {
	Order string `json:"order"`
	Total int    `json:"total"`
}

// service is the code under test: it places orders, each with its event
// in the order's transaction, and bills them when the event arrives.
type service struct {
	pool   *pgxpool.Pool
	drv    *ferrypg.Driver[pgx.Tx]
	client *ferry.Client[pgx.Tx]
	schema string // where its tables are (a schema per test)
}

func (s *service) placeOrder(ctx context.Context, tx pgx.Tx, order string, total int) error {
	if _, err := tx.Exec(ctx, `INSERT INTO `+s.schema+`.orders (id, total) VALUES ($1, $2)`, order, total); err != nil {
		return err
	}
	if total <= 0 {
		return nil // nothing to bill
	}
	payload, err := json.Marshal(orderPlaced{Order: order, Total: total})
	if err != nil {
		return err
	}
	return s.client.EmitTx(ctx, tx, &ferry.Event{Topic: "orders", Key: order, Type: "OrderPlaced", Payload: payload})
}

// bill is the billing group's handler: its write commits with the event's
// inbox row.
func (s *service) bill(ctx context.Context, tx pgx.Tx, _ *ferry.Event, o orderPlaced) error {
	if o.Total > 10_000 {
		return errors.New("needs a manual review")
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+s.schema+`.invoices (id, total) VALUES ($1, $2)`, o.Order, o.Total)
	return err
}

func (s *service) billing(t *testing.T) *ferry.Consumer[pgx.Tx] {
	c, err := ferry.NewConsumer(s.drv, &ferry.ConsumerConfig{Group: "billing", MaxAttempts: 2,
		RetryBase: 300 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ferry.Handle(c, "OrderPlaced", s.bill)
	return c
}

// newService gives each test a database schema of its own.
func newService(t *testing.T) *service {
	ctx := t.Context()
	pool := ferrypgtest.Pool(t)
	schema := ferrypgtest.Schema(t)
	drv, err := ferrypg.New(pool, &ferrypg.Config{Schema: schema})
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TABLE `+schema+`.orders (id text PRIMARY KEY, total int);
		CREATE TABLE `+schema+`.invoices (id text PRIMARY KEY, total int)`)
	require.NoError(t, err)
	client, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	return &service{pool: pool, drv: drv, client: client, schema: schema}
}

func (s *service) invoices(t *testing.T) map[string]int {
	rows, err := s.pool.Query(t.Context(), `SELECT id, total FROM `+s.schema+`.invoices`)
	require.NoError(t, err)
	out := map[string]int{}
	for rows.Next() {
		var id string
		var total int
		require.NoError(t, rows.Scan(&id, &total))
		out[id] = total
	}
	require.NoError(t, rows.Err())
	return out
}

func TestPlaceOrderEmitsOrderPlaced(t *testing.T) {
	s := newService(t)
	ctx := t.Context()
	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	require.NoError(t, s.placeOrder(ctx, tx, "o-1", 30))
	require.NoError(t, s.placeOrder(ctx, tx, "o-2", 0))

	ferrytest.RequireEmittedTx(t, s.drv, tx, ferrytest.Match{Type: "OrderPlaced", Key: "o-1",
		Payload: ferrytest.PayloadJSON(func(o orderPlaced) bool { return o.Total == 30 }), Count: 1})
	ferrytest.RequireNotEmittedTx(t, s.drv, tx, ferrytest.Match{Key: "o-2"})
	ferrytest.RequireNotEmitted(t, s.drv, ferrytest.Match{Key: "o-1"}) // not committed yet
}

func TestBillingAppliesEachOrderOnce(t *testing.T) {
	s := newService(t)
	billing := ferrytest.NewConsumer(t, s.billing(t), s.drv)

	placed := &ferry.Event{Topic: "orders", Key: "o-1", Type: "OrderPlaced", Payload: []byte(`{"order":"o-1","total":30}`)}
	require.Equal(t, ferrydriver.InboxProcessed, billing.Deliver(placed).State)
	again := *placed
	require.True(t, billing.Deliver(&again).Duplicate)
	require.Equal(t, map[string]int{"o-1": 30}, s.invoices(t))

	big := &ferry.Event{Topic: "orders", Key: "o-2", Type: "OrderPlaced", Payload: []byte(`{"order":"o-2","total":20000}`)}
	got := billing.Deliver(big)
	require.Equal(t, ferrydriver.InboxFailed, got.State)
	require.Contains(t, got.Error, "needs a manual review")
	require.Equal(t, ferrydriver.InboxDead, billing.Settle(big.ID).State)
	require.Equal(t, map[string]int{"o-1": 30}, s.invoices(t))
}

func TestOrdersReachTheBrokerInKeyOrder(t *testing.T) {
	s := newService(t)
	ctx := t.Context()
	for i, total := range []int{5, 6, 7} {
		require.NoError(t, pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			return s.placeOrder(ctx, tx, fmt.Sprintf("o-%d", i), total)
		}))
	}
	broker := &ferrytest.Sink{}
	ferrytest.Drain(t, s.drv, broker, nil)
	var keys []string
	for _, ev := range broker.Events() {
		keys = append(keys, ev.Key)
	}
	require.Equal(t, []string{"o-0", "o-1", "o-2"}, keys)
}
