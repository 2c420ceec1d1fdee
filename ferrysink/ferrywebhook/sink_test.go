package ferrywebhook_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/ferry-dev/ferry/ferrysink/ferrywebhook"
)

// publishOne publishes ev alone and returns its outcome.
func publishOne(ctx context.Context, t *testing.T, sink *ferrywebhook.Sink, ev *ferryevent.Event) error {
	t.Helper()
	errs := sink.Publish(ctx, []*ferryevent.Event{ev})
	require.Len(t, errs, 1)
	return errs[0]
}

func requirePermanentReason(t *testing.T, err error, parts ...string) string {
	t.Helper()
	require.Error(t, err)
	var pe *ferrysink.PermanentError
	require.ErrorAs(t, err, &pe, "want a permanent failure, got %v", err)
	for _, p := range parts {
		require.Contains(t, pe.Reason, p)
	}
	return pe.Reason
}

func TestServerErrorsAreRetried(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv, got := capture(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n <= 2 {
			http.Error(w, "database is restarting", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	sink := newTestSink(t, ferrywebhook.Config{URL: srv.URL, RetryBase: time.Millisecond, RetryMax: 5 * time.Millisecond})

	ev := event("order-1", 1)
	require.NoError(t, publishOne(ctx, t, sink, ev))
	reqs := got()
	require.Len(t, reqs, 3, "two 500s, then the 204")
	for i, r := range reqs {
		require.Equal(t, ev.ID.String(), r.header.Get(ferrywebhook.HeaderID), "attempt %d", i+1)
		require.NoError(t, ferrywebhook.Verify([]string{secret}, r.header, r.body, 0, time.Time{}), "attempt %d is signed afresh", i+1)
	}
}

func TestServerErrorsExhaustAttempts(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv, got := capture(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "overloaded", http.StatusServiceUnavailable)
	})
	sink := newTestSink(t, ferrywebhook.Config{URL: srv.URL, MaxAttempts: 4, RetryBase: time.Millisecond, RetryMax: time.Millisecond})

	err := publishOne(ctx, t, sink, event("order-1", 1))
	require.Error(t, err)
	require.False(t, ferrysink.IsPermanent(err), "a 503 is retried by the relay: %v", err)
	require.Contains(t, err.Error(), "503")
	require.Contains(t, err.Error(), "overloaded")
	require.Contains(t, err.Error(), "4 attempts")
	require.Len(t, got(), 4)
}

func TestStalledRequestIsRetried(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	release := make(chan struct{})
	var stalled atomic.Int32
	srv, got := capture(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			stalled.Add(1)
			select { // until the sink gives up on the request
			case <-r.Context().Done():
			case <-release:
			}
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	t.Cleanup(func() { close(release) }) // before srv.Close, which waits for handlers
	sink := newTestSink(t, ferrywebhook.Config{URL: srv.URL, Timeout: 200 * time.Millisecond, RetryBase: time.Millisecond})

	require.NoError(t, publishOne(ctx, t, sink, event("order-1", 1)))
	require.GreaterOrEqual(t, len(got()), 2, "the stalled attempt, then the answered one")
	require.EqualValues(t, 1, stalled.Load())
}

func TestStalledRequestReportsTimeout(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	release := make(chan struct{})
	srv, _ := capture(t, func(_ int, _ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	t.Cleanup(func() { close(release) })
	sink := newTestSink(t, ferrywebhook.Config{URL: srv.URL, Timeout: 50 * time.Millisecond, MaxAttempts: 2, RetryBase: time.Millisecond})

	err := publishOne(ctx, t, sink, event("order-1", 1))
	require.Error(t, err)
	require.False(t, ferrysink.IsPermanent(err))
	require.Contains(t, err.Error(), "Config.Timeout")
}

func TestRetryAfterSeconds(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv, got := capture(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	sink := newTestSink(t, ferrywebhook.Config{URL: srv.URL, RetryBase: time.Millisecond, RetryMax: time.Millisecond})

	require.NoError(t, publishOne(ctx, t, sink, event("order-1", 1)))
	reqs := got()
	require.Len(t, reqs, 2)
	gap := reqs[1].at.Sub(reqs[0].at)
	require.GreaterOrEqual(t, gap, time.Second, "the retry came %s after the 429 asking for 1s", gap)
}

func TestRetryAfterDate(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	notBefore := make(chan time.Time, 1)
	srv, got := capture(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			// HTTP dates have whole seconds: the wait is 0.5 to 1.5 s.
			date := time.Now().Add(1500 * time.Millisecond).Truncate(time.Second)
			notBefore <- date
			w.Header().Set("Retry-After", date.UTC().Format(http.TimeFormat))
			http.Error(w, "maintenance", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	sink := newTestSink(t, ferrywebhook.Config{URL: srv.URL, RetryBase: time.Millisecond, RetryMax: time.Millisecond})

	require.NoError(t, publishOne(ctx, t, sink, event("order-1", 1)))
	reqs := got()
	require.Len(t, reqs, 2)
	date := <-notBefore
	require.False(t, reqs[1].at.Round(0).Before(date), "the retry came at %s, before the Retry-After date %s", reqs[1].at.Round(0), date)
}

func TestRetryAfterIsCapped(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv, got := capture(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			w.Header().Set("Retry-After", "3600")
			http.Error(w, "come back in an hour", http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	sink := newTestSink(t, ferrywebhook.Config{URL: srv.URL, MaxRetryAfter: 100 * time.Millisecond})

	require.NoError(t, publishOne(ctx, t, sink, event("order-1", 1)), "waits Config.MaxRetryAfter, not an hour")
	reqs := got()
	require.Len(t, reqs, 2)
	require.GreaterOrEqual(t, reqs[1].at.Sub(reqs[0].at), 100*time.Millisecond)
}

func TestRetryAfterBeyondDeadlineReturnsAtOnce(t *testing.T) {
	t.Parallel()
	srv, got := capture(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "5")
		http.Error(w, "slow down", http.StatusTooManyRequests)
	})
	sink := newTestSink(t, ferrywebhook.Config{URL: srv.URL})

	ctx, cancel := context.WithTimeout(testContext(t), 2*time.Second)
	defer cancel()
	err := publishOne(ctx, t, sink, event("order-1", 1))
	require.Error(t, err)
	require.False(t, ferrysink.IsPermanent(err))
	require.Contains(t, err.Error(), "429", "the 429 is reported, not the deadline: %v", err)
	require.Contains(t, err.Error(), "deadline")
	require.NoError(t, ctx.Err(), "Publish returns before the deadline when the wait would pass it")
	require.Len(t, got(), 1)
}

func TestPermanentStatus(t *testing.T) {
	t.Parallel()
	long := "invalid order:\r\n\tfield \x00total\x1b[31m is negative " + strings.Repeat("ü", 600)
	for _, tc := range []struct {
		status int
		body   string
		parts  []string
	}{
		{http.StatusUnprocessableEntity, long, []string{"422", "invalid order: field total [31m is negative üü", "…"}},
		{http.StatusBadRequest, "bad json", []string{"400 Bad Request", `"bad json"`}},
		{http.StatusNotFound, "no such hook", []string{"404", "no such hook", "Config.URL"}},
		{http.StatusGone, "", []string{"410"}},
		{http.StatusUnauthorized, "bad signature", []string{"401", "bad signature", "Config.Secrets"}},
		{http.StatusRequestEntityTooLarge, "too big", []string{"413", "too big"}},
	} {
		t.Run(strconv.Itoa(tc.status), func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			srv, got := capture(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			})
			sink := newTestSink(t, ferrywebhook.Config{URL: srv.URL + "/hook?token=s3cr3t"})

			reason := requirePermanentReason(t, publishOne(ctx, t, sink, event("order-1", 1)), tc.parts...)
			require.Len(t, got(), 1, "a permanent failure is not retried")
			require.NotContains(t, reason, "s3cr3t", "the query string stays out of dead letters")
			require.NotContains(t, reason, "\n")
			require.NotContains(t, reason, "\x00")
			if tc.body == long {
				excerpt := reason[strings.Index(reason, `"`)+1 : strings.Index(reason, `…"`)]
				require.LessOrEqual(t, len(excerpt), 512, "the excerpt holds at most 512 bytes of the body: %s", excerpt)
				require.Greater(t, len(excerpt), 500, "the excerpt holds about 512 bytes of the body: %s", excerpt)
			}
		})
	}
}

func TestPermanentFailureLeavesOthers(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	rc := newReceiver(t, []string{secret}, func(w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("Ce-Subject") == "refused" {
			http.Error(w, "refused", http.StatusUnprocessableEntity)
			return true
		}
		return false
	})
	sink := newTestSink(t, ferrywebhook.Config{URL: rc.srv.URL})
	batch := []*ferryevent.Event{event("a", 1), event("refused", 1), event("b", 1)}
	errs := sink.Publish(ctx, batch)
	require.NoError(t, errs[0])
	requirePermanentReason(t, errs[1], "422")
	require.NoError(t, errs[2])
	require.Len(t, rc.events(), 2)
}

func TestTransientStatusConfig(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv, got := capture(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "unknown key", http.StatusUnauthorized)
	})
	sink := newTestSink(t, ferrywebhook.Config{URL: srv.URL, TransientStatus: []int{401}, MaxAttempts: 2, RetryBase: time.Millisecond})
	err := publishOne(ctx, t, sink, event("order-1", 1))
	require.Error(t, err)
	require.False(t, ferrysink.IsPermanent(err), "401 is listed in Config.TransientStatus: %v", err)
	require.Len(t, got(), 2)
}

func TestRedirectIsNotFollowed(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	target, hits := capture(t, nil)
	srv, _ := capture(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+"/moved?sig=abc", http.StatusTemporaryRedirect)
	})
	sink := newTestSink(t, ferrywebhook.Config{URL: srv.URL})

	requirePermanentReason(t, publishOne(ctx, t, sink, event("order-1", 1)), "307", "redirects are not followed", target.URL+"/moved")
	require.Empty(t, hits(), "the redirect target is never called")
}

func TestOversizePayload(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv, got := capture(t, nil)
	sink := newTestSink(t, ferrywebhook.Config{URL: srv.URL, MaxBodyBytes: 16})

	fits, big := event("a", 1), event("b", 1)
	fits.Payload = make([]byte, 16)
	big.Payload = make([]byte, 17)
	errs := sink.Publish(ctx, []*ferryevent.Event{fits, big})
	require.NoError(t, errs[0])
	requirePermanentReason(t, errs[1], "17 bytes", "Config.MaxBodyBytes (16)")
	require.Len(t, got(), 1, "the large event is refused before a request")
}

func TestEndpointRouting(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv, got := capture(t, nil)
	sink := newTestSink(t, ferrywebhook.Config{Endpoint: func(ev *ferryevent.Event) string {
		switch ev.Topic {
		case "orders":
			return srv.URL + "/orders"
		case "bad":
			return "ftp://example.com/x"
		}
		return ""
	}})
	orders, bad, none := event("a", 1), event("b", 1), event("c", 1)
	bad.Topic, none.Topic = "bad", "nowhere"
	errs := sink.Publish(ctx, []*ferryevent.Event{orders, bad, none})
	require.NoError(t, errs[0])
	requirePermanentReason(t, errs[1], `topic "bad"`, "not an http or https URL")
	requirePermanentReason(t, errs[2], `topic "nowhere"`, "no route")
	require.Len(t, got(), 1)
}

// TestPerKeyOrderWithSlowKeys delays some keys at the receiver: calls
// still deliver each key in order, and no key ever has two requests at the
// receiver at once.
func TestPerKeyOrderWithSlowKeys(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	var (
		mu        sync.Mutex
		inFlight  = map[string]int{}
		overlaps  []string
		delivered atomic.Int64
		key3      atomic.Int64
	)
	rc := newReceiver(t, []string{secret}, func(w http.ResponseWriter, r *http.Request) bool {
		key := r.Header.Get("Ce-Subject")
		mu.Lock()
		inFlight[key]++
		if inFlight[key] > 1 {
			overlaps = append(overlaps, key)
		}
		mu.Unlock()
		defer func() {
			mu.Lock()
			inFlight[key]--
			mu.Unlock()
		}()
		// Keys ending in an even digit are slow, variably: a receiver
		// answering them later than the others must not reorder them.
		if n := key[len(key)-1] - '0'; n%2 == 0 {
			time.Sleep(time.Duration(delivered.Add(1)%4) * time.Millisecond)
		}
		// key-3 fails every third request, to be retried within the call.
		if key == "key-3" && key3.Add(1)%3 == 0 {
			w.Header().Set("Retry-After", "0")
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return true
		}
		return false
	})
	sink := newTestSink(t, ferrywebhook.Config{URL: rc.srv.URL, MaxInFlight: 4, MaxAttempts: 10})

	const calls, keys = 30, 10
	for c := range calls {
		batch := make([]*ferryevent.Event, keys)
		for k := range keys {
			batch[k] = event("key-"+strconv.Itoa(k), int64(c+1))
		}
		for i, err := range sink.Publish(ctx, batch) {
			require.NoError(t, err, "call %d event %d", c, i)
		}
	}
	next := map[string]int64{}
	for _, ev := range rc.events() {
		next[ev.Key]++
		require.Equal(t, next[ev.Key], ev.Seq, "key %s out of order", ev.Key)
	}
	require.Len(t, next, keys)
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, overlaps, "keys with two requests at the receiver at once")
}

