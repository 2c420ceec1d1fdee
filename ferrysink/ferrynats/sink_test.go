package ferrynats_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/tcpproxy"
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/ferry-dev/ferry/ferrysink/ferrysinktest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	nc := testConn(t)
	js := testJetStream(t)
	const unrouted = "unrouted"

	ferrysinktest.Exercise(t, ferrysinktest.Harness{
		Features: ferrysinktest.Features{
			BrokerDedup:     true,
			MaxPayloadBytes: int(nc.MaxPayload()),
			UnroutableTopic: unrouted,
		},
		New: func(t *testing.T) (ferrysink.Sink, ferrysinktest.ReadFunc) {
			stream, prefix := testNames(t)
			sink, err := ferrynats.New(testContext(t), nc, &ferrynats.Config{
				Stream:        stream,
				SubjectPrefix: prefix,
				CreateStream:  true,
				// The prefix mapping, except for one topic sent where no
				// stream listens.
				Subject: func(ev *ferryevent.Event) string {
					if ev.Topic == unrouted {
						return "ferrytest-unrouted." + prefix + ".x"
					}
					return prefix + "." + ev.Topic
				},
			})
			require.NoError(t, err)
			return sink, func(ctx context.Context) ([]ferrysinktest.Stored, error) {
				return readStream(ctx, js, stream)
			}
		},
		// The sink's own connection goes through a proxy whose
		// connections are cut for a moment: the client reconnects.
		NewFaulty: func(t *testing.T) (ferrysink.Sink, ferrysinktest.ReadFunc, func()) {
			stream, prefix := testNames(t)
			proxy, err := tcpproxy.Start(testConn(t).ConnectedAddr())
			require.NoError(t, err)
			t.Cleanup(func() { _ = proxy.Close() })
			pc, err := nats.Connect("nats://"+proxy.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
				nats.ReconnectJitter(0, 0), nats.Timeout(2*time.Second))
			require.NoError(t, err)
			t.Cleanup(pc.Close)
			sink, err := ferrynats.New(testContext(t), pc, &ferrynats.Config{Stream: stream, SubjectPrefix: prefix, CreateStream: true,
				AckTimeout: 2 * time.Second})
			require.NoError(t, err)
			return sink, func(ctx context.Context) ([]ferrysinktest.Stored, error) {
				return readStream(ctx, js, stream)
			}, func() { proxy.Outage(200 * time.Millisecond) }
		},
	})
}

// TestSourceConformance runs the source suite on JetStream.
func TestSourceConformance(t *testing.T) {
	t.Parallel()
	js := testJetStream(t)
	ferrysinktest.ExerciseSource(t, ferrysinktest.SourceHarness{
		New: func(t *testing.T) (func(context.Context, []*ferryevent.Event) error, func(t *testing.T) ferrysink.Source) {
			stream, prefix := testNames(t)
			sink, err := ferrynats.New(testContext(t), testConn(t), &ferrynats.Config{Stream: stream, SubjectPrefix: prefix, CreateStream: true})
			require.NoError(t, err)
			t.Cleanup(func() { _ = sink.Close(context.Background()) })
			publish := func(ctx context.Context, events []*ferryevent.Event) error {
				return errors.Join(sink.Publish(ctx, events)...)
			}
			return publish, func(t *testing.T) ferrysink.Source {
				src, err := ferrynats.NewSource(testContext(t), js, &ferrynats.SourceConfig{Stream: stream, SubjectPrefix: prefix,
					Durable: "group", MaxWait: 200 * time.Millisecond, RetryBase: 20 * time.Millisecond})
				require.NoError(t, err)
				return src
			}
		},
		System: "nats",
	})
}

// newSink creates a stream capturing prefix.> with the defaults of New,
// and a sink publishing to it.
func newSink(t *testing.T, cfg *ferrynats.Config) (*ferrynats.Sink, string) {
	t.Helper()
	stream, prefix := testNames(t)
	c := *cfg.WithDefaults()
	c.Stream, c.SubjectPrefix, c.CreateStream = stream, prefix, true
	sink, err := ferrynats.New(testContext(t), testConn(t), &c)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sink.Close(context.Background())) })
	return sink, stream
}

