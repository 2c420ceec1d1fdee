package ferrynats_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ferry-dev/ferry/ferrysink/ferrynats"
	"github.com/ferry-dev/ferry/ferrysink/ferrysinktest"
)

// urlVar names the variable pointing the tests at a NATS server with
// JetStream enabled.
const urlVar = "FERRY_TEST_NATS_URL"

var shared struct {
	once sync.Once
	nc   *nats.Conn
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.nc != nil {
		shared.nc.Close()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines leaked by the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// testConn returns the package's connection to the test server. Without a
// server the test is skipped, or fails under CI=true.
func testConn(tb testing.TB) *nats.Conn {
	tb.Helper()
	shared.once.Do(func() {
		url := os.Getenv(urlVar)
		if url == "" {
			url = "nats://127.0.0.1:4222"
		}
		shared.nc, shared.err = nats.Connect(url, nats.Name("ferrynats tests"), nats.Timeout(2*time.Second))
		if shared.err != nil {
			shared.err = fmt.Errorf("connect to NATS at %s: %w", url, shared.err)
		}
	})
	if shared.err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%v; set %s to a NATS server with JetStream", shared.err, urlVar)
		}
		tb.Skipf("%v; set %s to a NATS server with JetStream to run this test", shared.err, urlVar)
	}
	return shared.nc
}

func testJetStream(tb testing.TB) jetstream.JetStream {
	tb.Helper()
	js, err := jetstream.New(testConn(tb))
	require.NoError(tb, err)
	return js
}

// unique returns a random token usable in stream names and subjects.
func unique() string {
	return rand.Text()[:12]
}

// testNames returns a stream name and subject prefix no other test uses,
// and deletes the stream, if one gets created, when the test ends.
func testNames(tb testing.TB) (stream, prefix string) {
	tb.Helper()
	id := unique()
	stream, prefix = "FERRYTEST_"+id, "ferrytest."+strings.ToLower(id)
	js := testJetStream(tb)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			tb.Errorf("delete stream %s: %v", stream, err)
		}
	})
	return stream, prefix
}

func testContext(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// readStream reads every message of a stream in sequence order and
// decodes it.
func readStream(ctx context.Context, js jetstream.JetStream, name string) ([]ferrysinktest.Stored, error) {
	stream, err := js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, err
	}
	total := int(info.State.Msgs)
	if total == 0 {
		return nil, nil
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	out := make([]ferrysinktest.Stored, 0, total)
	for len(out) < total {
		batch, err := cons.Fetch(min(total-len(out), 1000), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		before := len(out)
		for msg := range batch.Messages() {
			ev, err := ferrynats.DecodeJetStream(msg)
			if err != nil {
				return nil, fmt.Errorf("decode stream message %d: %w", len(out)+1, err)
			}
			out = append(out, ferrysinktest.Stored{Event: ev})
		}
		if err := batch.Error(); err != nil {
			return nil, err
		}
		if len(out) == before {
			return nil, fmt.Errorf("stream %s holds %d messages but only %d could be read", name, total, len(out))
		}
	}
	return out, nil
}
