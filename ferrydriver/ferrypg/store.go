package ferrypg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
	"github.com/google/uuid"
)

// LoadCheckpoint implements ferrydriver.Store.
func (d *Driver[TTx]) LoadCheckpoint(ctx context.Context, feed string) (*ferrydriver.Checkpoint, error) {
	cp := &ferrydriver.Checkpoint{Feed: feed}
	err := queryRow(ctx, d.db, []any{&cp.Cursor, &cp.Term, &cp.UpdatedAt}, d.queries.loadCheckpoint, feed)
	if isNoRows(err) {
		return cp, nil
	}
	if err != nil {
		return nil, d.wrapErr("load checkpoint of "+feed, err)
	}
	return cp, nil
}

// SaveCheckpoint implements ferrydriver.Store; p.Seqs go in the same
// statement (ferrydriver.KeySeqStore).
func (d *Driver[TTx]) SaveCheckpoint(ctx context.Context, p *ferrydriver.SaveCheckpointParams) error {
	var n int64
	var err error
	if len(p.Seqs) == 0 {
		n, err = d.db.exec(ctx, d.queries.saveCheckpoint, p.Feed, p.Cursor, p.Holder, p.Term, p.Partition)
	} else {
		keys := make([]string, 0, len(p.Seqs))
		for k := range p.Seqs {
			keys = append(keys, k)
		}
		slices.Sort(keys) // rows locked in key order
		seqs := make([]int64, len(keys))
		for i, k := range keys {
			seqs[i] = p.Seqs[k]
		}
		err = queryRow(ctx, d.db, []any{&n}, d.queries.saveCheckpointSeqs, p.Feed, p.Cursor, p.Holder, p.Term, p.Partition, keys, seqs)
	}
	if err != nil {
		return d.wrapErr("save checkpoint of "+p.Feed, err)
	}
	if n == 0 {
		return fmt.Errorf("ferrypg: save checkpoint of %s at term %d: %w", p.Feed, p.Term, ferrydriver.ErrLeaseLost)
	}
	return nil
}

// LoadKeySeqs implements ferrydriver.KeySeqStore.
func (d *Driver[TTx]) LoadKeySeqs(ctx context.Context, feed string, keys []string) (map[string]int64, error) {
	rows, err := d.db.query(ctx, d.queries.loadKeySeqs, feed, keys)
	if err != nil {
		return nil, d.wrapErr("load key sequences of "+feed, err)
	}
	defer rows.Close()
	out := make(map[string]int64, len(keys))
	for rows.Next() {
		var k string
		var n int64
		if err := rows.Scan(&k, &n); err != nil {
			return nil, d.wrapErr("load key sequences of "+feed, err)
		}
		out[k] = n
	}
	if err := rows.Err(); err != nil {
		return nil, d.wrapErr("load key sequences of "+feed, err)
	}
	return out, nil
}

func scanLease(r []any, l *ferrydriver.Lease) []any {
	return append(r, &l.Name, &l.Holder, &l.Term, &l.ExpiresAt, &l.Now)
}

// AcquireLease implements ferrydriver.Store.
func (d *Driver[TTx]) AcquireLease(ctx context.Context, p *ferrydriver.LeaseParams) (*ferrydriver.Lease, error) {
	l := &ferrydriver.Lease{}
	if err := queryRow(ctx, d.db, scanLease(nil, l), d.queries.acquireLease, p.Name, p.Holder, p.TTL.Milliseconds()); err != nil {
		return nil, d.wrapErr("acquire lease "+p.Name, err)
	}
	return l, nil
}

// RenewLease implements ferrydriver.Store.
func (d *Driver[TTx]) RenewLease(ctx context.Context, p *ferrydriver.LeaseParams) (*ferrydriver.Lease, error) {
	l := &ferrydriver.Lease{}
	err := queryRow(ctx, d.db, scanLease(nil, l), d.queries.renewLease, p.Name, p.Holder, p.Term, p.TTL.Milliseconds())
	if isNoRows(err) {
		return nil, fmt.Errorf("ferrypg: renew lease %s at term %d: %w", p.Name, p.Term, ferrydriver.ErrLeaseLost)
	}
	if err != nil {
		return nil, d.wrapErr("renew lease "+p.Name, err)
	}
	return l, nil
}

