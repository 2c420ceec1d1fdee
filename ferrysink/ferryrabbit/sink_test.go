package ferryrabbit_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/tcpproxy"
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/ferry-dev/ferry/ferrysink/ferryrabbit"
	"github.com/ferry-dev/ferry/ferrysink/ferrysinktest"
)

// The conformance harness binds each test's queue with "routed.#" and maps
// topic T to routing key "routed.T", except unroutedTopic, which goes to
// "unrouted.T": no queue is bound for it.
const (
	unroutedTopic = "unrouted"
	// testMaxBytes is the message size limit the harness sets, small enough
	// for the suite to build a payload over it.
	testMaxBytes = 1 << 20
)

func routingKey(ev *ferryevent.Event) string {
	if ev.Topic == unroutedTopic {
		return "unrouted." + ev.Topic
	}
	return "routed." + ev.Topic
}

// quiet is a logger for the sinks and sources under test.
var quiet = slog.New(slog.DiscardHandler)

func TestConformance(t *testing.T) {
	t.Parallel()
	url := testURL(t)

	// newSink returns a sink on a fresh exchange and queue, publishing
	// through url, and the queue's reader.
	newSink := func(t *testing.T, url string) (ferrysink.Sink, ferrysinktest.ReadFunc) {
		top := newTopology(t, nil, "routed.#")
		sink, err := ferryrabbit.New(testContext(t), &ferryrabbit.Config{
			URL:             url,
			Exchange:        top.exchange,
			DeclareExchange: true,
			RoutingKey:      routingKey,
			MaxMessageBytes: testMaxBytes,
			ConfirmTimeout:  5 * time.Second,
			DialTimeout:     2 * time.Second,
			Logger:          quiet,
		})
		require.NoError(t, err)
		r := &reader{tb: t, queue: top.queue}
		return sink, r.read
	}

	ferrysinktest.Exercise(t, ferrysinktest.Harness{
		Features: ferrysinktest.Features{
			MaxPayloadBytes: testMaxBytes,
			UnroutableTopic: unroutedTopic,
		},
		New: func(t *testing.T) (ferrysink.Sink, ferrysinktest.ReadFunc) {
			return newSink(t, url)
		},
		// The sink's connection goes through a proxy that cuts every
		// connection and refuses new ones for a moment.
		NewFaulty: func(t *testing.T) (ferrysink.Sink, ferrysinktest.ReadFunc, func()) {
			proxy, err := tcpproxy.Start(brokerAddr(t))
			require.NoError(t, err)
			t.Cleanup(func() { _ = proxy.Close() })
			sink, read := newSink(t, viaProxy(t, proxy.Addr()))
			return sink, read, func() { proxy.Outage(200 * time.Millisecond) }
		},
	})
}

// newSink declares a fresh exchange and queue bound with "#", and returns a
// sink publishing to the exchange and a reader of the queue.
func newSink(t *testing.T, cfg ferryrabbit.Config) (*ferryrabbit.Sink, *reader, topology) {
	t.Helper()
	top := newTopology(t, nil, "#")
	cfg.Exchange = top.exchange
	if cfg.URL == "" {
		cfg.URL = testURL(t)
	}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	sink, err := ferryrabbit.New(testContext(t), &cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sink.Close(context.Background())) })
	return sink, &reader{tb: t, queue: top.queue}, top
}

// event builds a prepared event. topic and key are set after Prepare, so
// that tests can send what Emit refuses, as an outbox row written by an
// earlier version of Ferry may hold.
func event(topic, key string) *ferryevent.Event {
	ev := &ferryevent.Event{Topic: "orders", Key: "k", Type: "OrderPlaced", Source: "ferryrabbit-test", Payload: []byte(`{}`), ContentType: "application/json"}
	if err := ferryevent.Prepare(ev, 0, 0, time.Now()); err != nil {
		panic(err)
	}
	ev.Topic, ev.Key = topic, key
	return ev
}

func requirePermanent(t *testing.T, err error, reason string) {
	t.Helper()
	require.Error(t, err)
	var pe *ferrysink.PermanentError
	require.ErrorAs(t, err, &pe, "want a ferrysink.PermanentError, got %T: %v", err, err)
	require.Contains(t, pe.Reason, reason)
}