// event builds a prepared event. topic and key are set after Prepare, so
// that tests can send what Emit refuses, as an outbox row written by an
// earlier version of Ferry may hold.
func event(topic, key string) *ferryevent.Event {
	ev := &ferryevent.Event{Topic: "orders", Key: "k", Type: "OrderPlaced", Payload: []byte(`{}`), ContentType: "application/json"}
	if err := ferryevent.Prepare(ev, 0, 0, time.Now()); err != nil {
		panic(err)
	}
	ev.Topic, ev.Key = topic, key
	return ev
}

func TestNewMissingStream(t *testing.T) {
	t.Parallel()
	stream, prefix := testNames(t)

	_, err := ferrynats.New(testContext(t), testConn(t), &ferrynats.Config{Stream: stream, SubjectPrefix: prefix})
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
	msg := err.Error()
	require.Contains(t, msg, `stream "`+stream+`" not found`)
	require.Contains(t, msg, "create stream "+stream+" with subjects \""+prefix+".>\"")
	require.Contains(t, msg, "or set Config.CreateStream")
}

func TestNewCreatesStream(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	stream, prefix := testNames(t)

	sink, err := ferrynats.New(ctx, testConn(t), &ferrynats.Config{Stream: stream, SubjectPrefix: prefix, CreateStream: true})
	require.NoError(t, err)
	require.NoError(t, sink.Close(ctx))

	info, err := testJetStream(t).Stream(ctx, stream)
	require.NoError(t, err)
	cfg := info.CachedInfo().Config
	require.Equal(t, []string{prefix + ".>"}, cfg.Subjects)
	require.Equal(t, jetstream.FileStorage, cfg.Storage)
	require.Equal(t, ferrynats.DefaultDuplicateWindow, cfg.Duplicates)

	// A second sink finds the stream and leaves it alone.
	sink, err = ferrynats.New(ctx, testConn(t), &ferrynats.Config{Stream: stream, SubjectPrefix: prefix, CreateStream: true})
	require.NoError(t, err)
	require.NoError(t, sink.Close(ctx))
}

func TestNewStreamConfigOverride(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	stream, prefix := testNames(t)

	sink, err := ferrynats.New(ctx, testConn(t), &ferrynats.Config{
		Stream:        stream,
		SubjectPrefix: prefix,
		CreateStream:  true,
		StreamConfig:  &jetstream.StreamConfig{Storage: jetstream.MemoryStorage, Subjects: []string{prefix + ".*.>"}, Duplicates: time.Hour},
	})
	require.Nil(t, sink)
	// The override's subjects miss single-token topics: New says so.
	require.ErrorContains(t, err, "does not capture the subjects")

	info, err := testJetStream(t).Stream(ctx, stream)
	require.NoError(t, err)
	require.Equal(t, jetstream.MemoryStorage, info.CachedInfo().Config.Storage)
	require.Equal(t, time.Hour, info.CachedInfo().Config.Duplicates)
}

func TestNewStreamDoesNotCapturePrefix(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	stream, prefix := testNames(t)
	_, err := testJetStream(t).CreateStream(ctx, jetstream.StreamConfig{
		Name:     stream,
		Subjects: []string{prefix + ".orders", prefix + ".payments.*"},
		Storage:  jetstream.MemoryStorage,
	})
	require.NoError(t, err)

	for _, create := range []bool{false, true} {
		_, err = ferrynats.New(ctx, testConn(t), &ferrynats.Config{Stream: stream, SubjectPrefix: prefix, CreateStream: create})
		require.Error(t, err)
		msg := err.Error()
		require.Contains(t, msg, `stream "`+stream+`" does not capture the subjects "`+prefix+`.>"`)
		require.Contains(t, msg, `its subjects: "`+prefix+`.orders", "`+prefix+`.payments.*"`)
		require.Contains(t, msg, "Config.SubjectPrefix")
	}
}