// ReleaseLease implements ferrydriver.Store.
func (d *Driver[TTx]) ReleaseLease(ctx context.Context, p *ferrydriver.LeaseParams) error {
	if _, err := d.db.exec(ctx, d.queries.releaseLease, p.Name, p.Holder, p.Term); err != nil {
		return d.wrapErr("release lease "+p.Name, err)
	}
	return nil
}

// GetLease implements ferrydriver.Store.
func (d *Driver[TTx]) GetLease(ctx context.Context, name string) (*ferrydriver.Lease, error) {
	l := &ferrydriver.Lease{}
	err := queryRow(ctx, d.db, scanLease(nil, l), d.queries.getLease, name)
	if isNoRows(err) {
		return nil, fmt.Errorf("ferrypg: lease %s: %w", name, ferrydriver.ErrNotFound)
	}
	if err != nil {
		return nil, d.wrapErr("read lease "+name, err)
	}
	return l, nil
}

// InsertDeadLetters implements ferrydriver.Store.
func (d *Driver[TTx]) InsertDeadLetters(ctx context.Context, p *ferrydriver.InsertDeadLettersParams) error {
	events := make([]*ferryevent.Event, len(p.DeadLetters))
	reasons := make([]string, len(p.DeadLetters))
	for i, dl := range p.DeadLetters {
		events[i], reasons[i] = &dl.Event, dl.Reason
	}
	a, err := encodeEvents(events)
	if err != nil {
		return err
	}
	var held int
	err = queryRow(ctx, d.db, []any{&held}, d.queries.insertDeadLetters, p.Feed, p.Holder, p.Term,
		a.ids, a.topics, a.keys, a.seqs, a.types, a.sources, a.contentTypes, a.headers, a.payloads, a.created, reasons)
	if err != nil {
		return d.wrapErr("insert dead letters of "+p.Feed, err)
	}
	if held == 0 {
		return fmt.Errorf("ferrypg: insert dead letters of %s at term %d: %w", p.Feed, p.Term, ferrydriver.ErrLeaseLost)
	}
	return nil
}

func (d *Driver[TTx]) scanDeadLetters(r rows) ([]*ferrydriver.DeadLetter, error) {
	defer r.Close()
	var out []*ferrydriver.DeadLetter
	for r.Next() {
		dl := &ferrydriver.DeadLetter{}
		ev := &dl.Event
		var headers *string
		if err := r.Scan(&dl.Feed, &ev.ID, &ev.Topic, &ev.Key, &ev.Seq, &ev.Type, &ev.Source, &ev.ContentType, &headers, &ev.Payload, &ev.CreatedAt, &dl.Reason, &dl.FailedAt); err != nil {
			return nil, err
		}
		// A dead letter is shown even if its headers are unreadable: the
		// row may be there precisely because it was malformed.
		_ = decodeHeaders(ev, headers)
		out = append(out, dl)
	}
	return out, r.Err()
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// deadLetterArgs are the arguments of deadLetterFilter ($1 to $8) after
// the feed's, and the statement of q for the feed.
func deadLetterArgs(q byFeed, p *ferrydriver.ListDeadLettersParams) (string, []any) {
	stmt, feed := q.of(p.Feed)
	return stmt, []any{feed, p.Key, p.Type, p.Topic, nullTime(p.Since), nullTime(p.Until), idStrings(p.EventIDs), p.Reason}
}

// ListDeadLetters implements ferrydriver.Store.
func (d *Driver[TTx]) ListDeadLetters(ctx context.Context, p *ferrydriver.ListDeadLettersParams) ([]*ferrydriver.DeadLetter, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 100
	}
	afterAt, afterID := "infinity", uuid.Nil.String()
	if p.After != nil {
		afterAt, afterID = p.After.FailedAt.UTC().Format(time.RFC3339Nano), p.After.EventID.String()
	}
	q, args := deadLetterArgs(d.queries.listDeadLetters, p)
	r, err := d.db.query(ctx, q, append(args, limit, afterAt, afterID)...)
	if err != nil {
		return nil, d.wrapErr("list dead letters", err)
	}
	out, err := d.scanDeadLetters(r)
	if err != nil {
		return nil, d.wrapErr("list dead letters", err)
	}
	return out, nil
}

