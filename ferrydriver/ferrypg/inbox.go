package ferrypg

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/jackc/pgx/v5"
)

// InsertInbox implements ferrydriver.Inbox.
func (d *Driver[TTx]) InsertInbox(ctx context.Context, p *ferrydriver.InsertInboxParams) (*ferrydriver.InsertInboxResult, error) {
	n := len(p.Events)
	res := &ferrydriver.InsertInboxResult{Inserted: make([]bool, n)}
	if n == 0 {
		return res, nil
	}
	ids, keys, topics, types, sources, cts, headers := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	seqs := make([]int64, n)
	payloads := make([][]byte, n)
	created := make([]time.Time, n)
	index := make(map[string]int, n)
	for i, ev := range p.Events {
		ids[i], keys[i], seqs[i], topics[i], types[i], sources[i], cts[i] = ev.ID.String(), ev.Key, ev.Seq, ev.Topic, ev.Type, ev.Source, ev.ContentType
		if len(ev.Headers) > 0 {
			b, err := json.Marshal(ev.Headers)
			if err != nil {
				return nil, fmt.Errorf("ferrypg: encode headers of event %s: %w", ev.ID, err)
			}
			headers[i] = string(b)
		}
		payloads[i] = ev.Payload
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
		created[i] = ev.CreatedAt
		index[ids[i]] = i
	}
	r, err := d.db.query(ctx, d.queries.inboxInsert, p.Group, ids, keys, seqs, topics, types, sources, cts, headers, payloads, created)
	if err != nil {
		return nil, d.wrapErr("insert into inbox of group "+p.Group, err)
	}
	defer r.Close()
	for r.Next() {
		var id string
		if err := r.Scan(&id); err != nil {
			return nil, d.wrapErr("insert into inbox", err)
		}
		if i, ok := index[id]; ok {
			res.Inserted[i] = true
		}
	}
	if err := r.Err(); err != nil {
		return nil, d.wrapErr("insert into inbox of group "+p.Group, err)
	}
	return res, nil
}

// ClaimInbox implements ferrydriver.Inbox.
func (d *Driver[TTx]) ClaimInbox(ctx context.Context, p *ferrydriver.ClaimInboxParams) ([]*ferrydriver.InboxRow, error) {
	r, err := d.db.query(ctx, d.queries.inboxClaim, p.Group, p.Limit, p.Worker, p.TTL.Milliseconds(), p.HoldDead)
	if err != nil {
		return nil, d.wrapErr("claim inbox rows of group "+p.Group, err)
	}
	defer r.Close()
	var out []*ferrydriver.InboxRow
	for r.Next() {
		row := &ferrydriver.InboxRow{Group: p.Group}
		ev := &row.Event
		var headers *string
		var state string
		if err := r.Scan(&ev.ID, &ev.Key, &ev.Seq, &ev.Topic, &ev.Type, &ev.Source, &ev.ContentType, &headers, &ev.Payload, &ev.CreatedAt,
			&state, &row.Attempts, &row.LastError, &row.NextAttemptAt, &row.ReceivedAt); err != nil {
			return nil, d.wrapErr("claim inbox rows", err)
		}
		row.State = ferrydriver.InboxState(state)
		if headers != nil {
			if err := json.Unmarshal([]byte(*headers), &ev.Headers); err != nil {
				return nil, fmt.Errorf("ferrypg: inbox row %s has undecodable headers: %w", ev.ID, err)
			}
		}
		out = append(out, row)
	}
	if err := r.Err(); err != nil {
		return nil, d.wrapErr("claim inbox rows of group "+p.Group, err)
	}
	return out, nil
}

// RunInTx implements ferrydriver.Inbox.
func (d *Driver[TTx]) RunInTx(ctx context.Context, fn func(ctx context.Context, tx TTx) error) error {
	tx, commit, rollback, err := d.beginTx(ctx)
	if err != nil {
		return fmt.Errorf("ferrypg: begin: %w", err)
	}
	if err := fn(ctx, tx); err != nil {
		_ = rollback(context.WithoutCancel(ctx))
		return err
	}
	if err := commit(ctx); err != nil {
		return fmt.Errorf("ferrypg: commit: %w", err)
	}
	return nil
}

// CompleteInboxTx implements ferrydriver.Inbox.
func (d *Driver[TTx]) CompleteInboxTx(ctx context.Context, tx TTx, p *ferrydriver.CompleteInboxParams) error {
	return d.finish(ctx, d.wrapTx(tx), p.Group, p.EventID.String(), p.Worker, ferrydriver.InboxProcessed, "", nil, p.HoldDead)
}

// FailInbox implements ferrydriver.Inbox.
func (d *Driver[TTx]) FailInbox(ctx context.Context, p *ferrydriver.FailInboxParams) error {
	state := ferrydriver.InboxFailed
	var retry *time.Time
	if p.Dead {
		state = ferrydriver.InboxDead
	} else {
		retry = &p.RetryAt
	}
	e, commit, rollback, err := d.begin.begin(ctx)
	if err != nil {
		return fmt.Errorf("ferrypg: begin: %w", err)
	}
	if err := d.finish(ctx, e, p.Group, p.EventID.String(), p.Worker, state, p.Error, retry, p.HoldDead); err != nil {
		_ = rollback(context.WithoutCancel(ctx))
		return err
	}
	if err := commit(ctx); err != nil {
		return fmt.Errorf("ferrypg: commit failed attempt: %w", err)
	}
	return nil
}

// finish moves a claimed row to state, then recomputes its key's head:
// update the row, lock the key, and only then (in a new statement, so with
// a snapshot taken after the lock) look for the next head.
func (d *Driver[TTx]) finish(ctx context.Context, e executor, group, id, worker string, state ferrydriver.InboxState, lastErr string, retry *time.Time, hold bool) error {
	var key string
	err := queryRow(ctx, e, []any{&key}, d.queries.inboxFinish, group, id, worker, string(state), lastErr, retry)
	if isNoRows(err) {
		return fmt.Errorf("ferrypg: mark event %s %s for group %s: %w", id, state, group, ferrydriver.ErrClaimLost)
	}
	if err != nil {
		return d.wrapErr("mark inbox row "+string(state), err)
	}
	if _, err := e.exec(ctx, d.queries.inboxLockKey, group, key); err != nil {
		return d.wrapErr("lock inbox key", err)
	}
	if _, err := e.exec(ctx, d.queries.inboxRefreshKey, group, key, hold); err != nil {
		return d.wrapErr("refresh inbox key", err)
	}
	return nil
}

var _ ferrydriver.Inbox[pgx.Tx] = (*Driver[pgx.Tx])(nil)
