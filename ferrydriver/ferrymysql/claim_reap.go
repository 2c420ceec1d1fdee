package ferrymysql

import (
	"context"
	"database/sql"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// ClaimHolders implements ferrydriver.Inbox: the group's PROCESSING
// range of ferry_inbox_pages_idx.
func (d *Driver) ClaimHolders(ctx context.Context, group string) ([]string, error) {
	rows, err := d.db.QueryContext(ctx, `SELECT DISTINCT claimed_by FROM ferry_inbox
 WHERE group_name = ? AND state = 'processing' AND claim_expires_at > `+sqlNow+` AND claimed_by IS NOT NULL`, group)
	if err != nil {
		return nil, d.wrapErr("list the claim holders of group "+group, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var w string
		if err := rows.Scan(&w); err != nil {
			return nil, d.wrapErr("list the claim holders of group "+group, err)
		}
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, d.wrapErr("list the claim holders of group "+group, err)
	}
	return out, nil
}

// ExpireClaims implements ferrydriver.Inbox: the rows it ends are
// expired claims, which a rescue takes (and every finish refuses).
func (d *Driver) ExpireClaims(ctx context.Context, p *ferrydriver.ExpireClaimsParams) (int, error) {
	group, worker := p.Group, p.Worker
	op := "expire the claims of " + worker + " in group " + group
	var n int64
	err := d.writeRC(ctx, op, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE ferry_inbox SET claim_expires_at = `+sqlNow+`
 WHERE group_name = ? AND state = 'processing' AND claimed_by = ? AND claim_expires_at > `+sqlNow, group, worker)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, d.wrapErr(op, err)
	}
	return int(n), nil
}

// RescueDue implements ferrydriver.Inbox: a rescue would take a key's
// head (inboxmodel.Decide): a key with a row under an expired claim and
// none under a live one, whose head runs now (PENDING, FAILED and due, or
// the expired claim's own row). A head that a rescue took and that failed
// (its retry later, or DEAD holding the key) leaves the rest of its run
// under the expired claim, and no rescue due until it may run again.
func (d *Driver) RescueDue(ctx context.Context, group string) (bool, error) {
	var due bool
	err := d.db.QueryRowContext(ctx, `SELECT EXISTS (
SELECT 1 FROM (SELECT DISTINCT p.group_name, p.k FROM ferry_inbox p
                WHERE p.group_name = ? AND p.state = 'processing' AND p.claim_expires_at <= `+sqlNow+`) x
  JOIN ferry_inbox i ON i.pos = (
       SELECT h.pos FROM ferry_inbox h FORCE INDEX (ferry_inbox_head_idx)
        WHERE h.group_name = x.group_name AND h.k = x.k AND h.state IN ('pending', 'processing', 'failed', 'dead')
          AND (h.state <> 'dead' OR `+holdPolicy+`)
        ORDER BY h.pos LIMIT 1)
 WHERE NOT EXISTS (SELECT 1 FROM ferry_inbox q FORCE INDEX (ferry_inbox_head_idx)
                    WHERE q.group_name = x.group_name AND q.k = x.k AND q.state = 'processing' AND q.claim_expires_at > `+sqlNow+`)
   AND (i.state = 'pending' OR (i.state = 'failed' AND i.next_attempt_at <= `+sqlNow+`)
        OR (i.state = 'processing' AND i.claim_expires_at <= `+sqlNow+`)))`,
		group, group).Scan(&due)
	if err != nil {
		return false, d.wrapErr("look for expired claims in group "+group, err)
	}
	return due, nil
}