// CountDeadLetters implements ferrydriver.Store.
func (d *Driver[TTx]) CountDeadLetters(ctx context.Context, p *ferrydriver.ListDeadLettersParams) (int64, error) {
	var n int64
	q, args := deadLetterArgs(d.queries.countMatchingDeadLetters, p)
	if err := queryRow(ctx, d.db, []any{&n}, q, args...); err != nil {
		return 0, d.wrapErr("count dead letters", err)
	}
	return n, nil
}

// refArgs are the named dead letters as two arrays: feeds, event IDs.
func refArgs(refs []ferrydriver.DeadLetterRef) (feeds, ids []string) {
	feeds, ids = make([]string, len(refs)), make([]string, len(refs))
	for i, r := range refs {
		feeds[i], ids[i] = r.Feed, r.EventID.String()
	}
	return feeds, ids
}

// RedriveDeadLetters implements ferrydriver.Store: the named dead letters
// are locked, checked, appended to their keys' parked queues in their
// feeds (sqlRedriveToParked) and deleted, in one transaction.
func (d *Driver[TTx]) RedriveDeadLetters(ctx context.Context, refs []ferrydriver.DeadLetterRef) (int, error) {
	if len(refs) == 0 {
		return 0, nil
	}
	e, commit, rollback, err := d.begin.begin(ctx)
	if err != nil {
		return 0, d.wrapErr("begin redrive", err)
	}
	defer func() { _ = rollback(context.WithoutCancel(ctx)) }()
	feeds, ids := refArgs(refs)
	r, err := e.query(ctx, d.queries.selectRedrive, feeds, ids)
	if err != nil {
		return 0, d.wrapErr("select dead letters to redrive", err)
	}
	defer r.Close()
	var found []ferrydriver.DeadLetterRef
	for r.Next() {
		var dl ferrydriver.DeadLetter
		ev := &dl.Event
		var headers *string
		if err := r.Scan(&dl.Feed, &ev.ID, &ev.Topic, &ev.Key, &ev.Seq, &ev.Type, &ev.Source, &ev.ContentType, &headers, &ev.Payload, &ev.CreatedAt, &dl.Reason, &dl.FailedAt); err != nil {
			return 0, d.wrapErr("select dead letters to redrive", err)
		}
		if err := redrivable(&dl, decodeHeaders(ev, headers)); err != nil {
			return 0, err
		}
		found = append(found, ferrydriver.DeadLetterRef{Feed: dl.Feed, EventID: ev.ID})
	}
	r.Close()
	if err := r.Err(); err != nil {
		return 0, d.wrapErr("select dead letters to redrive", err)
	}
	if len(found) == 0 {
		return 0, nil
	}
	feeds, ids = refArgs(found) // oldest failure first, each key in order
	if _, err := e.exec(ctx, d.queries.redriveToParked, feeds, ids); err != nil {
		return 0, d.wrapErr("park redriven dead letters for their feeds", err)
	}
	n, err := e.exec(ctx, d.queries.deleteDeadLetterRefs, feeds, ids)
	if err != nil {
		return 0, d.wrapErr("delete redriven dead letters", err)
	}
	if err := commit(ctx); err != nil {
		return 0, d.wrapErr("commit redrive", err)
	}
	return int(n), nil
}

// redrivable refuses a dead letter that is not a valid event: published
// again, it would only be dead-lettered again (or lose its headers).
func redrivable(dl *ferrydriver.DeadLetter, decodeErr error) error {
	err := decodeErr
	if err == nil {
		// No size limit: the event was accepted once, under the producer's.
		err = ferryevent.Validate(&dl.Event, 0, math.MaxInt)
	}
	if err != nil {
		return fmt.Errorf("ferrypg: dead letter %s of feed %s is not a valid event (%v): nothing was redriven; discard it (ferry dlq discard --feed %s %s)",
			dl.Event.ID, dl.Feed, err, dl.Feed, dl.Event.ID)
	}
	return nil
}

