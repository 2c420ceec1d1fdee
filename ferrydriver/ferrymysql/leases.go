package ferrymysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// LoadCheckpoint implements ferrydriver.Store.
func (d *Driver) LoadCheckpoint(ctx context.Context, feed string) (*ferrydriver.Checkpoint, error) {
	cp := &ferrydriver.Checkpoint{Feed: feed}
	var updated int64
	err := d.db.QueryRowContext(ctx, `SELECT pos, term, updated_at FROM ferry_checkpoints WHERE feed = ?`, feed).
		Scan(&cp.Cursor, &cp.Term, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return cp, nil
	}
	if err != nil {
		return nil, d.wrapErr("load checkpoint of "+feed, err)
	}
	cp.UpdatedAt = fromMicros(updated)
	return cp, nil
}

// holds reports whether holder holds lease name at term, and keeps the
// lease's row locked (shared) until tx ends: a takeover waits for the
// fenced write to commit. tx is guarded (see guardedWrite): a holder that
// stops between its statements cannot keep the row locked.
func holds(ctx context.Context, tx *sql.Tx, name, holder string, term int64) (bool, error) {
	var one int
	err := tx.QueryRowContext(ctx, `SELECT 1 FROM ferry_leases WHERE name = ? AND holder = ? AND term = ? AND expires_at > `+sqlNow+` LOCK IN SHARE MODE`,
		name, holder, term).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// fencedWrite runs fn in a transaction if holder holds feed's lease at
// term; ferrydriver.ErrLeaseLost if not.
func (d *Driver) fencedWrite(ctx context.Context, op, feed, holder string, term int64, fn func(tx *sql.Tx) error) error {
	return d.guardedWrite(ctx, op+" of "+feed, func(tx *sql.Tx) error {
		ok, err := holds(ctx, tx, feed, holder, term)
		if err != nil {
			return d.wrapErr(op+" of "+feed, err)
		}
		if !ok {
			return fmt.Errorf("ferrymysql: %s of %s at term %d: %w", op, feed, term, ferrydriver.ErrLeaseLost)
		}
		return fn(tx)
	})
}

// SaveCheckpoint implements ferrydriver.Store.
func (d *Driver) SaveCheckpoint(ctx context.Context, p *ferrydriver.SaveCheckpointParams) error {
	return d.saveCheckpoint(ctx, p, nil)
}

// saveCheckpoint is SaveCheckpoint; fenced, when not nil, runs between the
// fence and the write (a test stops there).
func (d *Driver) saveCheckpoint(ctx context.Context, p *ferrydriver.SaveCheckpointParams, fenced func()) error {
	return d.fencedWrite(ctx, "save checkpoint", p.Feed, p.Holder, p.Term, func(tx *sql.Tx) error {
		if fenced != nil {
			fenced()
		}
		_, err := tx.ExecContext(ctx, `
INSERT INTO ferry_checkpoints (feed, p, pos, term, updated_at) VALUES (?, ?, ?, ?, `+sqlNow+`)
ON DUPLICATE KEY UPDATE p = VALUES(p), pos = VALUES(pos), term = VALUES(term), updated_at = VALUES(updated_at)`,
			p.Feed, p.Partition, p.Cursor, p.Term)
		return d.wrapErr("save checkpoint of "+p.Feed, err)
	})
}

func (d *Driver) readLease(ctx context.Context, q queryRower, name string) (*ferrydriver.Lease, error) {
	l := &ferrydriver.Lease{Name: name}
	var expires, now int64
	err := q.QueryRowContext(ctx, `SELECT holder, term, expires_at, `+sqlNow+` FROM ferry_leases WHERE name = ?`, name).
		Scan(&l.Holder, &l.Term, &expires, &now)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && l.Term == 0) {
		return nil, fmt.Errorf("ferrymysql: lease %s: %w", name, ferrydriver.ErrNotFound)
	}
	if err != nil {
		return nil, d.wrapErr("read lease "+name, err)
	}
	l.ExpiresAt, l.Now = fromMicros(expires), fromMicros(now)
	return l, nil
}