func TestPublishUnroutableIsPermanent(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	top := newTopology(t, nil, "orders.#")
	sink, err := ferryrabbit.New(ctx, &ferryrabbit.Config{URL: testURL(t), Exchange: top.exchange, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sink.Close(context.Background())) })

	// Unroutable events between routed ones, in one call and over calls:
	// each return must be matched to its own event.
	for range 3 {
		batch := []*ferryevent.Event{event("orders.placed", "a"), event("payments", "b"), event("orders.paid", "c"), event("refunds", "d")}
		errs := sink.Publish(ctx, batch)
		require.NoError(t, errs[0])
		requirePermanent(t, errs[1], `no queue is bound for routing key "payments" on exchange "`+top.exchange+`"`)
		require.ErrorContains(t, errs[1], "NO_ROUTE")
		require.NoError(t, errs[2])
		requirePermanent(t, errs[3], `no queue is bound for routing key "refunds"`)
	}
	require.Equal(t, 6, queueDepth(t, top.queue))
}

func TestPublishMessageFormat(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	sink, r, top := newSink(t, ferryrabbit.Config{})

	ev := event("orders", "order-1")
	ev.Seq = 7
	ev.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	ev.CreatedAt = time.Date(2025, 3, 30, 1, 59, 58, 123456789, time.UTC)
	// Emit refuses headers that shadow an attribute; an event holding one
	// all the same (an outbox row of an earlier version) is refused here.
	shadowing := []*ferryevent.Event{event("orders", "order-0"), event("orders", "order-0")}
	shadowing[0].Headers = map[string]string{"cloudEvents_id": "shadow"}
	shadowing[1].Headers = map[string]string{"CloudEvents:Type": "shadow"}
	for _, err := range sink.Publish(ctx, shadowing) {
		requirePermanent(t, err, "named like an attribute Ferry writes itself")
	}
	for _, err := range sink.Publish(ctx, []*ferryevent.Event{ev}) {
		require.NoError(t, err)
	}
	stored, err := r.read(ctx)
	require.NoError(t, err)
	require.Len(t, stored, 1)
	d := r.deliveries()[0]

	require.Equal(t, top.exchange, d.Exchange)
	require.Equal(t, "orders", d.RoutingKey, "the default routing key is the topic")
	require.Equal(t, ev.ID.String(), d.MessageId)
	require.Equal(t, "application/json", d.ContentType)
	require.Equal(t, uint8(amqp.Persistent), d.DeliveryMode)
	require.Equal(t, ev.CreatedAt.Unix(), d.Timestamp.Unix())
	require.Equal(t, ev.Payload, d.Body)
	require.Equal(t, amqp.Table{
		"cloudEvents_specversion": "1.0",
		"cloudEvents_id":          ev.ID.String(),
		"cloudEvents_source":      "ferryrabbit-test",
		"cloudEvents_type":        "OrderPlaced",
		"cloudEvents_subject":     "order-1",
		"cloudEvents_time":        "2025-03-30T01:59:58.123456789Z",
		"cloudEvents_ferrytopic":  "orders",
		"cloudEvents_ferrykeyseq": "7",
		"traceparent":             ev.Headers["traceparent"],
	}, d.Headers, "attributes as cloudEvents_ headers, datacontenttype in content-type, then the user's headers")

	got := stored[0].Event
	require.Equal(t, ev.ID, got.ID)
	require.Equal(t, int64(7), got.Seq)
	require.True(t, ev.CreatedAt.Equal(got.CreatedAt))
	require.Equal(t, map[string]string{"traceparent": ev.Headers["traceparent"]}, got.Headers)
}

func TestPublishOverMaxMessageBytes(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	sink, r, _ := newSink(t, ferryrabbit.Config{MaxMessageBytes: 1000})

	big := event("files", "file-2")
	big.Payload = bytes.Repeat([]byte{'x'}, 1001)
	batch := []*ferryevent.Event{event("files", "file-1"), big, event("files", "file-3")}
	errs := sink.Publish(ctx, batch)
	require.NoError(t, errs[0])
	requirePermanent(t, errs[1], "payload too large for RabbitMQ: 1001 bytes, over the 1000-byte message size limit")
	require.NoError(t, errs[2])
	stored, err := r.read(ctx)
	require.NoError(t, err)
	require.Len(t, stored, 2)
}

