package ferrypg

import (
	"context"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryshared/driverkit"
)

// sqlDeadLetterReasons groups the newest $2 dead letters (of feed $1 when
// set: {feed} as in deadLetterFilter) by feed partition and reason: a range of dead_letters_list_idx, or of
// dead_letters_feed_failed_at_idx for one partition (planned for the
// values: queryCustom), then the grouping of at most $2 rows. Each group
// keeps its newest $3 event IDs; $4 groups at most, the one with the most
// rows first. The last column is how many rows were read.
const sqlDeadLetterReasons = `
SELECT feed, reason, count(*)::int, max(failed_at), array_to_string((array_agg(event_id::text ORDER BY failed_at DESC, event_id))[1:$3], ','), (sum(count(*)) OVER ())::int
  FROM (SELECT feed, reason, failed_at, event_id FROM {schema}.dead_letters
         WHERE {feed} AND failed_at <= 'infinity'::timestamptz
         ORDER BY failed_at DESC LIMIT $2) s
 GROUP BY feed, reason ORDER BY 3 DESC, 4 DESC, 2, 1 LIMIT $4`

// sqlInboxDeadReasons groups the newest $2 DEAD rows of group $1 by their
// last error, through inbox_dead_idx; $3 and $4 as above.
const sqlInboxDeadReasons = `
SELECT '', last_error, count(*)::int, max(finished_at), array_to_string((array_agg(event_id::text ORDER BY finished_at DESC, event_id))[1:$3], ','), (sum(count(*)) OVER ())::int
  FROM (SELECT COALESCE(last_error, '') AS last_error, finished_at, event_id FROM {schema}.inbox
         WHERE group_name = $1 AND state = 'dead'
         ORDER BY finished_at DESC LIMIT $2) s
 GROUP BY last_error ORDER BY 3 DESC, 4 DESC, 2 LIMIT $4`

// DeadLetterReasons implements ferrydriver.Admin.
func (d *Driver[TTx]) DeadLetterReasons(ctx context.Context, p *ferrydriver.ReasonsParams) (*ferrydriver.Reasons, error) {
	scan, ids, limit := p.Bounds()
	q, feed := d.queries.deadLetterReasons.of(p.Feed)
	return d.reasons(ctx, "group dead letters by reason", q, feed, scan, ids, limit)
}

// InboxDeadReasons implements ferrydriver.Admin.
func (d *Driver[TTx]) InboxDeadReasons(ctx context.Context, p *ferrydriver.ReasonsParams) (*ferrydriver.Reasons, error) {
	scan, ids, limit := p.Bounds()
	return d.reasons(ctx, "group dead events by reason", d.queries.inboxDeadReasons, p.Group, scan, ids, limit)
}

// reasons runs a grouping by reason q with its arguments: the scope, the
// scan, the IDs per group, the limit (and the feed's prefix, for dead
// letters).
func (d *Driver[TTx]) reasons(ctx context.Context, op, q string, args ...any) (*ferrydriver.Reasons, error) {
	r, err := d.db.queryCustom(ctx, q, args...)
	if err != nil {
		return nil, d.wrapErr(op, err)
	}
	defer r.Close()
	out := &ferrydriver.Reasons{}
	for r.Next() {
		var g ferrydriver.ReasonGroup
		var latest time.Time
		var evs string
		if err := r.Scan(&g.Feed, &g.Reason, &g.Count, &latest, &evs, &out.Scanned); err != nil {
			return nil, d.wrapErr(op, err)
		}
		g.Latest = latest.UTC()
		if g.EventIDs, err = driverkit.ParseIDList(evs); err != nil {
			return nil, d.wrapErr(op, err)
		}
		out.Groups = append(out.Groups, g)
	}
	if err := r.Err(); err != nil {
		return nil, d.wrapErr(op, err)
	}
	return out, nil
}