// DiscardDeadLetters implements ferrydriver.Store.
func (d *Driver[TTx]) DiscardDeadLetters(ctx context.Context, refs []ferrydriver.DeadLetterRef) (int, error) {
	if len(refs) == 0 {
		return 0, nil
	}
	feeds, ids := refArgs(refs)
	n, err := d.db.exec(ctx, d.queries.deleteDeadLetterRefs, feeds, ids)
	if err != nil {
		return 0, d.wrapErr("discard dead letters", err)
	}
	return int(n), nil
}

// GetDeadLetter implements ferrydriver.Store.
func (d *Driver[TTx]) GetDeadLetter(ctx context.Context, p ferrydriver.DeadLetterRef) (*ferrydriver.DeadLetter, error) {
	q, feed := d.queries.getDeadLetter.of(p.Feed)
	r, err := d.db.query(ctx, q, feed, p.EventID.String())
	if err != nil {
		return nil, d.wrapErr("read dead letter", err)
	}
	out, err := d.scanDeadLetters(r)
	if err != nil {
		return nil, d.wrapErr("read dead letter", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("ferrypg: dead letter %s: %w", p.EventID, ferrydriver.ErrNotFound)
	}
	return out[0], nil
}

// horizon is what every feed of a partition has delivered: the rows at or
// below Low that were visible to every feed's previous snapshot (xid below
// every PrevXmax and in no feed's PrevXip).
type horizon struct {
	low  int64
	xmax uint64
	xip  []uint64
}

// partitionHorizon reads the saved checkpoints of partition and combines
// them with cursor (the caller's own, possibly newer than its saved one).
func (d *Driver[TTx]) partitionHorizon(ctx context.Context, partition int, cursor []byte) (*horizon, error) {
	cursors := [][]byte{cursor}
	r, err := d.db.query(ctx, d.queries.partitionCursors, partition)
	if err != nil {
		return nil, d.wrapErr("read the checkpoints of partition "+strconv.Itoa(partition), err)
	}
	for r.Next() {
		var c []byte
		if err := r.Scan(&c); err != nil {
			r.Close()
			return nil, d.wrapErr("read checkpoints", err)
		}
		cursors = append(cursors, c)
	}
	r.Close()
	if err := r.Err(); err != nil {
		return nil, d.wrapErr("read checkpoints", err)
	}
	h := &horizon{low: -1}
	for i, c := range cursors {
		st, err := decodeCursor(c)
		if err != nil {
			return nil, err
		}
		if i == 0 || st.Low < h.low {
			h.low = st.Low
		}
		if i == 0 || st.PrevXmax < h.xmax {
			h.xmax = st.PrevXmax
		}
		h.xip = append(h.xip, st.PrevXip...)
	}
	return h, nil
}

// DeleteDelivered implements ferrydriver.Store.
func (d *Driver[TTx]) DeleteDelivered(ctx context.Context, p *ferrydriver.DeleteDeliveredParams) (int64, error) {
	h, err := d.partitionHorizon(ctx, p.Partition, p.Cursor)
	if err != nil {
		return 0, err
	}
	// A row may go only if every feed delivered it: at or below every
	// feed's Low, below every PrevXmax, and in no feed's PrevXip.
	if h.low <= 0 {
		return 0, nil
	}
	limit := p.Limit
	if limit <= 0 {
		limit = 10000
	}
	var n int64
	err = d.inIndexPlanTx(ctx, func(e executor) error {
		var err error
		n, err = e.exec(ctx, d.queries.deleteDelivered, p.Partition, h.low, xidStrings(h.xip), p.OlderThan.Milliseconds(), limit, strconv.FormatUint(h.xmax, 10))
		return err
	})
	if err != nil {
		return 0, d.wrapErr("delete delivered events", err)
	}
	return n, nil
}

// PruneKeys implements ferrydriver.Store. PostgreSQL's producers keep no
// row per key (the relay numbers events: KeySeqStore), so there is nothing
// of theirs to forget; the relay forgets its own numbers with PruneKeySeqs.
func (d *Driver[TTx]) PruneKeys(context.Context, *ferrydriver.PruneKeysParams) (*ferrydriver.PruneKeysResult, error) {
	return &ferrydriver.PruneKeysResult{}, nil
}

// PruneKeySeqs implements ferrydriver.KeySeqStore (sqlPruneKeySeqs).
func (d *Driver[TTx]) PruneKeySeqs(ctx context.Context, p *ferrydriver.PruneKeySeqsParams) (*ferrydriver.PruneKeySeqsResult, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = ferrydriver.RetentionChunk
	}
	var last *string
	var read int
	var pruned string // a JSON array: database/sql scans no text[]
	res := &ferrydriver.PruneKeySeqsResult{}
	keep := p.Keep
	if keep == nil {
		keep = []string{}
	}
	if err := queryRow(ctx, d.db, []any{&last, &read, &pruned}, d.queries.pruneKeySeqs, p.Feed, p.After, limit, p.IdleFor.Milliseconds(), keep); err != nil {
		return nil, d.wrapErr("forget idle keys of "+p.Feed, err)
	}
	if err := json.Unmarshal([]byte(pruned), &res.Pruned); err != nil {
		return nil, fmt.Errorf("ferrypg: forget idle keys of %s: %w", p.Feed, err)
	}
	if last != nil && read >= limit {
		res.Next = *last
	}
	return res, nil
}

