package ferrywebhook

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferryevent"
)

func TestPercentEncoding(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                      "",
		"OrderPlaced":           "OrderPlaced",
		"urn:service:billing":   "urn:service:billing",
		"a b":                   "a%20b",
		`say "hi" 100%`:         "say%20%22hi%22%20100%25",
		"ü€":                    "%C3%BC%E2%82%AC",
		"tab\there\r\n":         "tab%09here%0D%0A",
		"~!#$&'()*+,/:;=?@[]^{": "~!#$&'()*+,/:;=?@[]^{",
	} {
		require.Equal(t, want, percentEncode(in), "encode %q", in)
		back, err := percentDecode(want)
		require.NoError(t, err)
		require.Equal(t, in, back, "decode %q", want)
	}
	back, err := percentDecode("%c3%bc") // lower-case hex is read too
	require.NoError(t, err)
	require.Equal(t, "ü", back)
	for _, bad := range []string{"%", "%4", "%zz", "%FF", "a%C3", "\xff"} {
		_, err := percentDecode(bad)
		require.Error(t, err, "%q", bad)
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 3, 30, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Duration{
		"0":                              0,
		"1":                              time.Second,
		" 120 ":                          2 * time.Minute,
		"Sun, 30 Mar 2025 12:00:30 GMT":  30 * time.Second,
		"Sunday, 30-Mar-25 12:01:00 GMT": time.Minute,
		"Sun Mar 30 12:00:05 2025":       5 * time.Second,
		"Sun, 30 Mar 2025 11:00:00 GMT":  0, // in the past
		"99999999999999999999":           0, // overflows: not a number
		"18446744073709551615":           time.Duration(1<<63 - 1).Truncate(time.Second),
	} {
		got, ok := parseRetryAfter(in, now)
		if in == "99999999999999999999" {
			require.False(t, ok, in)
			continue
		}
		require.True(t, ok, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "-1", "1.5", "soon", "Sun, 30 Mar 2025"} {
		_, ok := parseRetryAfter(bad, now)
		require.False(t, ok, bad)
	}
}

func TestReadExcerpt(t *testing.T) {
	t.Parallel()
	require.Equal(t, "", readExcerpt(strings.NewReader("")))
	require.Equal(t, "no such hook", readExcerpt(strings.NewReader("  no such\r\n\thook\n")))
	require.Equal(t, "bad \uFFFD byte and nul", readExcerpt(strings.NewReader("bad \xff byte\x00and nul")))

	long := strings.Repeat("a", excerptBytes-1) + "€ tail"
	got := readExcerpt(strings.NewReader(long))
	require.True(t, utf8.ValidString(got))
	require.Equal(t, strings.Repeat("a", excerptBytes-1)+"…", got, "a rune cut at the limit is dropped")

	exact := strings.Repeat("b", excerptBytes)
	require.Equal(t, exact, readExcerpt(strings.NewReader(exact)))
	require.Equal(t, exact+"…", readExcerpt(strings.NewReader(exact+"c")))
}

func TestConfigTransient(t *testing.T) {
	t.Parallel()
	c := (&Config{TransientStatus: []int{404}}).WithDefaults()
	for code, want := range map[int]bool{408: true, 429: true, 500: true, 503: true, 599: true, 404: true, 400: false, 410: false, 302: false, 422: false} {
		require.Equal(t, want, c.transient(code), "%d", code)
	}
}

// FuzzDecode feeds arbitrary attribute values and bodies to the decoder:
// it must never panic, and whatever it accepts must encode and decode to
// the same event.
func FuzzDecode(f *testing.F) {
	f.Add("0190a6c4-2f5e-7b3a-9c1d-1234567890ab", "orders", "order-1", "OrderPlaced", "2025-03-30T01:59:58.123456Z", "3", "traceparent,X-Tenant", "acme", []byte(`{}`))
	f.Add("%zz", "", "", "", "", "-1", ",,", "", []byte(nil))
	f.Add("0190a6c4-2f5e-7b3a-9c1d-1234567890ab", "a%20b", "%C3%BC", "T", "2025-03-30T01:59:58Z", "", "ce-id,Webhook-Id,x y", "v", []byte{0, 1, 2})
	f.Fuzz(func(t *testing.T, id, topic, key, typ, ts, seq, list, value string, body []byte) {
		h := http.Header{}
		h.Set("Ce-Specversion", "1.0")
		h.Set("Ce-Id", id)
		h.Set("Ce-Source", "fuzz")
		h.Set("Ce-Type", typ)
		h.Set("Ce-Subject", key)
		h.Set("Ce-Time", ts)
		h.Set("Ce-Ferrytopic", topic)
		h.Set("Ce-Ferrykeyseq", seq)
		h.Set(HeaderList, list)
		for name := range strings.SplitSeq(list, ",") {
			if ferryevent.IsToken(name) {
				h.Set(name, value)
			}
		}
		ev, err := decode(h, body)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformed)
			return
		}
		if ferryevent.Validate(&ev, 0, 1<<30) != nil || !validHeaderValue(value) {
			return // not an event Ferry would send
		}
		again, err := encodeHeader(&ev, nil)
		require.NoError(t, err)
		back, err := decode(again, ev.Payload)
		require.NoError(t, err)
		require.Equal(t, ev.ID, back.ID)
		require.Equal(t, ev.Key, back.Key)
		require.Equal(t, ev.Topic, back.Topic)
		require.Equal(t, ev.Type, back.Type)
		require.Equal(t, ev.Seq, back.Seq)
		require.Equal(t, ev.Headers, back.Headers)
		require.True(t, ev.CreatedAt.Equal(back.CreatedAt))
		require.True(t, bytes.Equal(ev.Payload, back.Payload))
	})
}

// FuzzPercentEncoding checks that every UTF-8 string survives the
// attribute encoding and that the encoded form is a valid header value.
func FuzzPercentEncoding(f *testing.F) {
	for _, s := range []string{"", "a b", "ü%\"", "\x00\x7f", "клиент-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		enc := percentEncode(s)
		for i := 0; i < len(enc); i++ {
			require.False(t, mustEscape(enc[i]) && enc[i] != '%', "%q holds %q", enc, enc[i])
		}
		back, err := percentDecode(enc)
		if !utf8.ValidString(s) {
			require.Error(t, err)
			return
		}
		require.NoError(t, err)
		require.Equal(t, s, back)
	})
}

// FuzzVerify must never panic, whatever the headers hold.
func FuzzVerify(f *testing.F) {
	f.Add("msg_1", "1614265330", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", []byte(`{"test": 2432232314}`))
	f.Add("", "-99999999999999999999", "v1, v1,,,", []byte(nil))
	keys, err := parseSecrets([]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, id, ts, sig string, body []byte) {
		h := http.Header{}
		h.Set(HeaderID, id)
		h.Set(HeaderTimestamp, ts)
		h.Set(HeaderSignature, sig)
		_ = verify(keys, h, body, 0, time.Unix(1614265330, 0))
	})
}
