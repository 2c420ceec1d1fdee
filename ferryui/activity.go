package ferryui

import (
	"context"
	"net/http"
	"sort"
	"time"

	"github.com/ferry-dev/ferry/ferryui/uiapi"

	"github.com/ferry-dev/ferry/ferrydriver"
)

// maxPoints bounds a series: the step widens with the window.
const maxPoints = 180

// activity answers GET /api/v1/activity?since=15m[&kind=relay|consumer]
// [&name=…]: since is a duration back from now (up to a day) or an
// RFC 3339 time.
func (h *Handler) activity(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	until := time.Now().UTC()
	since := until.Add(-15 * time.Minute)
	if v := q.Get("since"); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			since = until.Add(-d)
		} else if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			since = t.UTC()
		} else {
			return badRequest("since=%q is neither a duration back from now (15m, 1h) nor an RFC 3339 time", v)
		}
	}
	if until.Sub(since) > ferrydriver.DefaultActivityRetention {
		return badRequest("since=%q reaches back more than %v, the samples' retention: ask for less", q.Get("since"), ferrydriver.DefaultActivityRetention)
	}
	if since.After(until) {
		return badRequest("since=%q is in the future", q.Get("since"))
	}
	kind, name := q.Get("kind"), q.Get("name")
	if kind != "" && kind != ferrydriver.ActivityRelay && kind != ferrydriver.ActivityConsumer {
		return badRequest("kind=%q: use relay or consumer", kind)
	}
	step := max(10*time.Second, until.Sub(since)/maxPoints).Round(time.Second)
	out := uiapi.ActivityJSON{Since: since, Until: until, StepSeconds: step.Seconds(), Series: []uiapi.ActivitySeries{}}
	var samples []*ferrydriver.ActivitySample
	// Relays record in the outbox's store, consumers in the inbox's (the
	// same database, often: then once).
	sources := []struct {
		rec  ferrydriver.Admin
		kind string
	}{{h.cfg.Store, ferrydriver.ActivityRelay}, {h.cfg.Inbox, ferrydriver.ActivityConsumer}}
	for _, s := range sources {
		if s.rec == nil || (kind != "" && kind != s.kind) {
			continue
		}
		out.Recorded = true
		got, err := listActivity(r.Context(), s.rec, since, s.kind, name)
		if err != nil {
			return err
		}
		samples = append(samples, got...)
	}
	out.Series = series(samples, since, step)
	writeJSON(w, http.StatusOK, out)
	return nil
}

// listActivity reads a kind's samples since, up to the cap.
func listActivity(ctx context.Context, rec ferrydriver.Admin, since time.Time, kind, name string) ([]*ferrydriver.ActivitySample, error) {
	return rec.ListActivity(ctx, &ferrydriver.ListActivityParams{Since: since, Kind: kind, Name: name, Limit: ferrydriver.ActivityListCap})
}

// series sums samples into steps of one series per (kind, name).
func series(samples []*ferrydriver.ActivitySample, since time.Time, step time.Duration) []uiapi.ActivitySeries {
	type id struct{ kind, name string }
	type acc struct {
		point     uiapi.ActivityPoint
		weighted  float64 // p50s × done, for the weighted mean
		hWeighted float64
		procs     map[string]bool
	}
	steps := map[id]map[int64]*acc{}
	for _, s := range samples {
		k := id{s.Kind, s.Name}
		if steps[k] == nil {
			steps[k] = map[int64]*acc{}
		}
		n := int64(s.At.Sub(since) / step)
		a := steps[k][n]
		if a == nil {
			a = &acc{point: uiapi.ActivityPoint{At: since.Add(time.Duration(n+1) * step)}, procs: map[string]bool{}}
			steps[k][n] = a
		}
		p := &a.point
		p.Done, p.Failed, p.Dead = p.Done+s.Done, p.Failed+s.Failed, p.Dead+s.Dead
		p.LatencyP99 = max(p.LatencyP99, s.LatencyP99.Seconds())
		p.HandlerP99 = max(p.HandlerP99, s.HandlerP99.Seconds())
		p.LagEvents, p.LagSeconds = max(p.LagEvents, s.LagEvents), max(p.LagSeconds, s.LagAge.Seconds())
		a.weighted += s.LatencyP50.Seconds() * float64(s.Done)
		a.hWeighted += s.HandlerP50.Seconds() * float64(s.Done)
		a.procs[s.Process] = true
	}
	out := make([]uiapi.ActivitySeries, 0, len(steps))
	for k, byStep := range steps {
		ser := uiapi.ActivitySeries{Kind: k.kind, Name: k.name, Points: make([]uiapi.ActivityPoint, 0, len(byStep))}
		var weighted, hWeighted float64
		procs := map[string]bool{}
		for _, a := range byStep {
			p := a.point
			p.Processes = len(a.procs)
			p.DonePerSecond = float64(p.Done) / step.Seconds()
			p.FailedPerSecond = float64(p.Failed) / step.Seconds()
			if p.Done > 0 {
				p.LatencyP50, p.HandlerP50 = a.weighted/float64(p.Done), a.hWeighted/float64(p.Done)
			}
			ser.Points = append(ser.Points, p)
			t := &ser.Total
			t.Done, t.Failed, t.Dead = t.Done+p.Done, t.Failed+p.Failed, t.Dead+p.Dead
			t.LatencyP99, t.HandlerP99 = max(t.LatencyP99, p.LatencyP99), max(t.HandlerP99, p.HandlerP99)
			weighted, hWeighted = weighted+a.weighted, hWeighted+a.hWeighted
			for pr := range a.procs {
				procs[pr] = true
			}
		}
		sort.Slice(ser.Points, func(i, j int) bool { return ser.Points[i].At.Before(ser.Points[j].At) })
		if len(ser.Points) > 0 {
			t := &ser.Total
			last := ser.Points[len(ser.Points)-1]
			t.At, t.LagEvents, t.LagSeconds = last.At, last.LagEvents, last.LagSeconds
			window := last.At.Sub(since).Seconds()
			t.DonePerSecond, t.FailedPerSecond = float64(t.Done)/window, float64(t.Failed)/window
			if t.Done > 0 {
				t.LatencyP50, t.HandlerP50 = weighted/float64(t.Done), hWeighted/float64(t.Done)
			}
			t.Processes = len(procs)
		}
		out = append(out, ser)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind > out[j].Kind // relays first
		}
		return out[i].Name < out[j].Name
	})
	return out
}