// DeleteDeadLetters implements ferrydriver.Store (sqlDeleteDeadLetters).
func (d *Driver[TTx]) DeleteDeadLetters(ctx context.Context, p *ferrydriver.DeleteDeadLettersParams) (int64, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = 10000
	}
	var n int64
	err := d.inIndexPlanTx(ctx, func(e executor) error {
		var err error
		n, err = e.exec(ctx, d.queries.deleteDeadLetters, p.Feed, p.OlderThan.Milliseconds(), limit)
		return err
	})
	if err != nil {
		return 0, d.wrapErr("delete old dead letters of "+p.Feed, err)
	}
	return n, nil
}

// inIndexPlanTx runs fn in a transaction whose statements are planned
// without bitmap or sequential scans. The retention statement reads "the
// $5 oldest rows at or below the cursor": with statistics that lag the
// outbox (a new outbox, a bulk load) the planner believed that range tiny
// and read all of it with a bitmap scan and a sort, O(outbox) once a minute,
// instead of the first $5 entries of the primary key
// (TestRetentionIsBoundedByItsLimit).
func (d *Driver[TTx]) inIndexPlanTx(ctx context.Context, fn func(e executor) error) error {
	e, commit, rollback, err := d.begin.begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = rollback(context.WithoutCancel(ctx)) }()
	if _, err := e.exec(ctx, sqlIndexPlans); err != nil {
		return err
	}
	if err := fn(e); err != nil {
		return err
	}
	return commit(ctx)
}

// FeedLag implements ferrydriver.Store: one statement bounded by
// ferrydriver.ExactCountLimit (sqlFeedLag) after the checkpoint's primary
// key lookup.
func (d *Driver[TTx]) FeedLag(ctx context.Context, p *ferrydriver.FeedLagParams) (*ferrydriver.FeedLag, error) {
	cp, err := d.LoadCheckpoint(ctx, p.Feed)
	if err != nil {
		return nil, err
	}
	cur, err := decodeCursor(cp.Cursor)
	if err != nil {
		return nil, err
	}
	return d.feedLag(ctx, p.Feed, p.Partition, cur.delivered())
}

func (d *Driver[TTx]) feedLag(ctx context.Context, feed string, partition int, after int64) (*ferrydriver.FeedLag, error) {
	lag := &ferrydriver.FeedLag{}
	var n, last, high int64
	var oldest *time.Time
	err := d.inIndexPlanTx(ctx, func(e executor) error {
		return queryRow(ctx, e, []any{&n, &last, &oldest, &high, &lag.Now}, d.queries.feedLag, partition, after, ferrydriver.ExactCountLimit)
	})
	if err != nil {
		return nil, d.wrapErr("measure lag of "+feed, err)
	}
	lag.Events, lag.Estimated = driverkit.ExtrapolateLag(n, float64(after), float64(last), float64(high))
	if oldest != nil {
		lag.OldestPending = *oldest
	}
	return lag, nil
}

