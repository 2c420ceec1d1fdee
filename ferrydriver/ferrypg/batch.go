package ferrypg

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

var _ ferrydriver.InboxBatcher[pgx.Tx] = (*Driver[pgx.Tx])(nil)

// batchQueries are the statements of batched completions, with the schema
// filled in.
type batchQueries struct {
	finish, refreshKeys string
}

func newBatchQueries(schema string) batchQueries {
	s := pgx.Identifier{schema}.Sanitize()
	r := func(q string) string { return strings.ReplaceAll(q, "{schema}", s) }
	return batchQueries{finish: r(sqlInboxFinishRows), refreshKeys: r(sqlInboxRefreshKeys)}
}

// sqlInboxFinishRows records the outcomes of claimed rows ($2..$6, one
// element per row) and returns the rows whose claim held, with their key.
// A row whose claim expired or was taken over matches nothing. It locks
// the keys of the rows it changed, in key order as ingestion does, so that
// the refresh that follows in a statement of its own sees every row
// committed before the locks were granted.
const sqlInboxFinishRows = `
WITH upd AS (
    UPDATE {schema}.inbox i
       SET state = r.state, claimed_by = NULL, claim_expires_at = NULL, claim_token = NULL,
           attempts = CASE WHEN r.uncounted THEN greatest(i.attempts - 1, 0) ELSE i.attempts END,
           last_error = CASE WHEN r.state = 'processed' THEN i.last_error ELSE r.err END,
           next_attempt_at = COALESCE(r.retry_at, i.next_attempt_at),
           finished_at = CASE WHEN r.state IN ('processed', 'dead') THEN now() END
      FROM unnest($2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::timestamptz[], $7::bool[]) AS r(event_id, claim, state, err, retry_at, uncounted)
     WHERE i.group_name = $1 AND i.event_id = r.event_id AND i.claim_token = r.claim AND i.state = 'processing'
       AND i.claim_expires_at > clock_timestamp()
    RETURNING i.event_id, i.key
), locked AS (
    SELECT 1 FROM {schema}.inbox_keys WHERE group_name = $1 AND key IN (SELECT key FROM upd) ORDER BY key FOR UPDATE
)
SELECT event_id, key FROM upd WHERE (SELECT count(*) FROM locked) >= 0`

// sqlInboxRefreshKeys is sqlInboxRefreshKey for the keys of the rows $2,
// in a statement after sqlInboxFinishRows, which locked them (in the same
// round trip: a pipeline, so the keys are found by the rows). The keys
// are then found by the primary key (key = ANY), so that the statement
// costs O(len($2)) whatever the group's key count and its statistics.
var sqlInboxRefreshKeys = `
WITH kk AS MATERIALIZED (
    SELECT array_agg(DISTINCT key) AS keys FROM {schema}.inbox WHERE group_name = $1 AND event_id = ANY ($2::uuid[])
), x AS (
    SELECT kk.key, h.event_id, h.state, h.next_attempt_at, h.claim_expires_at, busy.until
      FROM unnest((SELECT keys FROM kk)) kk(key)
      LEFT JOIN LATERAL (
        SELECT event_id, state, next_attempt_at, claim_expires_at FROM {schema}.inbox i
         WHERE i.group_name = $1 AND i.key = kk.key
           AND i.state IN ('pending', 'processing', 'failed', 'dead') AND (i.state <> 'dead' OR ` + holdDead + `)
         ORDER BY pos LIMIT 1) h ON true
      LEFT JOIN LATERAL (
        SELECT max(claim_expires_at) AS until FROM {schema}.inbox p
         WHERE p.key = kk.key AND p.group_name = $1 AND p.state = 'processing' AND p.claim_expires_at > now()) busy ON true
)
UPDATE {schema}.inbox_keys k SET ` + keyHeadSet("x", "x.until") + `
  FROM x
 WHERE k.group_name = $1 AND k.key = ANY ((SELECT keys FROM kk)::text[]) AND k.key = x.key`

// Savepoint implements ferrydriver.InboxBatcher. It costs one round trip:
// the savepoint is not released after fn succeeded (the commit releases
// every one), so that the next event's savepoint nests inside it; a failed
// fn is rolled back to its own, the latest of the name.
func (d *Driver[TTx]) Savepoint(ctx context.Context, tx TTx, fn func(ctx context.Context, tx TTx) error) error {
	e := d.wrapTx(tx)
	if _, err := e.exec(ctx, `SAVEPOINT ferry_event`); err != nil {
		return fmt.Errorf("ferrypg: %w: %w", ferrydriver.ErrSavepoint, err)
	}
	if err := fn(ctx, tx); err != nil {
		if _, rerr := e.exec(context.WithoutCancel(ctx), `ROLLBACK TO SAVEPOINT ferry_event`); rerr != nil {
			return fmt.Errorf("ferrypg: %w: roll back to it after %v: %w", ferrydriver.ErrSavepoint, err, rerr)
		}
		return err
	}
	return nil
}

// FinishInboxTx implements ferrydriver.InboxBatcher: one statement records
// every outcome and locks the keys, one recomputes their heads (with a
// snapshot taken after the locks), and one tells the callers awaiting the
// finished events; all in one round trip. When a claim is lost, what the
// later statements did, or failed to do, is rolled back by the caller.
func (d *Driver[TTx]) FinishInboxTx(ctx context.Context, tx TTx, p *ferrydriver.FinishInboxParams) ([]uuid.UUID, error) {
	if len(p.Rows) == 0 {
		return nil, nil
	}
	n := len(p.Rows)
	ids, claims, states, errs := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	retry, uncounted := make([]*time.Time, n), make([]bool, n)
	finished := map[ferrydriver.InboxState][]string{}
	for i, r := range p.Rows {
		if _, err := uuid.Parse(r.Claim); err != nil {
			return nil, fmt.Errorf("ferrypg: finish inbox rows of group %s: claim token %q of event %s is not one ClaimInbox gave", p.Group, r.Claim, r.EventID)
		}
		ids[i], claims[i], states[i], errs[i], uncounted[i] = r.EventID.String(), r.Claim, string(r.State), r.Error, r.Uncounted
		if r.State == ferrydriver.InboxFailed {
			retry[i] = &p.Rows[i].RetryAt
		}
		if r.State.Finished() {
			finished[r.State] = append(finished[r.State], ids[i])
		}
	}
	held := make(map[string]bool, n)
	steps := []step{
		{sql: d.batch.finish, args: []any{p.Group, ids, claims, states, errs, retry, uncounted}, scan: func(r rows) error {
			var id, key string
			if err := r.Scan(&id, &key); err != nil {
				return err
			}
			held[id] = true
			return nil
		}},
		{sql: d.batch.refreshKeys, args: []any{p.Group, ids}},
	}
	for _, st := range []ferrydriver.InboxState{ferrydriver.InboxProcessed, ferrydriver.InboxDead} {
		if len(finished[st]) > 0 {
			steps = append(steps, step{sql: d.queries.inboxNotify, args: []any{p.Group, finished[st], string(st), d.settleChannel()}})
		}
	}
	err := d.wrapTx(tx).pipeline(ctx, steps...)
	if err != nil && failedStep(err) == 0 {
		return nil, d.wrapErr("finish inbox rows", err)
	}
	var lost []uuid.UUID
	for i, r := range p.Rows {
		if !held[ids[i]] {
			lost = append(lost, r.EventID)
		}
	}
	if len(lost) > 0 {
		return lost, nil // the caller rolls back: nothing else to do
	}
	if err != nil {
		return nil, d.wrapErr("refresh inbox keys and notify", err)
	}
	return nil, nil
}
