package ferrywebhook_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/ferry-dev/ferry/ferrysink/ferrywebhook"
)

// sentRequest returns a request exactly as a sink sent ev, to be replayed
// (possibly altered) through a Handler.
func sentRequest(t *testing.T, ev *ferryevent.Event) captured {
	t.Helper()
	srv, got := capture(t, nil)
	sink := newTestSink(t, ferrywebhook.Config{URL: srv.URL})
	require.NoError(t, publishOne(testContext(t), t, sink, ev))
	return got()[0]
}

func serve(h http.Handler, method string, header http.Header, body []byte) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, "/hook", bytes.NewReader(body))
	r.Header = header.Clone()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// resign signs header and body again with secret, as a sender would.
func resign(t *testing.T, header http.Header, body []byte) {
	t.Helper()
	now := time.Now()
	sig, err := ferrywebhook.Sign([]string{secret}, header.Get(ferrywebhook.HeaderID), now, body)
	require.NoError(t, err)
	header.Set(ferrywebhook.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	header.Set(ferrywebhook.HeaderSignature, sig)
}

func TestHandler(t *testing.T) {
	t.Parallel()
	ev := event("order-1", 7)
	ev.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	sent := sentRequest(t, ev)

	var got []ferryevent.Event
	var fail error
	h := ferrywebhook.Handler([]string{otherSecret, secret}, func(ctx context.Context, e ferryevent.Event) error {
		require.Equal(t, "webhook", ferrysink.SystemOf(ctx), "the delivery names its transport for Ingest")
		if fail != nil {
			return fail
		}
		got = append(got, e)
		return nil
	})

	t.Run("accepted", func(t *testing.T) {
		w := serve(h, http.MethodPost, sent.header, sent.body)
		require.Equal(t, http.StatusNoContent, w.Code, w.Body.String())
		require.Len(t, got, 1)
		require.Equal(t, ev.ID, got[0].ID)
		require.Equal(t, ev.Key, got[0].Key)
		require.Equal(t, ev.Seq, got[0].Seq)
		require.Equal(t, ev.Payload, got[0].Payload)
		require.Equal(t, ev.Headers, got[0].Headers)
		require.True(t, ev.CreatedAt.Equal(got[0].CreatedAt))
	})
	t.Run("bad signature", func(t *testing.T) {
		w := serve(h, http.MethodPost, sent.header, append(bytes.Clone(sent.body), 'x'))
		require.Equal(t, http.StatusUnauthorized, w.Code)
		require.NotContains(t, w.Body.String(), "secret", "an unauthenticated caller learns only the verdict")
		require.Len(t, got, 1, "the callback is not called")
	})
	t.Run("wrong secret", func(t *testing.T) {
		other := ferrywebhook.Handler([]string{ferrywebhook.NewSecret()}, func(context.Context, ferryevent.Event) error { panic("called") })
		require.Equal(t, http.StatusUnauthorized, serve(other, http.MethodPost, sent.header, sent.body).Code)
	})
	t.Run("ce-id differs from webhook-id", func(t *testing.T) {
		header := sent.header.Clone()
		header.Set("Ce-Id", ferryevent.NewID().String())
		w := serve(h, http.MethodPost, header, sent.body)
		require.Equal(t, http.StatusUnauthorized, w.Code)
		require.Contains(t, w.Body.String(), "ce-id")
	})
	t.Run("malformed event", func(t *testing.T) {
		header := sent.header.Clone()
		header.Del("Ce-Type")
		resign(t, header, sent.body)
		w := serve(h, http.MethodPost, header, sent.body)
		require.Equal(t, http.StatusBadRequest, w.Code)
		require.Contains(t, w.Body.String(), "ce-type")
	})
	t.Run("callback fails", func(t *testing.T) {
		fail = errors.New("database unavailable: password=hunter2")
		defer func() { fail = nil }()
		w := serve(h, http.MethodPost, sent.header, sent.body)
		require.Equal(t, http.StatusInternalServerError, w.Code)
		require.NotContains(t, w.Body.String(), "hunter2", "the callback's error stays on the receiver")
	})
	t.Run("callback refuses for good", func(t *testing.T) {
		fail = ferrysink.Permanent("order 42 does not exist", nil)
		defer func() { fail = nil }()
		w := serve(h, http.MethodPost, sent.header, sent.body)
		require.Equal(t, http.StatusUnprocessableEntity, w.Code)
		require.Contains(t, w.Body.String(), "order 42 does not exist")
	})
	t.Run("not a POST", func(t *testing.T) {
		w := serve(h, http.MethodGet, sent.header, nil)
		require.Equal(t, http.StatusMethodNotAllowed, w.Code)
		require.Equal(t, http.MethodPost, w.Header().Get("Allow"))
	})
	t.Run("body too large", func(t *testing.T) {
		w := serve(h, http.MethodPost, sent.header, make([]byte, ferrywebhook.DefaultMaxBodyBytes+1))
		require.Equal(t, http.StatusRequestEntityTooLarge, w.Code)
	})
	require.Len(t, got, 1)
}

// TestHandlerAnswersDriveTheSink checks the two ends together: what the
// Handler answers is what the sink reports.
func TestHandlerAnswersDriveTheSink(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	h := ferrywebhook.Handler([]string{secret}, func(_ context.Context, ev ferryevent.Event) error {
		switch ev.Key {
		case "refuse":
			return ferrysink.Permanent("unknown customer", nil)
		case "fail":
			return errors.New("busy")
		}
		return nil
	})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	sink := newTestSink(t, ferrywebhook.Config{URL: srv.URL, MaxAttempts: 1})
	wrongKey := newTestSink(t, ferrywebhook.Config{URL: srv.URL, Secrets: []string{otherSecret}})

	errs := sink.Publish(ctx, []*ferryevent.Event{event("ok", 1), event("refuse", 1), event("fail", 1)})
	require.NoError(t, errs[0])
	requirePermanentReason(t, errs[1], "422", "unknown customer")
	require.Error(t, errs[2])
	require.False(t, ferrysink.IsPermanent(errs[2]))
	require.Contains(t, errs[2].Error(), "500")
	requirePermanentReason(t, publishOne(ctx, t, wrongKey, event("ok", 2)), "401", "Config.Secrets")
}

func TestHandlerPanicsOnBadSecrets(t *testing.T) {
	t.Parallel()
	noop := func(context.Context, ferryevent.Event) error { return nil }
	require.PanicsWithValue(t, "ferrywebhook: Handler needs at least one secret: pass the Config.Secrets of the sending sink", func() { ferrywebhook.Handler(nil, noop) })
	require.Panics(t, func() { ferrywebhook.Handler([]string{"plain"}, noop) })
	require.Panics(t, func() { ferrywebhook.Handler([]string{secret}, nil) })
}

// TestWireFormat looks at the request itself: CloudEvents binary mode
// with percent-encoded attributes, and the event's headers passed through,
// an event never replacing Ferry's or the configured ones.
func TestWireFormat(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv, got := capture(t, nil)
	sink := newTestSink(t, ferrywebhook.Config{URL: srv.URL, Header: http.Header{"Authorization": {"Bearer t0ken"}}})

	ev := event("customer 2/ü:€", 3)
	ev.Type = "Ünïcode✓"
	ev.ContentType = "text/plain; charset=utf-8"
	ev.Headers = map[string]string{
		"traceparent":  "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"X-Tenant":     "acme ünïcode ✓ \"quoted\", a=b; c",
		"X-Multi-Line": "one\r\ntwo",
		"X-Empty":      "",
	}
	// Headers that would replace the sink's, Ferry's or HTTP's are refused
	// at emit (ferryevent.ReservedHeader); an event holding one all the
	// same (an outbox row of an earlier version) is refused here, never
	// sent without it.
	for name, reason := range map[string]string{
		"Authorization":     "Config.Header",
		"ce-id":             "Ferry or HTTP writes itself",
		"Webhook-Signature": "Ferry or HTTP writes itself",
		"content-type":      "Ferry or HTTP writes itself",
		"Connection":        "Ferry or HTTP writes itself",
	} {
		forged := event("customer 2/ü:€", 3)
		forged.Headers = map[string]string{name: "forged", "X-Tenant": "acme"}
		requirePermanentReason(t, publishOne(ctx, t, sink, forged), strconv.Quote(name), reason)
	}
	require.NoError(t, publishOne(ctx, t, sink, ev))
	req := got()[0]
	h := req.header

	require.Equal(t, ev.Payload, req.body)
	require.Equal(t, "1.0", h.Get("Ce-Specversion"))
	require.Equal(t, ev.ID.String(), h.Get("Ce-Id"))
	require.Equal(t, "customer%202/%C3%BC:%E2%82%AC", h.Get("Ce-Subject"), "percent-encoded as the CloudEvents HTTP binding asks")
	require.Equal(t, "%C3%9Cn%C3%AFcode%E2%9C%93", h.Get("Ce-Type"))
	require.Equal(t, "orders", h.Get("Ce-Ferrytopic"))
	require.Equal(t, "3", h.Get("Ce-Ferrykeyseq"))
	require.Equal(t, ev.CreatedAt.UTC().Format(time.RFC3339Nano), h.Get("Ce-Time"))
	require.Empty(t, h.Values("Ce-Datacontenttype"), "binary mode carries it in Content-Type")
	require.Equal(t, "text/plain; charset=utf-8", h.Get("Content-Type"))
	require.Equal(t, ev.ID.String(), h.Get(ferrywebhook.HeaderID))
	require.Equal(t, "Bearer t0ken", h.Get("Authorization"))
	require.Len(t, h.Values("Authorization"), 1)
	require.Len(t, strings.Fields(h.Get(ferrywebhook.HeaderSignature)), 1)
	require.Equal(t, ev.Headers["traceparent"], h.Get("Traceparent"))
	require.Equal(t, ev.Headers["X-Tenant"], h.Get("X-Tenant"))
	require.Equal(t, "one  two", h.Get("X-Multi-Line"), "CR and LF become spaces")
	require.Equal(t, "X-Empty,X-Multi-Line,X-Tenant,traceparent", h.Get(ferrywebhook.HeaderList))
	require.Contains(t, h.Get("User-Agent"), "ferrywebhook")

	r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(req.body))
	r.Header = h
	dec, err := ferrywebhook.DecodeRequest(r)
	require.NoError(t, err)
	require.Equal(t, map[string]string{
		"traceparent":  ev.Headers["traceparent"],
		"X-Tenant":     ev.Headers["X-Tenant"],
		"X-Multi-Line": "one  two",
		"X-Empty":      "",
	}, dec.Headers)
	require.Equal(t, ev.Key, dec.Key)
	require.Equal(t, ev.Type, dec.Type)
	require.Equal(t, ev.ContentType, dec.ContentType)
}