func TestNewAcceptsWiderStream(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	stream, prefix := testNames(t)
	// The stream captures prefix.events.> through a wildcard, plus more.
	_, err := testJetStream(t).CreateStream(ctx, jetstream.StreamConfig{
		Name:     stream,
		Subjects: []string{prefix + ".*.>"},
		Storage:  jetstream.MemoryStorage,
	})
	require.NoError(t, err)

	sink, err := ferrynats.New(ctx, testConn(t), &ferrynats.Config{Stream: stream, SubjectPrefix: prefix + ".events"})
	require.NoError(t, err)
	require.NoError(t, sink.Close(ctx))
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	nc := testConn(t)
	for _, tc := range []struct {
		name  string
		cfg   ferrynats.Config
		field string
	}{
		{"prefix with space", ferrynats.Config{SubjectPrefix: "my events"}, "Config.SubjectPrefix"},
		{"prefix with wildcard", ferrynats.Config{SubjectPrefix: "ferry.*"}, "Config.SubjectPrefix"},
		{"prefix with trailing dot", ferrynats.Config{SubjectPrefix: "ferry."}, "Config.SubjectPrefix"},
		{"stream with dot", ferrynats.Config{Stream: "FERRY.EVENTS"}, "Config.Stream"},
		{"negative in-flight", ferrynats.Config{MaxInFlight: -1}, "Config.MaxInFlight"},
		{"negative timeout", ferrynats.Config{AckTimeout: -time.Second}, "Config.AckTimeout"},
		{"stream config name", ferrynats.Config{Stream: "A", StreamConfig: &jetstream.StreamConfig{Name: "B"}}, "Config.StreamConfig.Name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ferrynats.New(testContext(t), nc, &tc.cfg)
			require.ErrorContains(t, err, tc.field)
		})
	}

	_, err := ferrynats.New(testContext(t), nil, nil)
	require.ErrorContains(t, err, "nats.Connect")
}

func TestPublishStreamMaxMsgSize(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	stream, prefix := testNames(t)
	sink, err := ferrynats.New(ctx, testConn(t), &ferrynats.Config{
		Stream:        stream,
		SubjectPrefix: prefix,
		CreateStream:  true,
		StreamConfig:  &jetstream.StreamConfig{Storage: jetstream.MemoryStorage, MaxMsgSize: 4096},
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sink.Close(context.Background())) })

	big := event("files", "file-2")
	big.Payload = bytes.Repeat([]byte{'x'}, 8192) // under max_payload, over the stream's limit
	errs := sink.Publish(ctx, []*ferryevent.Event{event("files", "file-1"), big, event("files", "file-3")})
	require.Len(t, errs, 3)
	require.NoError(t, errs[0])
	require.True(t, ferrysink.IsPermanent(errs[1]), "got %v", errs[1])
	require.ErrorContains(t, errs[1], "max_msg_size")
	require.ErrorIs(t, errs[1], jetstream.ErrStreamMessageExceedsMaximum)
	require.NoError(t, errs[2])
}

func TestPublishSubjectOfAnotherStream(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	js := testJetStream(t)
	other, otherPrefix := testNames(t)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: other, Subjects: []string{otherPrefix + ".>"}, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)

	stream, prefix := testNames(t)
	sink, err := ferrynats.New(ctx, testConn(t), &ferrynats.Config{
		Stream:        stream,
		SubjectPrefix: prefix,
		CreateStream:  true,
		Subject: func(ev *ferryevent.Event) string {
			if ev.Topic == "elsewhere" {
				return otherPrefix + ".x"
			}
			return prefix + "." + ev.Topic
		},
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sink.Close(context.Background())) })

	errs := sink.Publish(ctx, []*ferryevent.Event{event("orders", "order-1"), event("elsewhere", "order-2")})
	require.NoError(t, errs[0])
	require.True(t, ferrysink.IsPermanent(errs[1]), "got %v", errs[1])
	require.ErrorContains(t, errs[1], "captured by another stream than \""+stream+"\"")

	info, err := js.Stream(ctx, other)
	require.NoError(t, err)
	require.Zero(t, info.CachedInfo().State.Msgs, "Nats-Expected-Stream must keep the event out of the other stream")
}

func TestPublishRefusesWhatNATSCannotCarry(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	sink, stream := newSink(t, nil)

	badHeader := event("orders", "order-1")
	badHeader.Headers = map[string]string{"x trace id": "1"}
	badSubject := event("orders.*", "order-2")
	emptyToken := event("orders..v2", "order-3")
	good := event("orders", "order-4")

	errs := sink.Publish(ctx, []*ferryevent.Event{badHeader, badSubject, emptyToken, good})
	require.Len(t, errs, 4)
	for i, want := range []string{`header name "x trace id"`, "wildcard token", "empty token"} {
		require.True(t, ferrysink.IsPermanent(errs[i]), "event %d: %v", i, errs[i])
		require.ErrorContains(t, errs[i], want)
	}
	require.NoError(t, errs[3])

	stored, err := readStream(ctx, testJetStream(t), stream)
	require.NoError(t, err)
	require.Len(t, stored, 1)
	require.Equal(t, good.ID, stored[0].Event.ID)
}

