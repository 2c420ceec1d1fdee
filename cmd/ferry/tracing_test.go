package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferryshared/testenv"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryotel/ferryoteltest"
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/ferry-dev/ferry/ferrysink/ferrykafka"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/ferry-dev/ferry/ferrysink/ferryrabbit"
	"github.com/ferry-dev/ferry/ferrysink/ferrywebhook"
)

var quietLog = slog.New(slog.DiscardHandler)

// closeAtEnd closes sink when the test ends.
func closeAtEnd(t *testing.T, sink ferrysink.Sink) {
	t.Cleanup(func() { _ = sink.Close(context.Background()) })
}

// TestOneTraceThroughEverySink: a request span around EmitTx, then the
// relay, each broker with its source (or a webhook receiver), the inbox and
// the handler, give one trace (ferryoteltest.Exercise).
func TestOneTraceThroughEverySink(t *testing.T) {
	t.Parallel()
	for name, p := range map[string]ferryoteltest.Pipeline{
		"JetStream": {System: "nats", Wire: wireJetStream},
		"Kafka":     {System: "kafka", Wire: wireKafka},
		"RabbitMQ":  {System: "rabbitmq", Wire: wireRabbit},
		"Webhook":   {System: "webhook", Wire: wireWebhook},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ferryoteltest.Exercise(t, p)
		})
	}
}

func wireJetStream(t *testing.T, ctx context.Context, _ *ferry.Consumer[pgx.Tx]) (ferrysink.Sink, ferrysink.Source) {
	id := fmt.Sprintf("FERRY_TRACE_%d", rand.Int64())
	js, err := jetstream.New(testNATS(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), id) })
	sink, err := ferrynats.New(ctx, testNATS(t), &ferrynats.Config{Stream: id, SubjectPrefix: strings.ToLower(id), CreateStream: true})
	require.NoError(t, err)
	closeAtEnd(t, sink)
	source, err := ferrynats.NewSource(ctx, js, &ferrynats.SourceConfig{Stream: id, Durable: "billing", SubjectPrefix: strings.ToLower(id), Logger: quietLog})
	require.NoError(t, err)
	return sink, source
}

func wireKafka(t *testing.T, ctx context.Context, _ *ferry.Consumer[pgx.Tx]) (ferrysink.Sink, ferrysink.Source) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	sink, err := ferrykafka.New(ctx, &ferrykafka.Config{Brokers: c.ListenAddrs()})
	require.NoError(t, err)
	closeAtEnd(t, sink)
	source, err := ferrykafka.NewSource(ctx, &ferrykafka.SourceConfig{Brokers: c.ListenAddrs(), Group: "billing", Topics: []string{"orders"}, Logger: quietLog})
	require.NoError(t, err)
	return sink, source
}

func wireRabbit(t *testing.T, ctx context.Context, _ *ferry.Consumer[pgx.Tx]) (ferrysink.Sink, ferrysink.Source) {
	conn, err := amqp.Dial(rabbitURL())
	if err != nil {
		testenv.Unavailable(t, "RabbitMQ", "FERRY_TEST_RABBITMQ_URL", err)
	}
	name := fmt.Sprintf("ferry-trace-%d", rand.Int64())
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(name, false, false, false)
			_ = ch.ExchangeDelete(name, false, false)
		}
		_ = conn.Close()
	})
	sink, err := ferryrabbit.New(ctx, &ferryrabbit.Config{URL: rabbitURL(), Exchange: name, DeclareExchange: true, Logger: quietLog})
	require.NoError(t, err)
	closeAtEnd(t, sink)
	source, err := ferryrabbit.NewSource(ctx, &ferryrabbit.SourceConfig{URL: rabbitURL(), Queue: name, DeclareQueue: true,
		Exchange: name, BindingKeys: []string{"#"}, Logger: quietLog})
	require.NoError(t, err)
	return sink, source
}

// wireWebhook: the sink posts to a receiver whose Handler ingests each
// event into the consumer's inbox.
func wireWebhook(t *testing.T, _ context.Context, c *ferry.Consumer[pgx.Tx]) (ferrysink.Sink, ferrysink.Source) {
	secret := ferrywebhook.NewSecret()
	srv := httptest.NewServer(ferrywebhook.Handler([]string{secret}, func(ctx context.Context, ev ferry.Event) error {
		_, err := c.Ingest(ctx, []*ferryevent.Event{&ev})
		return err
	}))
	t.Cleanup(srv.Close)
	sink, err := ferrywebhook.New(&ferrywebhook.Config{URL: srv.URL, Secrets: []string{secret}})
	require.NoError(t, err)
	closeAtEnd(t, sink)
	return sink, nil
}