func TestPublishRefusesWhatAMQPCannotCarry(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	sink, r, _ := newSink(t, ferryrabbit.Config{})

	longName := event("orders", "a")
	longName.Headers = map[string]string{strings.Repeat("h", 256): "v"}
	longType := event("orders", "b")
	longType.ContentType = "application/" + strings.Repeat("x", 250)
	bigHeaders := event("orders", "c")
	bigHeaders.Headers = map[string]string{"x-big": strings.Repeat("v", 200<<10)}
	longKey := event(strings.Repeat("t", 256), "d")
	ok := event("orders", "e")

	errs := sink.Publish(ctx, []*ferryevent.Event{longName, longType, bigHeaders, longKey, ok})
	requirePermanent(t, errs[0], "AMQP header names are at most 255 bytes")
	requirePermanent(t, errs[1], "content type is 262 bytes long")
	requirePermanent(t, errs[2], "headers too large")
	requirePermanent(t, errs[3], "AMQP routing keys are at most 255 bytes")
	require.NoError(t, errs[4])

	// The connection survived: nothing of the refused events reached it.
	for _, err := range sink.Publish(ctx, []*ferryevent.Event{event("orders", "f")}) {
		require.NoError(t, err)
	}
	stored, err := r.read(ctx)
	require.NoError(t, err)
	require.Len(t, stored, 2)
}

// TestPublishHeadersUpToFrameSize finds the largest header the sink
// accepts: the broker must take it, which shows that the sink never sends
// a content header frame larger than the connection's frame size (that
// would cost the connection).
func TestPublishHeadersUpToFrameSize(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	sink, r, _ := newSink(t, ferryrabbit.Config{})
	withHeader := func(n int) *ferryevent.Event {
		ev := event("orders", "a")
		ev.Headers = map[string]string{"x-big": strings.Repeat("v", n)}
		// A fixed time: its text (ce_time drops trailing zeros) would
		// otherwise make the properties a byte longer or shorter from one
		// event to the next, and the bound found not hold for the next.
		ev.CreatedAt = time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC)
		return ev
	}
	lo, hi := 0, 200<<10 // accepted, refused
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		err := sink.Publish(ctx, []*ferryevent.Event{withHeader(mid)})[0]
		if err != nil {
			requirePermanent(t, err, "headers too large")
			hi = mid
		} else {
			lo = mid
		}
	}
	t.Logf("largest header value accepted: %d bytes", lo)
	require.Greater(t, lo, 120<<10, "a 128 KiB frame holds more")
	for _, err := range sink.Publish(ctx, []*ferryevent.Event{withHeader(lo), event("orders", "b")}) {
		require.NoError(t, err, "the connection survived")
	}
	stored, err := r.read(ctx)
	require.NoError(t, err)
	require.Equal(t, "b", stored[len(stored)-1].Event.Key)
}

// TestPublishOverBrokerMaxMessageSize sends a payload over RabbitMQ's
// default max_message_size with a sink that does not know the limit: the
// broker closes the channel, the event fails permanently, the others in
// flight are retryable, and the sink refuses such payloads from then on
// without sending them.
func TestPublishOverBrokerMaxMessageSize(t *testing.T) {
	// Not parallel: it holds 128 MiB.
	ctx := testContext(t)
	sink, r, _ := newSink(t, ferryrabbit.Config{MaxMessageBytes: 1 << 30})
	big := event("files", "big")
	big.Payload = bytes.Repeat([]byte{'x'}, ferryrabbit.DefaultMaxMessageBytes+1)
	errs := sink.Publish(ctx, []*ferryevent.Event{event("files", "a"), big, event("files", "b")})
	if errs[1] == nil {
		t.Fatalf("the broker accepted a %d-byte message: this test needs RabbitMQ's default max_message_size (128 MiB before 4.0)", len(big.Payload))
	}
	require.NoError(t, errs[0])
	requirePermanent(t, errs[1], "payload too large for RabbitMQ: 134217729 bytes")
	require.ErrorContains(t, errs[1], "PRECONDITION_FAILED - message size 134217729 is larger than")
	if errs[2] != nil {
		require.False(t, ferrysink.IsPermanent(errs[2]))
		require.ErrorContains(t, errs[2], "max_message_size")
	}

	errs = sink.Publish(ctx, []*ferryevent.Event{big, event("files", "c")})
	requirePermanent(t, errs[0], "payload too large for RabbitMQ: 134217729 bytes")
	require.NotContains(t, errs[0].Error(), "PRECONDITION_FAILED", "refused before sending")
	require.NoError(t, errs[1])
	stored, err := r.read(ctx)
	require.NoError(t, err)
	require.Equal(t, "c", stored[len(stored)-1].Event.Key)
}