func TestPublishReservedHeaders(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	sink, stream := newSink(t, nil)

	// Emit refuses these names (ferryevent.ReservedHeader); an event that
	// holds one all the same (an outbox row written by an earlier version)
	// is refused by the sink too, rather than sent without the header.
	var clashing []*ferryevent.Event
	for _, name := range []string{"nats-msg-id", "Nats-Expected-Stream", "CE-ID", "ce-type", "content-type"} {
		ev := event("orders", "order-0")
		ev.Headers = map[string]string{name: "not Ferry's", "X-Custom": "kept"}
		clashing = append(clashing, ev)
	}
	for i, err := range sink.Publish(ctx, clashing) {
		require.True(t, ferrysink.IsPermanent(err), "header %v: %v", clashing[i].Headers, err)
		require.ErrorContains(t, err, "named like one Ferry writes itself")
	}

	ev := event("orders", "order-1")
	ev.Headers = map[string]string{
		"ce-traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"X-Custom":       "kept",
	}
	errs := sink.Publish(ctx, []*ferryevent.Event{ev})
	require.NoError(t, errs[0])

	s, err := testJetStream(t).Stream(ctx, stream)
	require.NoError(t, err)
	raw, err := s.GetMsg(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, nats.Header{
		"Nats-Msg-Id":          {ev.ID.String()},
		"Nats-Expected-Stream": {stream},
		"ce-specversion":       {"1.0"},
		"ce-id":                {ev.ID.String()},
		"ce-source":            {ev.Source},
		"ce-type":              {ev.Type},
		"ce-subject":           {ev.Key},
		"ce-time":              {ev.CreatedAt.UTC().Format(time.RFC3339Nano)},
		"ce-datacontenttype":   {"application/json"},
		"ce-ferrytopic":        {"orders"},
		"Content-Type":         {"application/json"},
		"ce-traceparent":       {ev.Headers["ce-traceparent"]},
		"X-Custom":             {"kept"},
	}, withoutServerHeaders(raw.Header))

	got, err := ferrynats.Decode(&nats.Msg{Header: raw.Header, Data: raw.Data})
	require.NoError(t, err)
	require.Equal(t, ev.ID, got.ID)
	require.Equal(t, map[string]string{"ce-traceparent": ev.Headers["ce-traceparent"], "X-Custom": "kept"}, got.Headers)
}

// withoutServerHeaders drops headers a server adds when a message is read
// back, which newer servers do on direct gets.
func withoutServerHeaders(h nats.Header) nats.Header {
	out := make(nats.Header, len(h))
	for k, v := range h {
		switch k {
		case "Nats-Stream", "Nats-Sequence", "Nats-Time-Stamp", "Nats-Subject", "Nats-Last-Sequence", "Nats-Num-Pending":
			continue
		}
		out[k] = v
	}
	return out
}

func TestPublishAfterClose(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	sink, _ := newSink(t, nil)
	require.NoError(t, sink.Close(ctx))

	errs := sink.Publish(ctx, []*ferryevent.Event{event("orders", "order-1")})
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], ferrynats.ErrClosed)
	require.False(t, ferrysink.IsPermanent(errs[0]))
}

func TestPublishWindowSmallerThanBatch(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	sink, stream := newSink(t, &ferrynats.Config{MaxInFlight: 3})

	batch := make([]*ferryevent.Event, 100)
	for i := range batch {
		batch[i] = event("orders", "order-"+string(rune('a'+i%26))+strings.Repeat("x", i/26))
	}
	for i, err := range sink.Publish(ctx, batch) {
		require.NoError(t, err, "event %d", i)
	}
	stored, err := readStream(ctx, testJetStream(t), stream)
	require.NoError(t, err)
	require.Len(t, stored, len(batch))
}

func TestPublishCountsDuplicates(t *testing.T) {
	t.Parallel()
	sink, _ := newSink(t, nil)
	ctx := testContext(t)
	a, b := event("orders", "k1"), event("orders", "k2")
	for _, err := range sink.Publish(ctx, []*ferryevent.Event{a, b}) {
		require.NoError(t, err)
	}
	require.Zero(t, sink.Duplicates())
	for _, err := range sink.Publish(ctx, []*ferryevent.Event{a}) {
		require.NoError(t, err, "a republished event is acknowledged")
	}
	require.EqualValues(t, 1, sink.Duplicates(), "and counted as a duplicate")
}