func TestHeadersHTTPCannotCarry(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv, got := capture(t, nil)
	sink := newTestSink(t, ferrywebhook.Config{URL: srv.URL})

	badName, caseTwins, badType := event("a", 1), event("b", 1), event("c", 1)
	badName.Headers = map[string]string{"x tenant": "acme"}
	caseTwins.Headers = map[string]string{"X-Tenant": "a", "x-tenant": "b"}
	badType.ContentType = "text/plain\r\nX-Injected: 1"
	errs := sink.Publish(ctx, []*ferryevent.Event{badName, caseTwins, badType})
	requirePermanentReason(t, errs[0], `"x tenant"`, "cannot be sent over HTTP")
	requirePermanentReason(t, errs[1], "differ only in case")
	requirePermanentReason(t, errs[2], "Content-Type")
	require.Empty(t, got())
}

func TestDecodeRequestMalformed(t *testing.T) {
	t.Parallel()
	ev := event("order-1", 1)
	sent := sentRequest(t, ev)
	decode := func(change func(h http.Header)) error {
		h := sent.header.Clone()
		change(h)
		r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(sent.body))
		r.Header = h
		_, err := ferrywebhook.DecodeRequest(r)
		return err
	}
	require.NoError(t, decode(func(http.Header) {}))
	for name, tc := range map[string]struct {
		change func(http.Header)
		want   string
	}{
		"no specversion":   {func(h http.Header) { h.Del("Ce-Specversion") }, "ce-specversion"},
		"bad id":           {func(h http.Header) { h.Set("Ce-Id", "42") }, "not a UUID"},
		"bad escape":       {func(h http.Header) { h.Set("Ce-Subject", "a%zz") }, "ce-subject"},
		"not UTF-8":        {func(h http.Header) { h.Set("Ce-Subject", "a%FF") }, "UTF-8"},
		"bad time":         {func(h http.Header) { h.Set("Ce-Time", "yesterday") }, "ce-time"},
		"bad seq":          {func(h http.Header) { h.Set("Ce-Ferrykeyseq", "-1") }, "ce-ferrykeyseq"},
		"structured mode":  {func(h http.Header) { h.Del("Ce-Type"); h.Set("Content-Type", "application/cloudevents+json") }, "structured mode"},
		"no topic":         {func(h http.Header) { h.Del("Ce-Ferrytopic") }, "ce-ferrytopic"},
		"truncated escape": {func(h http.Header) { h.Set("Ce-Source", "abc%4") }, "incomplete"},
	} {
		err := decode(tc.change)
		require.ErrorIs(t, err, ferrywebhook.ErrMalformed, name)
		require.ErrorContains(t, err, tc.want, name)
	}
	_, err := ferrywebhook.DecodeRequest(nil)
	require.ErrorIs(t, err, ferrywebhook.ErrMalformed)

	r := httptest.NewRequest(http.MethodPost, "/", io.NopCloser(failingReader{}))
	r.Header = sent.header.Clone()
	_, err = ferrywebhook.DecodeRequest(r)
	require.ErrorIs(t, err, ferrywebhook.ErrMalformed)
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }
