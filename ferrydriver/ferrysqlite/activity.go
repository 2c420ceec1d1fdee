package ferrysqlite

import (
	"context"
	"database/sql"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// RecordActivity implements ferrydriver.Admin: the samples and
// the removal of up to 1,000 expired ones, in one write transaction.
func (d *Driver) RecordActivity(ctx context.Context, p *ferrydriver.RecordActivityParams) error {
	retention := p.Retention
	if retention <= 0 {
		retention = ferrydriver.DefaultActivityRetention
	}
	return d.write(ctx, "record activity", func(tx *sql.Tx) error {
		for _, s := range p.Samples {
			if _, err := tx.ExecContext(ctx, `
INSERT INTO ferry_activity (kind, name, process, at, seconds, done, failed, dead, latency_p50, latency_p99, handler_p50, handler_p99,
                            lag_events, lag_seconds)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
				s.Kind, s.Name, s.Process, micros(s.At), s.Interval.Seconds(), s.Done, s.Failed, s.Dead,
				s.LatencyP50.Seconds(), s.LatencyP99.Seconds(), s.HandlerP50.Seconds(), s.HandlerP99.Seconds(), s.LagEvents, s.LagAge.Seconds()); err != nil {
				return d.wrapErr("record activity", err)
			}
		}
		if _, err := tx.ExecContext(ctx, `
DELETE FROM ferry_activity WHERE rowid IN (SELECT rowid FROM ferry_activity WHERE at < ? ORDER BY at LIMIT 1000)`,
			micros(now().Add(-retention))); err != nil {
			return d.wrapErr("remove expired activity", err)
		}
		return nil
	})
}

// ListActivity implements ferrydriver.Admin.
func (d *Driver) ListActivity(ctx context.Context, p *ferrydriver.ListActivityParams) ([]*ferrydriver.ActivitySample, error) {
	limit := p.Limit
	if limit <= 0 || limit > ferrydriver.ActivityListCap {
		limit = ferrydriver.ActivityListCap
	}
	rows, err := d.r.QueryContext(ctx, `
SELECT kind, name, process, at, seconds, done, failed, dead, latency_p50, latency_p99, handler_p50, handler_p99, lag_events, lag_seconds
  FROM ferry_activity WHERE at >= ?1 AND (?2 = '' OR kind = ?2) AND (?3 = '' OR name = ?3)
 ORDER BY at LIMIT ?4`, micros(p.Since), p.Kind, p.Name, limit)
	if err != nil {
		return nil, d.wrapErr("list activity", err)
	}
	defer rows.Close()
	var out []*ferrydriver.ActivitySample
	for rows.Next() {
		s := &ferrydriver.ActivitySample{}
		var at int64
		var secs, l50, l99, h50, h99, lag float64
		if err := rows.Scan(&s.Kind, &s.Name, &s.Process, &at, &secs, &s.Done, &s.Failed, &s.Dead, &l50, &l99, &h50, &h99, &s.LagEvents, &lag); err != nil {
			return nil, d.wrapErr("list activity", err)
		}
		s.At = fromMicros(at)
		s.Interval, s.LatencyP50, s.LatencyP99, s.HandlerP50, s.HandlerP99 = seconds(secs), seconds(l50), seconds(l99), seconds(h50), seconds(h99)
		s.LagAge = seconds(lag)
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, d.wrapErr("list activity", err)
	}
	return out, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
