package ferrywebhook_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrysink/ferrywebhook"
)

// TestSignStandardWebhooksVector checks Sign against the example of the
// Standard Webhooks specification (its signature also recomputed with
// openssl dgst -sha256 -mac HMAC).
func TestSignStandardWebhooksVector(t *testing.T) {
	t.Parallel()
	const (
		key  = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		id   = "msg_p5jXN8AQM9LWM0D4loKWxJek"
		body = `{"test": 2432232314}`
		want = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	)
	ts := time.Unix(1614265330, 0)
	got, err := ferrywebhook.Sign([]string{key}, id, ts, []byte(body))
	require.NoError(t, err)
	require.Equal(t, want, got)

	h := http.Header{}
	h.Set(ferrywebhook.HeaderID, id)
	h.Set(ferrywebhook.HeaderTimestamp, "1614265330")
	h.Set(ferrywebhook.HeaderSignature, "v1a,c29tZXRoaW5nIGVsc2U= "+want)
	require.NoError(t, ferrywebhook.Verify([]string{key}, h, []byte(body), 0, ts))
}

// TestSignatureRoundTrip verifies requests a sink signed with two secrets,
// as during a rotation, and tampered copies of them.
func TestSignatureRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	srv, got := capture(t, nil)
	sink := newTestSink(t, ferrywebhook.Config{URL: srv.URL, Secrets: []string{secret, otherSecret}})
	require.NoError(t, publishOne(ctx, t, sink, event("order-1", 1)))
	req := got()[0]
	sigs := strings.Fields(req.header.Get(ferrywebhook.HeaderSignature))
	require.Len(t, sigs, 2, "one signature per secret")
	for _, s := range sigs {
		require.True(t, strings.HasPrefix(s, "v1,"), s)
	}
	now := time.Now()

	// Either secret verifies, alone or with others.
	for _, secrets := range [][]string{{secret}, {otherSecret}, {ferrywebhook.NewSecret(), otherSecret}} {
		require.NoError(t, ferrywebhook.Verify(secrets, req.header, req.body, 0, now))
	}

	tampered := func(change func(h http.Header, body []byte) []byte) error {
		h := req.header.Clone()
		body := change(h, append([]byte(nil), req.body...))
		return ferrywebhook.Verify([]string{secret, otherSecret}, h, body, 0, now)
	}
	for name, change := range map[string]func(http.Header, []byte) []byte{
		"another secret": func(h http.Header, b []byte) []byte {
			require.ErrorIs(t, ferrywebhook.Verify([]string{ferrywebhook.NewSecret()}, h, b, 0, now), ferrywebhook.ErrInvalidSignature)
			return nil // and no body at all
		},
		"body": func(_ http.Header, b []byte) []byte { return append(b, ' ') },
		"webhook-id": func(h http.Header, b []byte) []byte {
			h.Set(ferrywebhook.HeaderID, "x"+h.Get(ferrywebhook.HeaderID))
			return b
		},
		"timestamp": func(h http.Header, b []byte) []byte {
			h.Set(ferrywebhook.HeaderTimestamp, "1"+h.Get(ferrywebhook.HeaderTimestamp))
			return b
		},
		"no signature": func(h http.Header, b []byte) []byte { h.Del(ferrywebhook.HeaderSignature); return b },
		"no id":        func(h http.Header, b []byte) []byte { h.Del(ferrywebhook.HeaderID); return b },
		"garbage":      func(h http.Header, b []byte) []byte { h.Set(ferrywebhook.HeaderSignature, "v1,%%% v2,abc"); return b },
		"other scheme": func(h http.Header, b []byte) []byte { h.Set(ferrywebhook.HeaderSignature, "v1a,abc"); return b },
	} {
		require.ErrorIs(t, tampered(change), ferrywebhook.ErrInvalidSignature, name)
	}

	// The timestamp must be within the tolerance, either way.
	for _, tc := range []struct {
		shift     time.Duration
		tolerance time.Duration
		ok        bool
	}{
		{4 * time.Minute, 0, true},
		{-4 * time.Minute, 0, true},
		{6 * time.Minute, 0, false},
		{-6 * time.Minute, 0, false},
		{6 * time.Minute, 10 * time.Minute, true},
		{2 * time.Second, time.Second, false},
	} {
		err := ferrywebhook.Verify([]string{secret}, req.header, req.body, tc.tolerance, now.Add(tc.shift))
		if tc.ok {
			require.NoError(t, err, "%+v", tc)
		} else {
			require.ErrorIs(t, err, ferrywebhook.ErrInvalidSignature, "%+v", tc)
			require.Contains(t, err.Error(), "from the receiver's clock")
		}
	}
}

func TestSecrets(t *testing.T) {
	t.Parallel()
	s := ferrywebhook.NewSecret()
	require.True(t, strings.HasPrefix(s, "whsec_"))
	require.NotEqual(t, s, ferrywebhook.NewSecret())

	for secret, want := range map[string]string{
		"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw":       `does not start with "whsec_"`,
		"whsec_not base64!":                      "not standard base64",
		"whsec_c2hvcnQ=":                         "fewer than 24",
		"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw": "",
	} {
		_, err := ferrywebhook.Sign([]string{secret}, "id", time.Now(), nil)
		if want == "" {
			require.NoError(t, err)
			continue
		}
		require.ErrorContains(t, err, want)
		err = ferrywebhook.Verify([]string{secret}, http.Header{}, nil, 0, time.Time{})
		require.ErrorContains(t, err, want)
		require.NotErrorIs(t, err, ferrywebhook.ErrInvalidSignature, "a bad secret is a configuration error")
	}
	_, err := ferrywebhook.Sign(nil, "id", time.Now(), nil)
	require.Error(t, err)
	require.Error(t, ferrywebhook.Verify(nil, http.Header{}, nil, 0, time.Time{}))
}
