package ferrypg

import (
	"context"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// sqlActivityInsert stores samples ($1..$12, $14, $15: one element each) and removes
// up to 1,000 samples older than $13 ms, by the (at) index: a recorder
// keeps the table bounded a little at a time.
const sqlActivityInsert = `
WITH ins AS (
    INSERT INTO {schema}.activity (kind, name, process, at, seconds, done, failed, dead, latency_p50, latency_p99, handler_p50, handler_p99,
                                   lag_events, lag_seconds)
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::float8[], $6::bigint[], $7::bigint[], $8::bigint[],
                         $9::float8[], $10::float8[], $11::float8[], $12::float8[], $14::bigint[], $15::float8[])
    ON CONFLICT (kind, name, process, at) DO NOTHING
), old AS (
    SELECT ctid FROM {schema}.activity WHERE at < now() - $13 * interval '1 millisecond' ORDER BY at LIMIT 1000
)
DELETE FROM {schema}.activity WHERE ctid IN (SELECT ctid FROM old)`

// sqlActivityList reads samples since $1, oldest first, through the (at)
// index.
const sqlActivityList = `
SELECT kind, name, process, at, seconds, done, failed, dead, latency_p50, latency_p99, handler_p50, handler_p99, lag_events, lag_seconds
  FROM {schema}.activity
 WHERE at >= $1 AND ($2 = '' OR kind = $2) AND ($3 = '' OR name = $3)
 ORDER BY at LIMIT $4`

// RecordActivity implements ferrydriver.Admin.
func (d *Driver[TTx]) RecordActivity(ctx context.Context, p *ferrydriver.RecordActivityParams) error {
	n := len(p.Samples)
	kinds, names, procs := make([]string, n), make([]string, n), make([]string, n)
	at := make([]time.Time, n)
	secs, l50, l99, h50, h99 := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	done, failed, dead := make([]int64, n), make([]int64, n), make([]int64, n)
	lagEvents, lagSecs := make([]int64, n), make([]float64, n)
	for i, s := range p.Samples {
		lagEvents[i], lagSecs[i] = s.LagEvents, s.LagAge.Seconds()
		kinds[i], names[i], procs[i], at[i] = s.Kind, s.Name, s.Process, s.At
		secs[i], done[i], failed[i], dead[i] = s.Interval.Seconds(), s.Done, s.Failed, s.Dead
		l50[i], l99[i], h50[i], h99[i] = s.LatencyP50.Seconds(), s.LatencyP99.Seconds(), s.HandlerP50.Seconds(), s.HandlerP99.Seconds()
	}
	retention := p.Retention
	if retention <= 0 {
		retention = ferrydriver.DefaultActivityRetention
	}
	if _, err := d.db.exec(ctx, d.queries.activityInsert, kinds, names, procs, at, secs, done, failed, dead, l50, l99, h50, h99,
		retention.Milliseconds(), lagEvents, lagSecs); err != nil {
		return d.wrapErr("record activity", err)
	}
	return nil
}

// ListActivity implements ferrydriver.Admin.
func (d *Driver[TTx]) ListActivity(ctx context.Context, p *ferrydriver.ListActivityParams) ([]*ferrydriver.ActivitySample, error) {
	limit := p.Limit
	if limit <= 0 || limit > ferrydriver.ActivityListCap {
		limit = ferrydriver.ActivityListCap
	}
	var out []*ferrydriver.ActivitySample
	err := scanAll(func() (rows, error) { return d.db.query(ctx, d.queries.activityList, p.Since, p.Kind, p.Name, limit) }, func(r rows) error {
		s := &ferrydriver.ActivitySample{}
		var secs, l50, l99, h50, h99, lag float64
		if err := r.Scan(&s.Kind, &s.Name, &s.Process, &s.At, &secs, &s.Done, &s.Failed, &s.Dead, &l50, &l99, &h50, &h99, &s.LagEvents, &lag); err != nil {
			return err
		}
		s.Interval, s.LatencyP50, s.LatencyP99, s.HandlerP50, s.HandlerP99 = seconds(secs), seconds(l50), seconds(l99), seconds(h50), seconds(h99)
		s.LagAge = seconds(lag)
		out = append(out, s)
		return nil
	})
	if err != nil {
		return nil, d.wrapErr("list activity", err)
	}
	return out, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