// stubbornTransport forwards requests, except that the first request of
// blockedKey ignores cancellation for a while, as a slow-to-abort network
// path would; it records keys seen with two requests at once.
type stubbornTransport struct {
	next       http.RoundTripper
	blockedKey string
	hold       time.Duration

	entered chan struct{} // receives when the blocked request arrives

	mu       sync.Mutex
	inFlight map[string]int
	overlaps []string
	blocked  bool
}

func (s *stubbornTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	key := r.Header.Get("ce-subject")
	s.mu.Lock()
	s.inFlight[key]++
	if s.inFlight[key] > 1 {
		s.overlaps = append(s.overlaps, key)
	}
	block := key == s.blockedKey && !s.blocked
	s.blocked = s.blocked || block
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inFlight[key]--
		s.mu.Unlock()
	}()
	if block {
		s.entered <- struct{}{}
		<-r.Context().Done()
		time.Sleep(s.hold) // cancelled, but slow to let go
		return nil, fmt.Errorf("aborted late: %w", r.Context().Err())
	}
	return s.next.RoundTrip(r)
}

// TestKeyNeverTwiceInFlight ends a call while its request is still in
// flight: the next call for that key waits for the request to end before
// sending anything, while other keys go on.
func TestKeyNeverTwiceInFlight(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, []string{secret}, nil)
	tr := &stubbornTransport{next: http.DefaultTransport, blockedKey: "slow", hold: 300 * time.Millisecond,
		entered: make(chan struct{}, 1), inFlight: map[string]int{}}
	t.Cleanup(http.DefaultTransport.(*http.Transport).CloseIdleConnections)
	sink := newTestSink(t, ferrywebhook.Config{URL: rc.srv.URL, Client: &http.Client{Transport: tr}})

	first := event("slow", 1)
	ctx, cancel := context.WithCancel(testContext(t))
	go func() {
		select {
		case <-tr.entered: // the request is in flight: end the call
			cancel()
		case <-ctx.Done():
		}
	}()
	err := publishOne(ctx, t, sink, first)
	cancel()
	require.Error(t, err)
	require.False(t, ferrysink.IsPermanent(err))
	require.ErrorIs(t, err, context.Canceled)

	// The relay retries the same event, alongside another key.
	other := event("fast", 1)
	errs := sink.Publish(testContext(t), []*ferryevent.Event{first, other})
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	tr.mu.Lock()
	defer tr.mu.Unlock()
	require.Empty(t, tr.overlaps, "a key had two requests in flight")
	require.Len(t, rc.events(), 2)
}