// otlpReceiver is an in-process OTLP/HTTP trace receiver: it keeps the
// spans it is sent, by name, with the service.name of their resource.
type otlpReceiver struct {
	srv *httptest.Server
	mu  sync.Mutex
	got map[string]string // span name → service.name
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	rc := &otlpReceiver{got: map[string]string{}}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" {
			http.NotFound(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err == nil && r.Header.Get("Content-Encoding") == "gzip" {
			var zr *gzip.Reader
			if zr, err = gzip.NewReader(bytes.NewReader(body)); err == nil {
				body, err = io.ReadAll(zr)
			}
		}
		var req coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		for _, rs := range req.ResourceSpans {
			service := ""
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					service = kv.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					rc.got[s.Name] = service
				}
			}
		}
		rc.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *otlpReceiver) service(span string) (string, bool) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	s, ok := rc.got[span]
	return s, ok
}

// TestRelayExportsTracesOverOTLP: `ferry relay` with the standard
// OTEL_EXPORTER_OTLP_ENDPOINT exports a send span for each event it
// publishes to an OTLP/HTTP receiver, under the service name it is given;
// a gRPC protocol is refused with what to set instead.
func TestRelayExportsTracesOverOTLP(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rc := newOTLPReceiver(t)
	f.env = []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rc.srv.URL, "OTEL_SERVICE_NAME=ferry-under-test", "OTEL_BSP_SCHEDULE_DELAY=100"}
	relay := f.startRelay("otlp")
	defer relay.stop(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, f.client.Emit(ctx, &ferry.Event{Topic: "orders", Key: "order-1", Type: "OrderPlaced"}))
	require.Eventually(t, func() bool {
		s, ok := rc.service("send orders")
		return ok && s == "ferry-under-test"
	}, 30*time.Second, 50*time.Millisecond, "the relay's send span must reach the OTLP receiver")

	cmd := exec.Command(ferryBin, "status", "--database-url", ferrypgtest.URL())
	cmd.Env = append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT="+rc.srv.URL, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, 2, exit.ExitCode())
	require.Contains(t, string(out), "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: ferry exports traces over OTLP/HTTP only; set it to http/protobuf")
}

// TestRelayLogsCarryTraceIDs: with OTEL_EXPORTER_OTLP_ENDPOINT set, the
// records `ferry relay` logs about an event carry the event's trace: the
// WARN record of an event it dead-lettered (too large for the stream) has
// the trace_id and span_id of the span that emitted it.
func TestRelayLogsCarryTraceIDs(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rc := newOTLPReceiver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := f.js.CreateStream(ctx, jetstream.StreamConfig{Name: f.stream, Subjects: []string{f.prefix + ".>"}, Storage: jetstream.MemoryStorage, MaxMsgSize: 512})
	require.NoError(t, err)
	f.sinkArgs = []string{"--nats-url", natsURL(), "--stream", f.stream, "--subject-prefix", f.prefix}
	f.env = []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rc.srv.URL, "OTEL_BSP_SCHEDULE_DELAY=100"}
	relay := f.startRelay("traced-logs")
	defer relay.stop(t)

	const traceID, spanID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	ev := &ferry.Event{Topic: "orders", Key: "order-1", Type: "OrderPlaced", Payload: []byte(`"` + strings.Repeat("x", 2048) + `"`),
		Headers: map[string]string{"traceparent": "00-" + traceID + "-" + spanID + "-01"}}
	require.NoError(t, f.client.Emit(ctx, ev))
	var dead map[string]any
	require.Eventually(t, func() bool {
		for _, l := range relay.logs.all() {
			var rec map[string]any
			if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == "ferry: event dead-lettered" {
				dead = rec
				return true
			}
		}
		return false
	}, time.Minute, 50*time.Millisecond, "the relay did not dead-letter the event larger than the stream's max_msg_size")
	require.Equal(t, ev.ID.String(), dead["event_id"])
	require.Equal(t, "WARN", dead["level"])
	require.Equal(t, traceID, dead["trace_id"], "the record carries the trace of the span that emitted the event")
	require.Equal(t, spanID, dead["span_id"])
}
