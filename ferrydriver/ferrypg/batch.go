package ferrypg

import (
	"context"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

var _ ferrydriver.InboxBatcher[pgx.Tx] = (*Driver[pgx.Tx])(nil)

// FinishInboxTx implements ferrydriver.InboxBatcher: one statement records
// every outcome and moves the keys on, one tells the callers awaiting the
// finished events; both in one round trip (finishRows), which in a
// transaction of RunInTx is its COMMIT's (see lazyTx). When a claim is
// lost, what they did is rolled back by the caller.
func (d *Driver[TTx]) FinishInboxTx(ctx context.Context, tx TTx, p *ferrydriver.FinishInboxParams) ([]uuid.UUID, error) {
	return d.finishRows(ctx, d.wrapTx(tx), p.Group, p.Rows, false, any(tx))
}
