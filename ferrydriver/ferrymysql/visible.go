package ferrymysql

import (
	"context"
	"database/sql"
	"strings"
	"time"
)

// What the feed waits for before it hands rows on: that their
// transactions' commits are visible to readers, and, for the scan's
// margin, how old the oldest open transaction is.

// openSample is a start of the oldest open transaction (µs), and the
// binlog's end read after it: every transaction written after that end
// started after it.
type openSample struct {
	open int64
	file string
	pos  uint32
}

// awaitVisible returns once the transactions that wrote the rows ids (one
// row of each) are visible to a new read. The server writes a transaction
// to the binlog before InnoDB makes it visible, and InnoDB releases a
// committing transaction's locks a moment before a new read view sees it
// (under load, a shared lock alone let events through early).
// So a plain read decides: the rows it does not see yet are waited for
// with a shared lock (which returns once their transaction commits) and
// read again, a little later each time. A row the read never sees (its
// transaction deleted it again) stops the wait after visibleWait.
func (f *feed) awaitVisible(ctx context.Context, ids []int64) error {
	deadline := time.Now().Add(visibleWait)
	for pause := 100 * time.Microsecond; len(ids) > 0; pause = min(2*pause, 20*time.Millisecond) {
		unseen, err := f.invisible(ctx, ids)
		if err != nil || len(unseen) == 0 || time.Now().After(deadline) {
			return err
		}
		if err := f.lockWait(ctx, unseen); err != nil {
			return err
		}
		if len(unseen) < len(ids) || pause > 100*time.Microsecond {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(pause):
			}
		}
		ids = unseen
	}
	return nil
}

// visibleWait bounds awaitVisible's wait for rows a plain read never sees.
const visibleWait = 2 * time.Second

// invisible returns the ids a new read does not see.
func (f *feed) invisible(ctx context.Context, ids []int64) ([]int64, error) {
	rows, err := f.d.db.QueryContext(ctx, `SELECT id FROM ferry_outbox WHERE id IN (?`+strings.Repeat(",?", len(ids)-1)+`)`, posArgs(ids)...)
	if err != nil {
		return nil, f.d.wrapErr("read the batch's rows ("+f.name+")", err)
	}
	defer rows.Close()
	seen := make(map[int64]bool, len(ids))
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, f.d.wrapErr("read the batch's rows ("+f.name+")", err)
		}
		seen[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, f.d.wrapErr("read the batch's rows ("+f.name+")", err)
	}
	var unseen []int64
	for _, id := range ids {
		if !seen[id] {
			unseen = append(unseen, id)
		}
	}
	return unseen, nil
}

// lockWait returns once the transactions holding the rows ids have
// ended. Each lookup is of one key of the primary key, a SELECT of its own
// in one statement: it locks that row only (an IN list is read as a
// range, which also locks the gaps, and waits for an unrelated open
// transaction's row); the statement's locks end with it.
func (f *feed) lockWait(ctx context.Context, ids []int64) error {
	one := `(SELECT id FROM ferry_outbox WHERE id = ? LOCK IN SHARE MODE)`
	rows, err := f.d.db.QueryContext(ctx, one+strings.Repeat(" UNION ALL "+one, len(ids)-1), posArgs(ids)...)
	if err == nil {
		for rows.Next() {
		}
		err = rows.Err()
		rows.Close()
	}
	return f.d.wrapErr("wait for the batch's transactions to be visible ("+f.name+")", err)
}

// posArgs are outbox row ids as statement arguments.
func posArgs(ids []int64) []any {
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	return args
}

// sampleOpen reads the start of the oldest open transaction (at most
// every openEvery), before the binlog's end is read (noteEnd).
func (f *feed) sampleOpen(ctx context.Context) {
	if f.noOpen || time.Since(f.sampled) < f.openEvery {
		return
	}
	f.sampled = time.Now()
	open, err := f.d.oldestOpen(ctx)
	if errNumber(err) == errAccessDenied {
		f.noOpen = true
		f.d.cfg.Logger.Warn("ferrymysql: the relay's user may not read INFORMATION_SCHEMA.INNODB_TRX (GRANT PROCESS ON *.* TO it): "+
			"a recovery from a purged binlog then starts Config.RecoveryMargin before the last event delivered, and misses a producer transaction open longer than that",
			"feed", f.name, "recovery_margin", f.d.cfg.RecoveryMargin, "err", err)
		return
	}
	if err != nil {
		f.d.cfg.Logger.Debug("ferrymysql: reading the oldest open transaction failed", "feed", f.name, "err", err)
		return
	}
	f.samples = append(f.samples, openSample{open: open})
}

// oldestOpen is a time (µs) before the append time of every outbox row
// of a transaction open now: the start of the oldest open transaction
// that has written rows, from a session in the driver's database, rounded
// down to the second (INFORMATION_SCHEMA.INNODB_TRX has whole seconds); a
// transaction that has written nothing yet appends later than now. The
// server fills INNODB_TRX from a cache up to 0.1 s old: innodbTrxAge
// covers a transaction that wrote since. A prepared XA transaction whose
// session ended has none and does not count (a forgotten one would hold
// every feed's retention back): the feed keeps its rows by id (xaHold).
func (d *Driver) oldestOpen(ctx context.Context) (int64, error) {
	var now int64
	var age sql.NullInt64
	err := d.db.QueryRowContext(ctx, `SELECT `+sqlNow+`, TIMESTAMPDIFF(MICROSECOND, MIN(t.trx_started), NOW(6))
  FROM information_schema.INNODB_TRX t JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
 WHERE t.trx_rows_modified > 0 AND p.DB = ?`, d.schema).Scan(&now, &age)
	return now - max(age.Int64, innodbTrxAge.Microseconds()), err
}

// innodbTrxAge bounds the age of INFORMATION_SCHEMA.INNODB_TRX's cache.
const innodbTrxAge = 200 * time.Millisecond

// passSamples sets c.Open from the samples c has passed.
func (f *feed) passSamples(c *cursor) {
	i := 0
	for ; i < len(f.samples) && f.samples[i].file != "" && atOrAfter(c.File, c.Pos, f.samples[i].file, f.samples[i].pos); i++ {
		c.Open = max(c.Open, f.samples[i].open)
	}
	f.samples = f.samples[i:]
}
