package main

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/ferry-dev/ferry/ferrysink/ferrykafka"
	"github.com/ferry-dev/ferry/ferrysink/ferryrabbit"
	"github.com/ferry-dev/ferry/ferrysink/ferrywebhook"
)

// sinkURLHelp lists the destinations --sink-url accepts.
const sinkURLHelp = "nats://host:4222 (JetStream; the default), kafka://host:9092[,host2:9092][?topic_prefix=app.&tls=true&sasl=plain|scram-sha-256|scram-sha-512] (credentials as user:password@), " +
	"amqp://user:password@host:5672/vhost[?exchange=ferry] (RabbitMQ), or https://receiver.example/hook (webhooks; secrets, comma-separated whsec_..., in FERRY_WEBHOOK_SECRETS)"

// openedSink is a destination the daemon publishes to.
type openedSink struct {
	sink  ferrysink.Sink
	label []any // log attributes naming it
	ready func() error
	close func()
	// another, when set, opens one more sink to the same destination over
	// a connection of its own (closed by close), for the next partition's
	// relay: a sink whose connection carries a lease fence
	// (ferrysink.WriteGuard) must serve one relay, or one partition's
	// handover would drop the connection under the other partitions'
	// events in flight.
	another func(ctx context.Context) (ferrysink.Sink, error)
}

// sinkCloseTimeout bounds closing a sink once the relays have stopped:
// what it still holds then was not acknowledged, so the relay's checkpoint
// has not passed it and the next leader publishes it again.
const sinkCloseTimeout = 500 * time.Millisecond

// closeSink closes s within sinkCloseTimeout, so that a stopping daemon
// exits within its ShutdownTimeout plus about a second.
func closeSink(s ferrysink.Sink) {
	ctx, cancel := context.WithTimeout(context.Background(), sinkCloseTimeout)
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Close(ctx) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// openSinkURL opens a non-NATS destination named by a URL; ok is false for
// NATS (nats:// or empty), which the caller opens.
func openSinkURL(ctx context.Context, raw string, log *slog.Logger) (s *openedSink, ok bool, err error) {
	if raw == "" {
		return nil, false, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, true, usagef("--sink-url / FERRY_SINK_URL %q: %v; use %s", raw, err, sinkURLHelp)
	}
	switch u.Scheme {
	case "nats", "tls":
		return nil, false, nil
	case "kafka":
		s, err := openKafka(ctx, u, log)
		return s, true, err
	case "amqp", "amqps":
		s, err := openRabbit(ctx, u, log)
		return s, true, err
	case "http", "https":
		s, err := openWebhook(u, log)
		return s, true, err
	}
	return nil, true, usagef("--sink-url / FERRY_SINK_URL: scheme %q is not a destination Ferry knows; use %s", u.Scheme, sinkURLHelp)
}

// openKafka reads kafka://[user:password@]host:port[,host:port]/[?options].
func openKafka(ctx context.Context, u *url.URL, log *slog.Logger) (*openedSink, error) {
	q := u.Query()
	cfg := &ferrykafka.Config{Brokers: strings.Split(u.Host, ","), TopicPrefix: q.Get("topic_prefix"), Logger: log}
	if v := q.Get("max_message_bytes"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, usagef("--sink-url: max_message_bytes=%q is not a number of bytes", v)
		}
		cfg.MaxMessageBytes = n
	}
	if on, _ := strconv.ParseBool(q.Get("tls")); on {
		cfg.ClientOptions = append(cfg.ClientOptions, kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12}))
	}
	if u.User != nil {
		user := u.User.Username()
		pass, _ := u.User.Password()
		switch mech := strings.ToLower(q.Get("sasl")); mech {
		case "", "plain":
			cfg.ClientOptions = append(cfg.ClientOptions, kgo.SASL(plain.Auth{User: user, Pass: pass}.AsMechanism()))
		case "scram-sha-256":
			cfg.ClientOptions = append(cfg.ClientOptions, kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()))
		case "scram-sha-512":
			cfg.ClientOptions = append(cfg.ClientOptions, kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()))
		default:
			return nil, usagef("--sink-url: sasl=%q: use plain, scram-sha-256 or scram-sha-512", mech)
		}
	}
	sink, err := ferrykafka.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	// Each relay gets a client of its own: a sink's broker connections are
	// fenced (ferrysink.WriteGuard), and a refused write drops them.
	var mu sync.Mutex
	sinks := []ferrysink.Sink{sink}
	return &openedSink{
		sink:  sink,
		label: []any{"kafka", strings.Join(cfg.Brokers, ","), "topic_prefix", cfg.TopicPrefix},
		ready: func() error { return nil },
		close: func() {
			mu.Lock()
			defer mu.Unlock()
			for _, s := range sinks {
				closeSink(s)
			}
		},
		another: func(ctx context.Context) (ferrysink.Sink, error) {
			s, err := ferrykafka.New(ctx, cfg)
			if err != nil {
				return nil, err
			}
			mu.Lock()
			defer mu.Unlock()
			sinks = append(sinks, s)
			return s, nil
		},
	}, nil
}