// ListFeeds implements ferrydriver.Store (sqlListFeeds).
func (d *Driver[TTx]) ListFeeds(ctx context.Context) ([]string, error) {
	r, err := d.db.query(ctx, d.queries.listFeeds)
	if err != nil {
		return nil, d.wrapErr("list feeds", err)
	}
	defer r.Close()
	var out []string
	for r.Next() {
		var n string
		if err := r.Scan(&n); err != nil {
			return nil, d.wrapErr("list feeds", err)
		}
		out = append(out, n)
	}
	if err := r.Err(); err != nil {
		return nil, d.wrapErr("list feeds", err)
	}
	return out, nil
}

// FeedStatus implements ferrydriver.Store.
func (d *Driver[TTx]) FeedStatus(ctx context.Context, p *ferrydriver.FeedStatusParams) (*ferrydriver.FeedStatus, error) {
	st := &ferrydriver.FeedStatus{Feed: p.Feed}
	cp, err := d.LoadCheckpoint(ctx, p.Feed)
	if err != nil {
		return nil, err
	}
	st.Checkpoint = cp
	if l, err := d.GetLease(ctx, p.Feed); err == nil {
		st.Lease = l
	} else if !errors.Is(err, ferrydriver.ErrNotFound) {
		return nil, err
	}
	cur, err := decodeCursor(cp.Cursor)
	if err != nil {
		return nil, err
	}
	if p.Exact {
		var oldest *time.Time
		if err := queryRow(ctx, d.db, []any{&st.LagEvents, &oldest}, d.queries.feedLagExact, p.Partition, cur.delivered()); err != nil {
			return nil, d.wrapErr("measure lag of "+p.Feed, err)
		}
		if oldest != nil {
			st.OldestPending = *oldest
		}
		if err := queryRow(ctx, d.db, []any{&st.DeadLetters, &st.Now}, d.queries.countDeadLetterExact, p.Feed); err != nil {
			return nil, d.wrapErr("count dead letters of "+p.Feed, err)
		}
		return st, nil
	}
	lag, err := d.feedLag(ctx, p.Feed, p.Partition, cur.delivered())
	if err != nil {
		return nil, err
	}
	st.LagEvents, st.LagEstimated, st.OldestPending = lag.Events, lag.Estimated, lag.OldestPending
	if err := queryRow(ctx, d.db, []any{&st.DeadLetters, &st.Now}, d.queries.countDeadLetter, p.Feed, ferrydriver.ExactCountLimit+1); err != nil {
		return nil, d.wrapErr("count dead letters of "+p.Feed, err)
	}
	if st.DeadLetters > ferrydriver.ExactCountLimit {
		st.DeadLetters, st.DeadLettersMore = ferrydriver.ExactCountLimit, true
	}
	return st, nil
}

// decodeInvalid turns a row that failed validation into an InvalidRecord.
func invalidRecord(ev *ferryevent.Event, reason string) *ferrydriver.InvalidRecord {
	return &ferrydriver.InvalidRecord{Event: *ev, Reason: reason}
}

// sqlOldestOutboxTx finds the oldest open transaction holding the lock an
// INSERT into the outbox takes (RowExclusiveLock, kept to the end of the
// transaction): O(locks held), whatever the outbox holds.
const sqlOldestOutboxTx = `
SELECT a.pid, a.xact_start, COALESCE(a.state, ''), COALESCE(a.application_name, ''), now()
  FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE l.locktype = 'relation' AND l.relation = '{schema}.outbox'::regclass AND l.mode = 'RowExclusiveLock'
   AND l.granted AND a.pid <> pg_backend_pid() AND a.xact_start IS NOT NULL
 ORDER BY a.xact_start LIMIT 1`

// OldestOutboxTx implements ferrydriver.OutboxTxReporter. The relay's own
// retention deletes take the same lock, briefly.
func (d *Driver[TTx]) OldestOutboxTx(ctx context.Context) (*ferrydriver.OpenTx, error) {
	tx := &ferrydriver.OpenTx{}
	err := queryRow(ctx, d.db, []any{&tx.PID, &tx.Started, &tx.State, &tx.Application, &tx.Now}, d.queries.oldestOutboxTx)
	if isNoRows(err) {
		return nil, nil
	}
	if err != nil {
		return nil, d.wrapErr("find open transactions that wrote to the outbox", err)
	}
	return tx, nil
}