// AcquireLease implements ferrydriver.Store: the lease's row is created
// free if it is missing, then locked and decided on: renewed for its
// holder, taken (term + 1) when it expired, left to its holder otherwise.
func (d *Driver) AcquireLease(ctx context.Context, p *ferrydriver.LeaseParams) (*ferrydriver.Lease, error) {
	var out *ferrydriver.Lease
	op := "acquire lease " + p.Name
	err := d.guardedWrite(ctx, op, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO ferry_leases (name, holder, term, expires_at) VALUES (?, '', 0, 0)
ON DUPLICATE KEY UPDATE name = name`, p.Name); err != nil {
			return d.wrapErr(op, err)
		}
		var holder string
		var term, expires, now int64
		if err := tx.QueryRowContext(ctx, `SELECT holder, term, expires_at, `+sqlNow+` FROM ferry_leases WHERE name = ? FOR UPDATE`, p.Name).
			Scan(&holder, &term, &expires, &now); err != nil {
			return d.wrapErr(op, err)
		}
		switch {
		case holder == p.Holder && expires > now:
			if _, err := tx.ExecContext(ctx, `UPDATE ferry_leases SET expires_at = ? WHERE name = ?`, now+p.TTL.Microseconds(), p.Name); err != nil {
				return d.wrapErr(op, err)
			}
		case expires <= now:
			if _, err := tx.ExecContext(ctx, `UPDATE ferry_leases SET holder = ?, term = term + 1, expires_at = ? WHERE name = ?`,
				p.Holder, now+p.TTL.Microseconds(), p.Name); err != nil {
				return d.wrapErr(op, err)
			}
		}
		var err error
		out, err = d.readLease(ctx, tx, p.Name)
		return err
	})
	return out, err
}

// RenewLease implements ferrydriver.Store.
func (d *Driver) RenewLease(ctx context.Context, p *ferrydriver.LeaseParams) (*ferrydriver.Lease, error) {
	var out *ferrydriver.Lease
	err := d.guardedWrite(ctx, "renew lease "+p.Name, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE ferry_leases SET expires_at = `+sqlNow+` + ? WHERE name = ? AND holder = ? AND term = ? AND expires_at > `+sqlNow,
			p.TTL.Microseconds(), p.Name, p.Holder, p.Term)
		if err != nil {
			return d.wrapErr("renew lease "+p.Name, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("ferrymysql: renew lease %s at term %d: %w", p.Name, p.Term, ferrydriver.ErrLeaseLost)
		}
		out, err = d.readLease(ctx, tx, p.Name)
		return err
	})
	return out, err
}

// ReleaseLease implements ferrydriver.Store.
func (d *Driver) ReleaseLease(ctx context.Context, p *ferrydriver.LeaseParams) error {
	_, err := d.db.ExecContext(ctx, `UPDATE ferry_leases SET expires_at = `+sqlNow+` - 1 WHERE name = ? AND holder = ? AND term = ?`,
		p.Name, p.Holder, p.Term)
	return d.wrapErr("release lease "+p.Name, err)
}

// GetLease implements ferrydriver.Store.
func (d *Driver) GetLease(ctx context.Context, name string) (*ferrydriver.Lease, error) {
	return d.readLease(ctx, d.db, name)
}

// ListLeases implements ferrydriver.Store.
func (d *Driver) ListLeases(ctx context.Context, prefix string) ([]*ferrydriver.Lease, error) {
	rows, err := d.db.QueryContext(ctx, `SELECT name, holder, term, expires_at, `+sqlNow+` FROM ferry_leases WHERE term > 0 AND LEFT(name, LENGTH(?)) = ? ORDER BY name`,
		prefix, prefix)
	if err != nil {
		return nil, d.wrapErr("list leases", err)
	}
	defer rows.Close()
	var out []*ferrydriver.Lease
	for rows.Next() {
		l := &ferrydriver.Lease{}
		var expires, now int64
		if err := rows.Scan(&l.Name, &l.Holder, &l.Term, &expires, &now); err != nil {
			return nil, d.wrapErr("list leases", err)
		}
		l.ExpiresAt, l.Now = fromMicros(expires), fromMicros(now)
		out = append(out, l)
	}
	return out, d.wrapErr("list leases", rows.Err())
}
