package ferrypg

import (
	"context"
	"fmt"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

var _ ferrydriver.InboxBatcher[pgx.Tx] = (*Driver[pgx.Tx])(nil)

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
// every outcome and moves the keys on, one tells the callers awaiting the
// finished events; both in one round trip (finishRows). When a claim is
// lost, what they did is rolled back by the caller.
func (d *Driver[TTx]) FinishInboxTx(ctx context.Context, tx TTx, p *ferrydriver.FinishInboxParams) ([]uuid.UUID, error) {
	return d.finishRows(ctx, d.wrapTx(tx), p.Group, p.Rows)
}
