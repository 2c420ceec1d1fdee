package ferrymysql

import (
	"context"
	"database/sql"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
)

// sqlReasons is a grouping by reason over scan: it reads the newest rows
// of one range of an index (at most the scan), groups them by a hash of
// their reason (MySQL compares only the first max_sort_length bytes of a
// BLOB when it groups or sorts by it, and two reasons that share a long
// prefix must stay two), keeps each group's newest IDs, and reports how
// many rows it read. IDs come as hex (uuid.Parse reads it); GROUP_CONCAT's
// bound is raised for the statement (MySQL's default cuts it at 1 KiB).
func sqlReasons(scan string) string {
	return `SET STATEMENT group_concat_max_len = 16777216 FOR
WITH s AS (` + scan + `),
     r AS (SELECT feed, reason, at, event_id, SHA2(reason, 256) AS h,
                  ROW_NUMBER() OVER (PARTITION BY feed, SHA2(reason, 256) ORDER BY at DESC, event_id) AS rn
             FROM s)
SELECT feed, MIN(reason), COUNT(*), MAX(at),
       COALESCE(GROUP_CONCAT(IF(rn <= ?, HEX(event_id), NULL) ORDER BY at DESC, event_id SEPARATOR ','), ''),
       (SELECT COUNT(*) FROM s)
  FROM r GROUP BY feed, h ORDER BY 3 DESC, 4 DESC, 2, 1 LIMIT ?`
}

// The newest dead letters (of a partition: ferry_dead_letters_feed_idx;
// of all, or of a feed's partitions: ferry_dead_letters_list_idx), and a
// group's newest DEAD rows (ferry_inbox_pages_idx).
const (
	sqlScanDeadLetters     = `SELECT feed, reason, failed_at AS at, event_id FROM ferry_dead_letters ORDER BY failed_at DESC, event_id LIMIT ?`
	sqlScanFeedDeadLetters = `SELECT feed, reason, failed_at AS at, event_id FROM ferry_dead_letters WHERE feed = ? ORDER BY failed_at DESC, event_id LIMIT ?`
	sqlScanFamilyDead      = `SELECT feed, reason, failed_at AS at, event_id FROM ferry_dead_letters
 WHERE LEFT(feed, LENGTH(?)) = ? AND SUBSTRING(feed, LENGTH(?) + 1) REGEXP '^[0-9]+$' ORDER BY failed_at DESC, event_id LIMIT ?`
	sqlScanInboxDead = `SELECT '' AS feed, COALESCE(last_error, '') AS reason, finished_at AS at, event_id FROM ferry_inbox FORCE INDEX (ferry_inbox_pages_idx)
 WHERE group_name = ? AND state = 'dead' ORDER BY finished_at DESC, received_at DESC, event_id DESC LIMIT ?`
)

// The groupings by reason, one statement per scan, each fixed text.
var (
	sqlReasonsDeadLetters     = sqlReasons(sqlScanDeadLetters)
	sqlReasonsFeedDeadLetters = sqlReasons(sqlScanFeedDeadLetters)
	sqlReasonsFamilyDead      = sqlReasons(sqlScanFamilyDead)
	sqlReasonsInboxDead       = sqlReasons(sqlScanInboxDead)
)

// DeadLetterReasons implements ferrydriver.Admin.
func (d *Driver) DeadLetterReasons(ctx context.Context, p *ferrydriver.ReasonsParams) (*ferrydriver.Reasons, error) {
	exact, family := driverkit.FeedFilter(p.Feed)
	switch {
	case exact != "":
		return d.reasons(ctx, "group dead letters by reason", sqlReasonsFeedDeadLetters, []any{exact}, p)
	case family != "":
		return d.reasons(ctx, "group dead letters by reason", sqlReasonsFamilyDead, []any{family, family, family}, p)
	}
	return d.reasons(ctx, "group dead letters by reason", sqlReasonsDeadLetters, nil, p)
}

// InboxDeadReasons implements ferrydriver.Admin.
func (d *Driver) InboxDeadReasons(ctx context.Context, p *ferrydriver.ReasonsParams) (*ferrydriver.Reasons, error) {
	return d.reasons(ctx, "group dead events of "+p.Group+" by reason", sqlReasonsInboxDead, []any{p.Group}, p)
}

func (d *Driver) reasons(ctx context.Context, op, query string, scope []any, p *ferrydriver.ReasonsParams) (*ferrydriver.Reasons, error) {
	n, ids, limit := p.Bounds()
	args := append(append(scope, n), ids, limit)
	rows, err := d.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, d.wrapErr(op, err)
	}
	defer rows.Close()
	out := &ferrydriver.Reasons{}
	for rows.Next() {
		var g ferrydriver.ReasonGroup
		var feed, reason []byte
		var latest sql.NullInt64
		var ids string
		if err := rows.Scan(&feed, &reason, &g.Count, &latest, &ids, &out.Scanned); err != nil {
			return nil, d.wrapErr(op, err)
		}
		g.Feed, g.Reason = string(feed), string(reason)
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
