package ferrymysql

import (
	"context"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// RecordActivity implements ferrydriver.Admin: the samples in
// one statement (a sample stored already is kept), then the removal of up
// to 1,000 expired ones, the oldest (a range of ferry_activity_at_idx).
func (d *Driver) RecordActivity(ctx context.Context, p *ferrydriver.RecordActivityParams) error {
	retention := p.Retention
	if retention <= 0 {
		retention = ferrydriver.DefaultActivityRetention
	}
	if len(p.Samples) > 0 {
		var args []any
		for _, s := range p.Samples {
			args = append(args, s.Kind, s.Name, s.Process, micros(s.At), s.Interval.Seconds(), s.Done, s.Failed, s.Dead,
				s.LatencyP50.Seconds(), s.LatencyP99.Seconds(), s.HandlerP50.Seconds(), s.HandlerP99.Seconds(), s.LagEvents, s.LagAge.Seconds())
		}
		if _, err := d.db.ExecContext(ctx, `
INSERT INTO ferry_activity (kind, name, process, at, seconds, done, failed, dead, latency_p50, latency_p99, handler_p50, handler_p99,
                            lag_events, lag_seconds)
VALUES `+strings.TrimSuffix(strings.Repeat(`(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?), `, len(p.Samples)), ", ")+`
ON DUPLICATE KEY UPDATE kind = kind`, args...); err != nil {
			return d.wrapErr("record activity", err)
		}
	}
	if _, err := d.db.ExecContext(ctx, `DELETE FROM ferry_activity WHERE at < `+sqlNow+` - ? ORDER BY at LIMIT 1000`, retention.Microseconds()); err != nil {
		return d.wrapErr("remove expired activity", err)
	}
	return nil
}

// ListActivity implements ferrydriver.Admin: a range of
// ferry_activity_at_idx from p.Since.
func (d *Driver) ListActivity(ctx context.Context, p *ferrydriver.ListActivityParams) ([]*ferrydriver.ActivitySample, error) {
	limit := p.Limit
	if limit <= 0 || limit > ferrydriver.ActivityListCap {
		limit = ferrydriver.ActivityListCap
	}
	q := `SELECT kind, name, process, at, seconds, done, failed, dead, latency_p50, latency_p99, handler_p50, handler_p99, lag_events, lag_seconds
  FROM ferry_activity WHERE at >= ?`
	args := []any{micros(p.Since)}
	if p.Kind != "" {
		q += ` AND kind = ?`
		args = append(args, p.Kind)
	}
	if p.Name != "" {
		q += ` AND name = ?`
		args = append(args, p.Name)
	}
	rows, err := d.db.QueryContext(ctx, q+` ORDER BY at LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, d.wrapErr("list activity", err)
	}
	defer rows.Close()
	var out []*ferrydriver.ActivitySample
	for rows.Next() {
		s := &ferrydriver.ActivitySample{}
		var kind, name, process []byte
		var at int64
		var secs, l50, l99, h50, h99, lag float64
		if err := rows.Scan(&kind, &name, &process, &at, &secs, &s.Done, &s.Failed, &s.Dead, &l50, &l99, &h50, &h99, &s.LagEvents, &lag); err != nil {
			return nil, d.wrapErr("list activity", err)
		}
		s.Kind, s.Name, s.Process, s.At = string(kind), string(name), string(process), fromMicros(at)
		s.Interval, s.LatencyP50, s.LatencyP99, s.HandlerP50, s.HandlerP99 = seconds(secs), seconds(l50), seconds(l99), seconds(h50), seconds(h99)
		s.LagAge = seconds(lag)
		out = append(out, s)
	}
	return out, d.wrapErr("list activity", rows.Err())
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