// TestSameKeyInOneCall: the relay never does it, but a caller putting two
// events of one key in a call gets them in order, and once one fails the
// later ones fail unsent.
func TestSameKeyInOneCall(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	rc := newReceiver(t, []string{secret}, func(w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("Ce-Ferrykeyseq") == "3" {
			http.Error(w, "no", http.StatusBadRequest)
			return true
		}
		return false
	})
	sink := newTestSink(t, ferrywebhook.Config{URL: rc.srv.URL})
	batch := []*ferryevent.Event{event("k", 1), event("k", 2), event("k", 3), event("k", 4)}
	errs := sink.Publish(ctx, batch)
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.True(t, ferrysink.IsPermanent(errs[2]))
	require.Error(t, errs[3])
	require.False(t, ferrysink.IsPermanent(errs[3]))
	require.Contains(t, errs[3].Error(), "failed before it")
	got := rc.events()
	require.Len(t, got, 2)
	require.Equal(t, []int64{1, 2}, []int64{got[0].Seq, got[1].Seq})
}

func TestCloseCancelsWhenItsContextEnds(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	srv, _ := capture(t, func(_ int, _ http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	t.Cleanup(func() { close(release) })
	sink, err := ferrywebhook.New(&ferrywebhook.Config{URL: srv.URL, Secrets: []string{secret}, Timeout: time.Minute})
	require.NoError(t, err)

	done := make(chan []error, 1)
	go func() { done <- sink.Publish(context.Background(), []*ferryevent.Event{event("a", 1)}) }()
	<-arrived // the request is in flight, and stalls

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = sink.Close(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	errs := <-done
	require.Error(t, errs[0])
	require.False(t, ferrysink.IsPermanent(errs[0]))
	require.ErrorIs(t, errs[0], ferrywebhook.ErrClosed)
	require.NoError(t, sink.Close(context.Background()), "second Close")
}

func TestPublishAfterClose(t *testing.T) {
	t.Parallel()
	srv, got := capture(t, nil)
	sink, err := ferrywebhook.New(&ferrywebhook.Config{URL: srv.URL, Secrets: []string{secret}})
	require.NoError(t, err)
	require.NoError(t, sink.Close(context.Background()))
	errs := sink.Publish(context.Background(), []*ferryevent.Event{event("a", 1), event("b", 1)})
	require.Len(t, errs, 2)
	for _, err := range errs {
		require.ErrorIs(t, err, ferrywebhook.ErrClosed)
		require.False(t, ferrysink.IsPermanent(err))
	}
	require.Empty(t, got())
}

func TestUnsigned(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv, got := capture(t, nil)
	sink := newTestSink(t, ferrywebhook.Config{URL: srv.URL, Unsigned: true, Header: http.Header{"Authorization": {"Bearer t0ken"}}})
	require.NoError(t, publishOne(ctx, t, sink, event("a", 1)))
	h := got()[0].header
	require.Empty(t, h.Get(ferrywebhook.HeaderSignature))
	require.NotEmpty(t, h.Get(ferrywebhook.HeaderID))
	require.NotEmpty(t, h.Get(ferrywebhook.HeaderTimestamp))
	require.Equal(t, "Bearer t0ken", h.Get("Authorization"))
}

func TestConnectionRefusedIsTransient(t *testing.T) {
	t.Parallel()
	srv, _ := capture(t, nil)
	url := srv.URL
	srv.Close() // nothing listens there any more
	sink := newTestSink(t, ferrywebhook.Config{URL: url, MaxAttempts: 2, RetryBase: time.Millisecond})
	err := publishOne(testContext(t), t, sink, event("a", 1))
	require.Error(t, err)
	require.False(t, ferrysink.IsPermanent(err))
	require.NotErrorIs(t, err, context.Canceled)
	require.Contains(t, err.Error(), "2 attempts")
}
