package ferrysqlite

import (
	"context"
	"database/sql"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
)

// sqlDeadLetterReasons groups the newest ?2 dead letters (of partition ?1
// or of the partitions of a feed, ?9, when set), a walk of
// ferry_dead_letters_list_idx, by feed partition and reason: each group
// keeps its newest ?3 event IDs, ?4 groups at most, the one with the most
// rows first; the last column is how many rows were read.
const sqlDeadLetterReasons = `
SELECT feed, reason, count(*), max(failed_at), COALESCE(group_concat(CASE WHEN rn <= ?3 THEN event_id END, ',' ORDER BY failed_at DESC, event_id), ''),
       sum(count(*)) OVER ()
  FROM (SELECT feed, reason, failed_at, event_id, row_number() OVER (PARTITION BY feed, reason ORDER BY failed_at DESC, event_id) AS rn
          FROM (SELECT feed, reason, failed_at, event_id FROM ferry_dead_letters
                 WHERE (?1 = '' OR feed = ?1) AND (?9 = '' OR ` + familyTerm + `) ORDER BY failed_at DESC, event_id LIMIT ?2))
 GROUP BY feed, reason ORDER BY 3 DESC, 4 DESC, 2, 1 LIMIT ?4`

// sqlInboxDeadReasons groups the newest ?2 DEAD rows of group ?1
// (ferry_inbox_state_pages_idx, migration 12) by last error; ?3 and ?4 as above.
const sqlInboxDeadReasons = `
SELECT '', last_error, count(*), max(finished_at), COALESCE(group_concat(CASE WHEN rn <= ?3 THEN event_id END, ',' ORDER BY finished_at DESC, event_id), ''),
       sum(count(*)) OVER ()
  FROM (SELECT last_error, finished_at, event_id, row_number() OVER (PARTITION BY last_error ORDER BY finished_at DESC, event_id) AS rn
          FROM (SELECT COALESCE(last_error, '') AS last_error, finished_at, event_id FROM ferry_inbox
                 WHERE group_name = ?1 AND state = 'dead' AND state <> 'processed' ORDER BY finished_at DESC LIMIT ?2))
 GROUP BY last_error ORDER BY 3 DESC, 4 DESC, 2 LIMIT ?4`

// DeadLetterReasons implements ferrydriver.Admin.
func (d *Driver) DeadLetterReasons(ctx context.Context, p *ferrydriver.ReasonsParams) (*ferrydriver.Reasons, error) {
	scan, ids, limit := p.Bounds()
	exact, family := driverkit.FeedFilter(p.Feed)
	return d.reasons(ctx, "group dead letters by reason", sqlDeadLetterReasons, exact, scan, ids, limit, nil, nil, nil, nil, family)
}

// InboxDeadReasons implements ferrydriver.Admin.
func (d *Driver) InboxDeadReasons(ctx context.Context, p *ferrydriver.ReasonsParams) (*ferrydriver.Reasons, error) {
	scan, ids, limit := p.Bounds()
	return d.reasons(ctx, "group dead events by reason", sqlInboxDeadReasons, p.Group, scan, ids, limit)
}

// reasons runs a grouping by reason q with its parameters: the scope, the
// scan, the IDs per group, the limit (and, for dead letters, a feed's
// name at ?9).
func (d *Driver) reasons(ctx context.Context, op, q string, args ...any) (*ferrydriver.Reasons, error) {
	rows, err := d.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, d.wrapErr(op, err)
	}
	defer rows.Close()
	out := &ferrydriver.Reasons{}
	for rows.Next() {
		var g ferrydriver.ReasonGroup
		var latest sql.NullInt64
		var ids string
		if err := rows.Scan(&g.Feed, &g.Reason, &g.Count, &latest, &ids, &out.Scanned); err != nil {
			return nil, d.wrapErr(op, err)
		}
		if latest.Valid {
			g.Latest = fromMicros(latest.Int64)
		}
		if g.EventIDs, err = driverkit.ParseIDList(ids); err != nil {
			return nil, d.wrapErr(op, err)
		}
		out.Groups = append(out.Groups, g)
	}
	return out, d.wrapErr(op, rows.Err())
}
