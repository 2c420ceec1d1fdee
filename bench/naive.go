package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	naivePoll  = 10 * time.Millisecond
	naiveBatch = 1000
)

// naiveC is a hand-written polling outbox over a BIGSERIAL table:
//
//   - cursor: SELECT … WHERE id > $cursor ORDER BY id LIMIT n, publish,
//     UPDATE the cursor row. Ordered, but skips rows whose transaction drew
//     its id early and committed after a later id was read.
//   - claim: in one transaction, SELECT … ORDER BY id LIMIT n FOR UPDATE
//     SKIP LOCKED, publish, DELETE the rows. Loses nothing; with one relay
//     it publishes in id order, which is not commit order per key.
type naiveC struct {
	prefix string
	mode   string // "cursor" or "claim"
}

func (n *naiveC) Name() string { return "naive-" + n.mode }

func (n *naiveC) Describe() string {
	if n.mode == "cursor" {
		return fmt.Sprintf("BIGSERIAL outbox, `id > cursor ORDER BY id LIMIT %d`, publish, UPDATE cursor; poll every %s when empty; one relay", naiveBatch, naivePoll)
	}
	return fmt.Sprintf("BIGSERIAL outbox, one transaction: `ORDER BY id LIMIT %d FOR UPDATE SKIP LOCKED`, publish, DELETE; poll every %s when empty; one relay", naiveBatch, naivePoll)
}

// OrderedPerKey: the cursor variant reads in id order, which for one key
// is commit order here (the account row lock is taken before the id is
// drawn); the claim variant, with one relay, too. Neither promises it in
// general, but both are scored on it since a single relay keeps it.
func (n *naiveC) OrderedPerKey() bool { return true }

func (n *naiveC) schema() string { return schemaName(n.prefix, n.Name()) }

