package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"

	"github.com/ferry-dev/ferry/ferryshared/testenv"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrysink/ferryrabbit"
)

// TestRelayCrashRabbitMQ is TestRelayCrash publishing to RabbitMQ
// (FERRY_TEST_RABBITMQ_URL, default the local broker): RabbitMQ keeps every
// republished copy, so the test checks each key's first copies and bounds
// the copies.
func TestRelayCrashRabbitMQ(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.useRabbit()
	relayCrash(t, f)
}

func rabbitURL() string {
	if u := os.Getenv("FERRY_TEST_RABBITMQ_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// useRabbit declares a fresh exchange and a queue bound to all of it, and
// collects what reaches the queue, in queue order.
func (f *fixture) useRabbit() {
	conn, err := amqp.Dial(rabbitURL())
	if err != nil {
		testenv.Unavailable(f.t, "RabbitMQ", "FERRY_TEST_RABBITMQ_URL", err)
	}
	f.t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(f.t, err)
	name := fmt.Sprintf("ferry-crash-%d", rand.Int64())
	require.NoError(f.t, ch.ExchangeDeclare(name, "topic", true, false, false, false, nil))
	_, err = ch.QueueDeclare(name, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	require.NoError(f.t, err)
	require.NoError(f.t, ch.QueueBind(name, "#", name, false, nil))
	f.t.Cleanup(func() {
		if c, err := conn.Channel(); err == nil {
			_, _ = c.QueueDelete(name, false, false, false)
			_ = c.ExchangeDelete(name, false, false)
		}
	})
	deliveries, err := ch.Consume(name, "", true, true, false, false, nil)
	require.NoError(f.t, err)
	var mu sync.Mutex
	var got []ferry.Event
	go func() {
		for d := range deliveries {
			ev, err := ferryrabbit.Decode(d)
			if err != nil {
				f.t.Errorf("decode a message: %v", err)
				continue
			}
			mu.Lock()
			got = append(got, ev)
			mu.Unlock()
		}
	}()
	u := rabbitURL()
	f.sinkArgs = []string{"--sink-url", u + "?exchange=" + name}
	f.dedup = false
	f.read = func(context.Context) []ferry.Event {
		mu.Lock()
		defer mu.Unlock()
		return append([]ferry.Event(nil), got...)
	}
}
