package ferryrabbit_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferry-dev/ferry/ferrysink/ferryrabbit"
	"github.com/ferry-dev/ferry/ferrysink/ferrysinktest"
)

// urlVar names the variable pointing the tests at a RabbitMQ broker.
const urlVar = "FERRY_TEST_RABBITMQ_URL"

var shared struct {
	once sync.Once
	url  string
	conn *amqp.Connection
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.conn != nil {
		_ = shared.conn.Close()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines leaked by the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// testURL returns the test broker's URL, after checking that it answers.
// Without a broker the test is skipped, or fails under CI=true.
func testURL(tb testing.TB) string {
	tb.Helper()
	adminConn(tb)
	return shared.url
}

// adminConn returns the tests' own connection, for declaring, inspecting
// and deleting queues.
func adminConn(tb testing.TB) *amqp.Connection {
	tb.Helper()
	shared.once.Do(func() {
		shared.url = os.Getenv(urlVar)
		if shared.url == "" {
			shared.url = "amqp://guest:guest@127.0.0.1:5672/"
		}
		shared.conn, shared.err = amqp.DialConfig(shared.url, amqp.Config{
			Dial:       amqp.DefaultDial(3 * time.Second),
			Properties: amqp.Table{"connection_name": "ferryrabbit tests"},
		})
		if shared.err != nil {
			shared.err = fmt.Errorf("connect to RabbitMQ at %s: %w", shared.url, shared.err)
		}
	})
	if shared.err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%v; set %s to a RabbitMQ broker", shared.err, urlVar)
		}
		tb.Skipf("%v; set %s to a RabbitMQ broker to run this test", shared.err, urlVar)
	}
	return shared.conn
}

// brokerAddr is the host:port of the test broker, for proxies.
func brokerAddr(tb testing.TB) string {
	tb.Helper()
	uri, err := amqp.ParseURI(testURL(tb))
	require.NoError(tb, err)
	return net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
}

// viaProxy returns the test URL with its host and port replaced by addr.
func viaProxy(tb testing.TB, addr string) string {
	tb.Helper()
	uri, err := amqp.ParseURI(testURL(tb))
	require.NoError(tb, err)
	host, port, err := net.SplitHostPort(addr)
	require.NoError(tb, err)
	uri.Host = host
	uri.Port, err = strconv.Atoi(port)
	require.NoError(tb, err)
	return uri.String()
}

// admin runs f on a fresh channel of the tests' connection: a failed
// operation closes the channel it ran on.
func admin(tb testing.TB, f func(ch *amqp.Channel) error) error {
	tb.Helper()
	ch, err := adminConn(tb).Channel()
	if err != nil {
		return err
	}
	defer func() {
		if !ch.IsClosed() {
			_ = ch.Close()
		}
	}()
	return f(ch)
}

// unique returns a random token usable in exchange and queue names.
func unique() string {
	return strings.ToLower(rand.Text()[:12])
}

func testContext(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// topology is an exchange and a queue bound to it that no other test uses.
type topology struct {
	exchange, queue string
}

// newTopology declares a durable topic exchange and a queue of the given
// type (args) bound to it with each key, and deletes both when the test
// ends.
func newTopology(tb testing.TB, args amqp.Table, keys ...string) topology {
	tb.Helper()
	id := unique()
	top := topology{exchange: "ferrytest.x." + id, queue: "ferrytest.q." + id}
	tb.Cleanup(func() { top.delete(tb) })
	require.NoError(tb, admin(tb, func(ch *amqp.Channel) error {
		if err := ch.ExchangeDeclare(top.exchange, "topic", true, false, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(top.queue, true, false, false, false, args); err != nil {
			return err
		}
		for _, k := range keys {
			if err := ch.QueueBind(top.queue, k, top.exchange, false, nil); err != nil {
				return err
			}
		}
		return nil
	}))
	return top
}

// names returns an exchange and queue name no other test uses, deleted
// when the test ends, for tests whose code under test declares them.
func names(tb testing.TB) topology {
	tb.Helper()
	id := unique()
	top := topology{exchange: "ferrytest.x." + id, queue: "ferrytest.q." + id}
	tb.Cleanup(func() { top.delete(tb) })
	return top
}

func (top topology) delete(tb testing.TB) {
	err := admin(tb, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDelete(top.queue, false, false, false); err != nil {
			return err
		}
		return ch.ExchangeDelete(top.exchange, false, false)
	})
	if err != nil {
		tb.Errorf("delete %s and %s: %v", top.queue, top.exchange, err)
	}
}

// reader reads a queue's messages as a ReadFunc: it takes whatever the
// queue holds, appends it to what earlier calls took, and returns it all,
// in queue order.
type reader struct {
	tb    testing.TB
	queue string

	mu     sync.Mutex
	stored []ferrysinktest.Stored
	raw    []amqp.Delivery
}

func (r *reader) read(ctx context.Context) ([]ferrysinktest.Stored, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch, err := adminConn(r.tb).Channel()
	if err != nil {
		return nil, err
	}
	defer func() { _ = ch.Close() }()
	for ctx.Err() == nil {
		d, ok, err := ch.Get(r.queue, true)
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		ev, err := ferryrabbit.Decode(d)
		if err != nil {
			return nil, fmt.Errorf("decode message %d of queue %s: %w", len(r.stored)+1, r.queue, err)
		}
		r.stored = append(r.stored, ferrysinktest.Stored{Event: ev})
		r.raw = append(r.raw, d)
	}
	return append([]ferrysinktest.Stored(nil), r.stored...), ctx.Err()
}

// deliveries returns every message read so far, as delivered.
func (r *reader) deliveries() []amqp.Delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]amqp.Delivery(nil), r.raw...)
}

// queueDepth returns the number of ready messages in a queue.
func queueDepth(tb testing.TB, queue string) int {
	tb.Helper()
	var n int
	require.NoError(tb, admin(tb, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		n = q.Messages
		return err
	}))
	return n
}

// queueConsumers returns the number of consumers of a queue.
func queueConsumers(tb testing.TB, queue string) int {
	tb.Helper()
	var n int
	require.NoError(tb, admin(tb, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		n = q.Consumers
		return err
	}))
	return n
}