// openWebhook posts events to an http(s) URL, signed with the secrets in
// FERRY_WEBHOOK_SECRETS (comma-separated whsec_... values; none only with
// FERRY_WEBHOOK_UNSIGNED=true).
func openWebhook(u *url.URL, _ *slog.Logger) (*openedSink, error) {
	var secrets []string
	for _, s := range strings.Split(os.Getenv("FERRY_WEBHOOK_SECRETS"), ",") {
		if s = strings.TrimSpace(s); s != "" {
			secrets = append(secrets, s)
		}
	}
	unsigned, _ := strconv.ParseBool(os.Getenv("FERRY_WEBHOOK_UNSIGNED"))
	var timeout time.Duration
	if v := os.Getenv("FERRY_WEBHOOK_TIMEOUT"); v != "" {
		var err error
		if timeout, err = time.ParseDuration(v); err != nil || timeout <= 0 {
			return nil, usagef("FERRY_WEBHOOK_TIMEOUT %q: give a positive duration such as 10s (the longest one request may take)", v)
		}
	}
	sink, err := ferrywebhook.New(&ferrywebhook.Config{URL: u.String(), Secrets: secrets, Unsigned: unsigned, Timeout: timeout})
	if err != nil {
		return nil, usagef("%v", err)
	}
	redacted := *u
	redacted.User, redacted.RawQuery = nil, ""
	return &openedSink{
		sink:  sink,
		label: []any{"webhook", redacted.String()},
		ready: func() error { return nil },
		close: func() { closeSink(sink) },
	}, nil
}

// openRabbit publishes to a RabbitMQ exchange:
// amqp://user:password@host:5672/vhost[?exchange=ferry&declare_exchange=true].
func openRabbit(ctx context.Context, u *url.URL, log *slog.Logger) (*openedSink, error) {
	q := u.Query()
	cfg := &ferryrabbit.Config{Exchange: q.Get("exchange"), Logger: log}
	if v := q.Get("declare_exchange"); v != "" {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return nil, usagef("--sink-url: declare_exchange=%q: use true or false", v)
		}
		cfg.DeclareExchange = on
	}
	if v := q.Get("max_message_bytes"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, usagef("--sink-url: max_message_bytes=%q is not a number of bytes", v)
		}
		cfg.MaxMessageBytes = n
	}
	clean := *u
	clean.RawQuery = ""
	cfg.URL = clean.String()
	sink, err := ferryrabbit.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	redacted := clean
	redacted.User = nil
	exchange := cfg.Exchange
	if exchange == "" {
		exchange = ferryrabbit.DefaultExchange
	}
	return &openedSink{
		sink:  sink,
		label: []any{"rabbitmq", redacted.String(), "exchange", exchange},
		ready: func() error { return nil },
		close: func() { closeSink(sink) },
	}, nil
}