func (n *naiveC) Setup(ctx context.Context, e *env) error {
	if err := freshSchema(ctx, e.pool, n.schema()); err != nil {
		return err
	}
	s := n.schema()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE `+s+`.outbox (
		id       bigserial PRIMARY KEY,
		event_id uuid      NOT NULL,
		key      integer   NOT NULL,
		payload  bytea     NOT NULL)`); err != nil {
		return err
	}
	if n.mode == "cursor" {
		if _, err := e.pool.Exec(ctx, `CREATE TABLE `+s+`.relay_cursor (name text PRIMARY KEY, pos bigint NOT NULL)`); err != nil {
			return err
		}
	}
	return createAccounts(ctx, e.pool, s)
}

func (n *naiveC) Reset(ctx context.Context, e *env, checkpoint bool) error {
	if err := resetPG(ctx, e, n.schema(), nil, checkpoint); err != nil {
		return err
	}
	if n.mode == "cursor" {
		_, err := e.pool.Exec(ctx, `INSERT INTO `+n.schema()+`.relay_cursor (name, pos) VALUES ('bench', 0)`)
		return err
	}
	return nil
}

func (n *naiveC) Producer(ctx context.Context, e *env, async bool) (producer, error) {
	insert := `INSERT INTO ` + n.schema() + `.outbox (event_id, key, payload) VALUES ($1, $2, $3)`
	return newPGProducer(e, async, n.schema(), func(ctx context.Context, tx pgx.Tx, id uuid.UUID, key int, payload []byte) error {
		_, err := tx.Exec(ctx, insert, id, key, payload)
		return err
	}), nil
}

// Preload uses COPY, 50,000 rows per statement, in event order.
func (n *naiveC) Preload(ctx context.Context, e *env, nonce uint64, events []Meta) error {
	for _, b := range chunks(events, 50000) {
		rows := make([][]any, len(b))
		for i, m := range b {
			rows[i] = []any{EventID(nonce, m.G), m.Key, EncodePayload(m)}
		}
		if _, err := e.pool.CopyFrom(ctx, pgx.Identifier{n.schema(), "outbox"}, []string{"event_id", "key", "payload"}, pgx.CopyFromRows(rows)); err != nil {
			return err
		}
	}
	return nil
}

func (n *naiveC) Analyze(ctx context.Context, e *env) error { return analyzeSchema(ctx, e, n.schema()) }

func (n *naiveC) RelayArgs(e *env) []string { return []string{"--schema", n.schema()} }

func (n *naiveC) Teardown(ctx context.Context, e *env) error {
	_, err := e.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+n.schema()+` CASCADE`)
	return err
}

// Relay side.

type naiveRow struct {
	id      int64
	eventID uuid.UUID
	key     int
	payload []byte
}

func scanNaive(rows pgx.Rows) ([]naiveRow, []*ferryevent.Event, error) {
	var out []naiveRow
	var evs []*ferryevent.Event
	for rows.Next() {
		var r naiveRow
		if err := rows.Scan(&r.id, &r.eventID, &r.key, &r.payload); err != nil {
			rows.Close()
			return nil, nil, err
		}
		out = append(out, r)
		evs = append(evs, ferryEvent(r.eventID, r.key, r.payload))
	}
	return out, evs, rows.Err()
}

// publishAll publishes evs, retrying the failed ones until they succeed or
// ctx is done.
func publishAll(ctx context.Context, sink *ferrynats.Sink, evs []*ferryevent.Event) error {
	for attempt := 0; ; attempt++ {
		errs := sink.Publish(ctx, evs)
		var failed []*ferryevent.Event
		for i, err := range errs {
			if err != nil {
				failed = append(failed, evs[i])
			}
		}
		if len(failed) == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		evs = failed
		sleepCtx(ctx, time.Duration(min(attempt+1, 10))*100*time.Millisecond)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func naiveRelay(ctx context.Context, c *childConfig, mode string, sink *ferrynats.Sink) (runFunc, func(), error) {
	pool, err := c.openPool(ctx, 2)
	if err != nil {
		return nil, nil, err
	}
	s := c.schema
	if mode == "cursor" {
		return func(ctx context.Context) error { return naiveCursorLoop(ctx, pool, s, sink) }, pool.Close, nil
	}
	return func(ctx context.Context) error { return naiveClaimLoop(ctx, pool, s, sink) }, pool.Close, nil
}

func naiveCursorLoop(ctx context.Context, pool *pgxpool.Pool, s string, sink *ferrynats.Sink) error {
	var cursor int64
	if err := pool.QueryRow(ctx, `SELECT pos FROM `+s+`.relay_cursor WHERE name = 'bench'`).Scan(&cursor); err != nil {
		return fmt.Errorf("read cursor: %w", err)
	}
	sel := `SELECT id, event_id, key, payload FROM ` + s + `.outbox WHERE id > $1 ORDER BY id LIMIT $2`
	upd := `UPDATE ` + s + `.relay_cursor SET pos = $1 WHERE name = 'bench'`
	for ctx.Err() == nil {
		rows, err := pool.Query(ctx, sel, cursor, naiveBatch)
		if err != nil {
			sleepCtx(ctx, 100*time.Millisecond)
			continue
		}
		batch, evs, err := scanNaive(rows)
		if err != nil {
			sleepCtx(ctx, 100*time.Millisecond)
			continue
		}
		if len(batch) == 0 {
			sleepCtx(ctx, naivePoll)
			continue
		}
		if err := publishAll(ctx, sink, evs); err != nil {
			return nil
		}
		last := batch[len(batch)-1].id
		if _, err := pool.Exec(context.WithoutCancel(ctx), upd, last); err != nil {
			return fmt.Errorf("save cursor: %w", err)
		}
		cursor = last
	}
	return nil
}

func naiveClaimLoop(ctx context.Context, pool *pgxpool.Pool, s string, sink *ferrynats.Sink) error {
	sel := `SELECT id, event_id, key, payload FROM ` + s + `.outbox ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`
	del := `DELETE FROM ` + s + `.outbox WHERE id = ANY($1)`
	for ctx.Err() == nil {
		found, err := claimOnce(ctx, pool, sel, del, sink)
		switch {
		case err != nil:
			sleepCtx(ctx, 100*time.Millisecond)
		case !found:
			sleepCtx(ctx, naivePoll)
		}
	}
	return nil
}

func claimOnce(ctx context.Context, pool *pgxpool.Pool, sel, del string, sink *ferrynats.Sink) (bool, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, sel, naiveBatch)
	if err != nil {
		return false, err
	}
	batch, evs, err := scanNaive(rows)
	if err != nil || len(batch) == 0 {
		return false, err
	}
	if err := publishAll(ctx, sink, evs); err != nil {
		return true, err
	}
	ids := make([]int64, len(batch))
	for i, r := range batch {
		ids[i] = r.id
	}
	if _, err := tx.Exec(ctx, del, ids); err != nil {
		return true, err
	}
	return true, tx.Commit(ctx)
}
