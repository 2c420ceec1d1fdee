package main

import (
	"bytes"
	"context"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver/ferrymysql/mysqltest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
)

func TestBenchWithoutModePointsToTheSideBySideBench(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Equal(t, 2, run(context.Background(), []string{"bench", "--quick"}, &out, &errOut))
	require.Contains(t, errOut.String(), "ferry bench drain | latency | consume | settle")
	require.Contains(t, errOut.String(), "cd bench && go run ./cmd/ferry-bench --quick")
}

// TestBenchConsumeAndSettle runs ferry bench consume (every mode) and
// settle, small, on PostgreSQL and on MariaDB: each mode checks that its
// projection counted every event exactly once, and settle that every
// event settled.
func TestBenchConsumeAndSettle(t *testing.T) {
	for _, c := range []struct {
		name string
		url  func(t *testing.T) string
	}{
		{"postgres", func(t *testing.T) string { ferrypgtest.Pool(t); return ferrypgtest.URL() }},
		{"mysql", func(t *testing.T) string { mysqltest.Admin(t); return mysqltest.URL() }},
	} {
		t.Run(c.name, func(t *testing.T) {
			url := c.url(t)
			var out, errOut bytes.Buffer
			code := run(context.Background(), []string{"bench", "consume", "--database-url", url, "--events", "400", "--keys", "50", "--workers", "4",
				"--consumer-batch", "8"}, &out, &errOut)
			require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out.String(), errOut.String())
			for _, line := range []string{"ceiling, 4 clients, 1 upsert/tx:", "consume, one event per transaction:", "consume, batches of up to 8:",
				"consume, batches of 8, SavepointEach:", "consume, batches of 8, HandleBatch:"} {
				require.Regexp(t, regexp.QuoteMeta(line)+` +\d+ events/s \(400 in `, out.String())
			}
			out.Reset()
			code = run(context.Background(), []string{"bench", "settle", "--database-url", url, "--events", "40", "--rate", "200", "--workers", "4"}, &out, &errOut)
			require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out.String(), errOut.String())
			require.Regexp(t, `settle: 40 events at 200/s; handler commit -> AwaitSettled returns: p50 `, out.String())
		})
	}
}

// TestBenchE2EBreaksTheTimeDownByStage runs ferry bench e2e briefly: every
// event is applied, and the breakdown names each stage, every event
// having passed all of them.
func TestBenchE2EBreaksTheTimeDownByStage(t *testing.T) {
	ferrypgtest.Pool(t)
	testNATS(t)
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"bench", "e2e", "--database-url", ferrypgtest.URL(), "--nats-url", natsURL(),
		"--rate", "200", "--duration", "1s", "--keys", "20", "--workers", "2"}, &out, &errOut)
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out.String(), errOut.String())
	require.Contains(t, out.String(), "200 of 200 applied")
	require.Contains(t, out.String(), "by stage (200 events that passed every stage):")
	for _, stage := range []string{"commit -> relay read:", "read -> JetStream ack:", "ack -> source received:", "received -> ingested:",
		"ingested -> handler:", "handler -> applied:"} {
		require.Regexp(t, regexp.QuoteMeta(stage)+` +p50 \S+  p90 \S+  p99 \S+  max \S+\n`, out.String())
	}
}

func TestPayloadOrderReadsBackTheNumber(t *testing.T) {
	for _, i := range []int{0, 7, 1234567} {
		got, ok := payloadOrder(payload(i))
		require.True(t, ok, "payload %d", i)
		require.Equal(t, i, got)
	}
	for _, p := range []string{``, `{"order":}`, `{"order":12`, `{"amount":1}`} {
		_, ok := payloadOrder([]byte(p))
		require.False(t, ok, "%q", p)
	}
}
