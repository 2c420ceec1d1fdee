package ferry_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryprom"
	"github.com/ferry-dev/ferry/ferryshared/memsink"
)

// dashboardQueries returns every PromQL expression of the Grafana
// dashboard in docs/grafana.
func dashboardQueries(t *testing.T) []string {
	raw, err := os.ReadFile("docs/grafana/ferry-dashboard.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	var exprs []string
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	return exprs
}

// alertQueries returns the expression of every alert rule in
// deploy/prometheus/ferry-alerts.yml (one line after "expr:", or the
// indented block of "expr: |").
func alertQueries(t *testing.T) []string {
	raw, err := os.ReadFile("deploy/prometheus/ferry-alerts.yml")
	require.NoError(t, err)
	var exprs []string
	lines := strings.Split(string(raw), "\n")
	for i := 0; i < len(lines); i++ {
		rest, ok := strings.CutPrefix(strings.TrimSpace(lines[i]), "expr:")
		if !ok {
			continue
		}
		rest = strings.TrimSpace(rest)
		if rest != "|" {
			exprs = append(exprs, rest)
			continue
		}
		indent := len(lines[i]) - len(strings.TrimLeft(lines[i], " "))
		var block []string
		for i+1 < len(lines) && len(lines[i+1])-len(strings.TrimLeft(lines[i+1], " ")) > indent {
			i++
			block = append(block, strings.TrimSpace(lines[i]))
		}
		exprs = append(exprs, strings.Join(block, " "))
	}
	require.Len(t, exprs, 9, "every alert rule's expression is read")
	return exprs
}

// TestDashboardQueriesOnlyServedMetrics: every metric the Grafana
// dashboard and the alert rules (deploy/prometheus) query is in what
// /metrics serves once a relay, a consumer,
// RunTx and AwaitSettled have run with their metrics registered, with
// every label the query groups by (sum by (feed, ...)) or matches on (a
// label no metric has groups nothing: the panels drew one line for all).
func TestDashboardQueriesOnlyServedMetrics(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	drv := newPG(t)
	reg := prometheus.NewRegistry()
	prom := ferryprom.New(reg)

	client, err := ferry.NewClient(drv, nil)
	require.NoError(t, err)
	relay, err := ferry.NewRelay(drv, &memsink.Sink{}, &ferry.RelayConfig{PollInterval: 20 * time.Millisecond, LeaseTTL: 2 * time.Second, Hooks: []ferryhook.Hook{prom}})
	require.NoError(t, err)
	run(t, relay)
	c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "dash", PollInterval: 20 * time.Millisecond, Hooks: []ferryhook.Hook{prom}})
	require.NoError(t, err)
	c.HandleAll(func(context.Context, pgx.Tx, *ferry.Event) error { return nil })
	startConsumer(t, c)
	reruns := 0
	id, err := ferry.RunTx(ctx, drv, &ferry.TxOptions{RetryBase: time.Millisecond, Hooks: []ferryhook.Hook{prom}}, func(ctx context.Context, tx pgx.Tx) (uuid.UUID, error) {
		if reruns++; reruns == 1 {
			return uuid.Nil, ferry.RerunTx(errors.New("once"))
		}
		ev := &ferry.Event{Topic: "orders", Key: "k", Type: "T"}
		if err := client.EmitTx(ctx, tx, ev); err != nil {
			return uuid.Nil, err
		}
		return ev.ID, nil
	})
	require.NoError(t, err)
	_, err = c.Ingest(ctx, []*ferry.Event{{ID: id, Topic: "orders", Key: "k", Type: "T", Seq: 1, CreatedAt: time.Now()}})
	require.NoError(t, err)
	st, err := ferry.AwaitSettled(ctx, drv, "dash", []uuid.UUID{id}, 10*time.Second, prom)
	require.NoError(t, err)
	require.True(t, st.Done())

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	name := regexp.MustCompile(`ferry_[a-z_]+`)
	by := regexp.MustCompile(`(?:by|on) \(([^)]*)\)`)
	// Labels Prometheus adds to every scraped series.
	target := map[string]bool{"instance": true, "job": true}
	matchers := regexp.MustCompile(`(ferry_[a-z_]+)\{([^}]*)\}`)
	// The inbox gauges appear once the consumer's first refresh ran.
	var missing []string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		served := scrape(t, srv.URL)
		missing = missing[:0]
		for _, expr := range append(dashboardQueries(t), alertQueries(t)...) {
			metrics := name.FindAllString(expr, -1)
			for _, m := range metrics {
				if served[m] == nil {
					missing = append(missing, m)
				}
			}
			for _, g := range by.FindAllStringSubmatch(expr, -1) {
				for _, l := range strings.Split(g[1], ",") {
					for _, m := range metrics {
						if l = strings.TrimSpace(l); served[m] != nil && !served[m][l] && !target[l] {
							missing = append(missing, m+" by "+l)
						}
					}
				}
			}
			for _, g := range matchers.FindAllStringSubmatch(expr, -1) {
				for _, kv := range strings.Split(g[2], ",") {
					if l, _, _ := strings.Cut(strings.TrimSpace(kv), "="); served[g[1]] != nil && !served[g[1]][strings.TrimRight(l, "!~")] {
						missing = append(missing, g[1]+"{"+l+"}")
					}
				}
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
	}
	require.Empty(t, missing, "the dashboard or the alert rules query metrics, or labels of them, that /metrics does not serve")
}

// scrape returns the samples url serves: each metric's name, with the
// names of its labels ("le" on a histogram's buckets).
func scrape(t *testing.T, url string) map[string]map[string]bool {
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	served := map[string]map[string]bool{}
	label := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.IndexAny(line, "{ ")
		if i <= 0 {
			continue
		}
		labels := served[line[:i]]
		if labels == nil {
			labels = map[string]bool{}
			served[line[:i]] = labels
		}
		if line[i] == '{' {
			for _, m := range label.FindAllStringSubmatch(line[i:strings.LastIndexByte(line, '}')], -1) {
				labels[m[1]] = true
			}
		}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return served
}
