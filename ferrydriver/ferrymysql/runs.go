package ferrymysql

import (
	"context"
	"database/sql"
	"strings"

	"github.com/google/uuid"
)

// A claim takes a run of a key's rows (ClaimInboxParams.PerKey): its head
// and the PENDING rows after it, in order, up to the first row that cannot
// run now. They are PROCESSING under the claim's token, and the key stays
// claimed (due at the claim's expiry) while the caller runs them, each in
// a transaction of its own. Each row but the run's last has a claim
// string ending in runMark, so that its finish knows, in any process and
// after any restart, that rows of its run come after it: with Keep it
// leaves them and the key claimed; without Keep, or failing, it gives them
// back (PENDING, uncounted: the rows of the key still PROCESSING under the
// token, one range of ferry_inbox_head_idx) and makes the key due. A
// run's last row, and a head claimed alone, the common case without a
// backlog, finish with no statement more than before runs.

// runMark ends the claim string of a claimed row with later rows in its
// run.
const runMark = "+run"

// parseClaim reads a claim string: its token, and whether later rows of
// the row's run were claimed with it.
func parseClaim(claim string) (token uuid.UUID, more bool, err error) {
	claim, more = strings.CutSuffix(claim, runMark)
	token, err = uuid.Parse(claim)
	return token, more, err
}

// sqlRunRest locks the rows of a finished row's key that remain
// PROCESSING under its claim's token (arguments: group, group, event,
// token), with SKIP LOCKED, so that it never waits: a row another transaction holds is
// one that transaction is finishing or retracting, or gives back itself.
const sqlRunRest = `
SELECT pos FROM ferry_inbox FORCE INDEX (ferry_inbox_head_idx)
 WHERE group_name = ? AND k = (SELECT i.k FROM ferry_inbox i FORCE INDEX (ferry_inbox_event_idx) WHERE i.group_name = ? AND i.event_id = ?)
   AND state = 'processing' AND claim_token = ? FOR UPDATE SKIP LOCKED`

// runsRest is sqlRunRest by key, for keys keys and tokens tokens: its
// arguments are the group, the keys and the tokens (a batch's rows come
// from one claim, or a few).
func runsRest(keys, tokens int) string {
	return `SELECT pos FROM ferry_inbox FORCE INDEX (ferry_inbox_head_idx)
 WHERE group_name = ? AND k IN (` + marks(keys) + `) AND state = 'processing' AND claim_token IN (` + marks(tokens) + `)
 ORDER BY k, pos FOR UPDATE SKIP LOCKED`
}

// giveBack makes the rows that query (sqlRunRest or runsRest, with args)
// locks PENDING again, their attempt taken back: the rows of a run after
// the one whose finish ended it.
func giveBack(ctx context.Context, tx *sql.Tx, query string, args ...any) error {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	var positions []any
	for rows.Next() {
		var pos int64
		if err := rows.Scan(&pos); err != nil {
			rows.Close()
			return err
		}
		positions = append(positions, pos)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(positions) == 0 {
		return err
	}
	_, err = tx.ExecContext(ctx, `UPDATE ferry_inbox
   SET state = 'pending', attempts = GREATEST(attempts - 1, 0), claimed_by = NULL, claim_token = NULL, claim_expires_at = NULL
 WHERE pos IN (`+marks(len(positions))+`)`, positions...)
	return err
}