// TestPublishRecoversFromResets cuts the sink's connection while calls are
// in flight: events fail with retryable errors, the sink reconnects, and
// publishing the failed ones again stores everything.
func TestPublishRecoversFromResets(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	proxy, err := tcpproxy.Start(brokerAddr(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	sink, r, _ := newSink(t, ferryrabbit.Config{URL: viaProxy(t, proxy.Addr()), MaxInFlight: 64, ConfirmTimeout: 5 * time.Second})

	const calls, perCall = 20, 200
	var (
		want   = make(map[string]bool)
		failed int
	)
	stop := make(chan struct{})
	stopResets := sync.OnceFunc(func() { close(stop) })
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				proxy.Reset()
			}
		}
	})
	for c := range calls {
		batch := make([]*ferryevent.Event, perCall)
		for i := range batch {
			batch[i] = event("orders", fmt.Sprintf("order-%d-%d", c, i))
			want[batch[i].ID.String()] = true
		}
		// Publish the failed events again, as the relay does, until
		// every one is confirmed.
		for attempt := 0; len(batch) > 0; attempt++ {
			require.Less(t, attempt, 200, "the sink does not recover")
			if attempt == 20 {
				stopResets() // let it through
			}
			var again []*ferryevent.Event
			for i, err := range sink.Publish(ctx, batch) {
				if err != nil {
					require.False(t, ferrysink.IsPermanent(err), "a lost connection must not fail an event permanently: %v", err)
					again = append(again, batch[i])
					failed++
				}
			}
			batch = again
		}
	}
	stopResets()
	wg.Wait()
	t.Logf("%d failures retried", failed)
	require.Positive(t, failed, "the resets never hit a call in flight")

	stored, err := r.read(ctx)
	require.NoError(t, err)
	got := make(map[string]bool)
	for _, s := range stored {
		got[s.Event.ID.String()] = true
	}
	require.Equal(t, want, got, "events lost")
}

// TestPublishDuringOutage shows what the relay sees while the broker is
// unreachable: retryable errors, promptly, then success once it is back.
func TestPublishDuringOutage(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	proxy, err := tcpproxy.Start(brokerAddr(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	sink, r, _ := newSink(t, ferryrabbit.Config{URL: viaProxy(t, proxy.Addr())})

	outage := make(chan struct{})
	go func() {
		defer close(outage)
		proxy.Outage(time.Second)
	}()
	time.Sleep(100 * time.Millisecond) // inside the outage
	batch := []*ferryevent.Event{event("orders", "a"), event("orders", "b")}
	for _, err := range sink.Publish(ctx, batch) {
		require.Error(t, err)
		require.False(t, ferrysink.IsPermanent(err))
		require.ErrorContains(t, err, "reconnect to amqp://"+proxy.Addr())
	}
	<-outage
	for _, err := range sink.Publish(ctx, batch) {
		require.NoError(t, err)
	}
	stored, err := r.read(ctx)
	require.NoError(t, err)
	require.Len(t, stored, 2)
}

func TestPublishAfterChannelError(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	sink, r, top := newSink(t, ferryrabbit.Config{})
	for _, err := range sink.Publish(ctx, []*ferryevent.Event{event("orders", "a")}) {
		require.NoError(t, err)
	}

	// The exchange disappears: RabbitMQ closes the channel (404), which
	// is retryable, and the error says what to do.
	require.NoError(t, admin(t, func(ch *amqp.Channel) error { return ch.ExchangeDelete(top.exchange, false, false) }))
	var failure error
	require.Eventually(t, func() bool {
		for _, err := range sink.Publish(ctx, []*ferryevent.Event{event("orders", "b")}) {
			failure = err
		}
		return failure != nil
	}, 10*time.Second, 10*time.Millisecond)
	require.False(t, ferrysink.IsPermanent(failure))
	require.ErrorContains(t, failure, "was exchange \""+top.exchange+"\" deleted?")

	// Declared again, it works on a new channel of the same connection.
	require.NoError(t, admin(t, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(top.exchange, "topic", true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(top.queue, "#", top.exchange, false, nil)
	}))
	for _, err := range sink.Publish(ctx, []*ferryevent.Event{event("orders", "c")}) {
		require.NoError(t, err)
	}
	stored, err := r.read(ctx)
	require.NoError(t, err)
	require.Len(t, stored, 2)
}

func TestPublishAfterClose(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	sink, _, _ := newSink(t, ferryrabbit.Config{})
	require.NoError(t, sink.Close(ctx))
	errs := sink.Publish(ctx, []*ferryevent.Event{event("orders", "a"), event("orders", "b")})
	require.Len(t, errs, 2)
	for _, err := range errs {
		require.ErrorIs(t, err, ferryrabbit.ErrClosed)
		require.False(t, ferrysink.IsPermanent(err))
	}
}

func TestNewMissingExchange(t *testing.T) {
	t.Parallel()
	top := names(t)
	_, err := ferryrabbit.New(testContext(t), &ferryrabbit.Config{URL: testURL(t), Exchange: top.exchange})
	require.Error(t, err)
	require.ErrorContains(t, err, `exchange "`+top.exchange+`" not found`)
	require.ErrorContains(t, err, "Config.DeclareExchange")

	// With DeclareExchange, New declares it; a second sink finds it.
	for range 2 {
		sink, err := ferryrabbit.New(testContext(t), &ferryrabbit.Config{URL: testURL(t), Exchange: top.exchange, DeclareExchange: true})
		require.NoError(t, err)
		require.NoError(t, sink.Close(testContext(t)))
	}
	// Declaring it with another type fails and says why.
	_, err = ferryrabbit.New(testContext(t), &ferryrabbit.Config{URL: testURL(t), Exchange: top.exchange, DeclareExchange: true, ExchangeType: "fanout"})
	require.ErrorContains(t, err, "exists with another type or durability")
}

func TestNewUnreachable(t *testing.T) {
	t.Parallel()
	url := "amqp://ferry:s3cret@127.0.0.1:1/" // nothing listens there
	_, err := ferryrabbit.New(testContext(t), &ferryrabbit.Config{URL: url, DialTimeout: time.Second})
	require.Error(t, err)
	require.ErrorContains(t, err, "check Config.URL")
	require.NotContains(t, err.Error(), "s3cret")
	require.ErrorContains(t, err, "amqp://ferry:xxxxx@127.0.0.1:1/")

	// A cancelled context ends the attempt.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = ferryrabbit.New(ctx, &ferryrabbit.Config{URL: url})
	require.ErrorIs(t, err, context.Canceled)
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cfg   ferryrabbit.Config
		field string
	}{
		{"bad URL", ferryrabbit.Config{URL: "http://user:s3cret@localhost/"}, "Config.URL"},
		{"long exchange", ferryrabbit.Config{Exchange: strings.Repeat("x", 256)}, "Config.Exchange"},
		{"reserved exchange", ferryrabbit.Config{Exchange: "amq.topic", DeclareExchange: true}, `"amq."`},
		{"negative size", ferryrabbit.Config{MaxMessageBytes: -1}, "Config.MaxMessageBytes"},
		{"negative in-flight", ferryrabbit.Config{MaxInFlight: -1}, "Config.MaxInFlight"},
		{"negative timeout", ferryrabbit.Config{ConfirmTimeout: -time.Second}, "Config.ConfirmTimeout"},
		{"negative dial timeout", ferryrabbit.Config{DialTimeout: -time.Second}, "Config.DialTimeout"},
		{"recovery", ferryrabbit.Config{AMQP: &amqp.Config{Recovery: &amqp.Recovery{}}}, "Config.AMQP.Recovery"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ferryrabbit.New(context.Background(), &tc.cfg)
			require.ErrorContains(t, err, tc.field)
			require.NotContains(t, err.Error(), "s3cret")
		})
	}
}

