package ferrywebhook_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink/ferrysinktest"
	"github.com/ferry-dev/ferry/ferrysink/ferrywebhook"
)

// receiver is a test endpoint: a Handler that stores the events it receives
// in arrival order, behind an optional hook that may answer instead.
type receiver struct {
	srv     *httptest.Server
	secrets []string

	mu     sync.Mutex
	stored []ferrysinktest.Stored
}

// newReceiver starts a receiver verifying with secrets. hook, when not nil,
// sees every request first and answers it itself by returning true.
func newReceiver(t testing.TB, secrets []string, hook func(w http.ResponseWriter, r *http.Request) bool) *receiver {
	t.Helper()
	rc := &receiver{secrets: secrets}
	h := ferrywebhook.Handler(secrets, func(_ context.Context, ev ferryevent.Event) error {
		rc.mu.Lock()
		rc.stored = append(rc.stored, ferrysinktest.Stored{Event: ev})
		rc.mu.Unlock()
		return nil
	})
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hook != nil && hook(w, r) {
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

// read returns what the receiver stored so far, in arrival order.
func (rc *receiver) read(context.Context) ([]ferrysinktest.Stored, error) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]ferrysinktest.Stored(nil), rc.stored...), nil
}

func (rc *receiver) events() []ferryevent.Event {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := make([]ferryevent.Event, len(rc.stored))
	for i, s := range rc.stored {
		out[i] = s.Event
	}
	return out
}

// newTestSink returns a sink for cfg (Secrets default to secret) closed at
// the end of the test.
func newTestSink(t testing.TB, cfg ferrywebhook.Config) *ferrywebhook.Sink {
	t.Helper()
	if cfg.Secrets == nil && !cfg.Unsigned {
		cfg.Secrets = []string{secret}
	}
	sink, err := ferrywebhook.New(&cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, sink.Close(ctx))
	})
	return sink
}

// secret and otherSecret are fixed test secrets.
var (
	secret      = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	otherSecret = ferrywebhook.NewSecret()
)

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// event builds a valid event of key with sequence number seq.
func event(key string, seq int64) *ferryevent.Event {
	ev := &ferryevent.Event{
		ID:          ferryevent.NewID(),
		Topic:       "orders",
		Key:         key,
		Type:        "OrderPlaced",
		Source:      "ferrywebhook-test",
		ContentType: "application/json",
		Payload:     []byte(`{"key":"` + key + `","seq":` + strconv.FormatInt(seq, 10) + `}`),
		CreatedAt:   time.Now().Truncate(time.Microsecond),
		Seq:         seq,
	}
	return ev
}

// captured is one request as an endpoint received it.
type captured struct {
	header http.Header
	body   []byte
	at     time.Time
}

// capture starts an endpoint that records every request and answers with
// answer (204 when nil).
func capture(t testing.TB, answer func(n int, w http.ResponseWriter, r *http.Request)) (*httptest.Server, func() []captured) {
	t.Helper()
	var (
		mu  sync.Mutex
		got []captured
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		mu.Lock()
		got = append(got, captured{header: r.Header.Clone(), body: bytes.Clone(body), at: time.Now()})
		n := len(got)
		mu.Unlock()
		if answer == nil {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		answer(n, w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []captured {
		mu.Lock()
		defer mu.Unlock()
		return append([]captured(nil), got...)
	}
}
