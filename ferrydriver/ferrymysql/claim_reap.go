package ferrymysql

import (
	"context"
	"database/sql"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// ClaimHolders implements ferrydriver.Inbox: the group's claimed keys, a
// range of ferry_inbox_keys_rescue_idx (a claim's rescue is due at its
// expiry).
func (d *Driver) ClaimHolders(ctx context.Context, group string) ([]string, error) {
	rows, err := d.db.QueryContext(ctx, `SELECT DISTINCT claimed_by FROM ferry_inbox_keys
 WHERE group_name = ? AND rescue_at > `+sqlNow+` AND claim_token IS NOT NULL AND claim_expires_at > `+sqlNow+` AND claimed_by IS NOT NULL`, group)
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

// ExpireClaims implements ferrydriver.Inbox: the claims it ends are
// expired claims, due for a rescue (and every finish refuses them).
func (d *Driver) ExpireClaims(ctx context.Context, p *ferrydriver.ExpireClaimsParams) (int, error) {
	group, worker := p.Group, p.Worker
	op := "expire the claims of " + worker + " in group " + group
	var n int64
	err := d.writeRC(ctx, op, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE ferry_inbox_keys SET claim_expires_at = `+sqlNow+`, rescue_at = `+sqlNow+`
 WHERE group_name = ? AND rescue_at > `+sqlNow+` AND claim_token IS NOT NULL AND claimed_by = ? AND claim_expires_at > `+sqlNow+`
 ORDER BY k`, group, worker)
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

// RescueDue implements ferrydriver.Inbox: a key's claim expired, or its
// next suspect row may run (a range of ferry_inbox_keys_rescue_idx).
func (d *Driver) RescueDue(ctx context.Context, group string) (bool, error) {
	var due bool
	err := d.db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM ferry_inbox_keys WHERE group_name = ? AND rescue_at <= `+sqlNow+`)`, group).Scan(&due)
	if err != nil {
		return false, d.wrapErr("look for expired claims in group "+group, err)
	}
	return due, nil
}