// TestPublishUsesExistingExchange publishes to "amq.topic", which every
// broker has, without declaring it.
func TestPublishUsesExistingExchange(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	top := names(t)
	key := "ferrytest." + unique()
	require.NoError(t, admin(t, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(top.queue, true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(top.queue, key, "amq.topic", false, nil)
	}))
	sink, err := ferryrabbit.New(ctx, &ferryrabbit.Config{URL: testURL(t), Exchange: "amq.topic", RoutingKey: func(*ferryevent.Event) string { return key }})
	require.NoError(t, err)
	defer func() { require.NoError(t, sink.Close(ctx)) }()
	for _, err := range sink.Publish(ctx, []*ferryevent.Event{event("orders", "a")}) {
		require.NoError(t, err)
	}
	require.Equal(t, 1, queueDepth(t, top.queue))
}

func TestCloseWithContextEnded(t *testing.T) {
	t.Parallel()
	sink, _, _ := newSink(t, ferryrabbit.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// Nothing in flight: Close succeeds even with an ended context.
	require.NoError(t, sink.Close(ctx))
	require.NoError(t, sink.Close(ctx))
}

func TestErrorsNameTheEvent(t *testing.T) {
	t.Parallel()
	sink, _, _ := newSink(t, ferryrabbit.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ev := event("orders", "a")
	errs := sink.Publish(ctx, []*ferryevent.Event{ev})
	require.ErrorIs(t, errs[0], context.Canceled)
	require.ErrorContains(t, errs[0], ev.ID.String())
	require.False(t, errors.Is(errs[0], ferryrabbit.ErrClosed))
}
