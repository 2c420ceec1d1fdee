package ferrysqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/google/uuid"
)

var _ ferrydriver.InboxBatcher[*sql.Tx] = (*Driver)(nil)

// Savepoint implements ferrydriver.InboxBatcher. The savepoint is not
// released after fn succeeded (the commit releases every one): the next
// event's nests inside it; a failed fn is rolled back to its own, the
// latest of the name.
func (d *Driver) Savepoint(ctx context.Context, tx *sql.Tx, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if _, err := tx.ExecContext(ctx, `SAVEPOINT ferry_event`); err != nil {
		return fmt.Errorf("ferrysqlite: %w: %w", ferrydriver.ErrSavepoint, err)
	}
	if err := fn(ctx, tx); err != nil {
		if _, rerr := tx.ExecContext(context.WithoutCancel(ctx), `ROLLBACK TO SAVEPOINT ferry_event`); rerr != nil {
			return fmt.Errorf("ferrysqlite: %w: roll back to it after %v: %w", ferrydriver.ErrSavepoint, err, rerr)
		}
		return err
	}
	return nil
}

// FinishInboxTx implements ferrydriver.InboxBatcher. SQLite runs in
// process, so one statement per row costs no round trip: each row is
// marked as CompleteInboxTx and FailInbox mark it; then, once per run, its
// claim ends (the rows the batch did not report run again) and the key is
// recomputed.
func (d *Driver) FinishInboxTx(ctx context.Context, tx *sql.Tx, p *ferrydriver.FinishInboxParams) ([]uuid.UUID, error) {
	type run struct{ key, claim string }
	var lost []uuid.UUID
	last := map[run]int64{}
	var runs []run
	for _, r := range p.Rows {
		var retry any
		if r.State == ferrydriver.InboxFailed {
			retry = micros(r.RetryAt)
		}
		key, pos, err := d.mark(ctx, tx, p.Group, r.EventID, r.Claim, r.State, r.Error, retry, r.Uncounted)
		switch {
		case errors.Is(err, ferrydriver.ErrClaimLost):
			lost = append(lost, r.EventID)
			continue
		case err != nil:
			return nil, err
		}
		k := run{key, r.Claim}
		if _, ok := last[k]; !ok {
			runs = append(runs, k)
		}
		last[k] = max(last[k], pos)
	}
	for _, k := range runs {
		if err := d.release(ctx, tx, p.Group, k.key, k.claim, last[k], false); err != nil {
			return nil, err
		}
	}
	return lost, nil
}
