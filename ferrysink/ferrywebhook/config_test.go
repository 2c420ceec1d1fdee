package ferrywebhook_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink/ferrywebhook"
)

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	route := func(*ferryevent.Event) string { return "" }
	for name, tc := range map[string]struct {
		cfg  *ferrywebhook.Config
		want string
	}{
		"nil":             {nil, "Config.URL is empty"},
		"no url":          {&ferrywebhook.Config{Secrets: []string{secret}}, "Config.URL is empty"},
		"url and route":   {&ferrywebhook.Config{URL: "https://x", Endpoint: route, Secrets: []string{secret}}, "both Config.URL and Config.Endpoint"},
		"relative url":    {&ferrywebhook.Config{URL: "/hook", Secrets: []string{secret}}, "not an http or https URL"},
		"ftp url":         {&ferrywebhook.Config{URL: "ftp://u:pw@x/hook", Secrets: []string{secret}}, `"ftp://x/hook" is not an http or https URL`},
		"no host":         {&ferrywebhook.Config{URL: "https:///hook", Secrets: []string{secret}}, "has no host"},
		"bad url":         {&ferrywebhook.Config{URL: "https://u:pw@x/%zz", Secrets: []string{secret}}, "Config.URL: not a valid URL"},
		"no secret":       {&ferrywebhook.Config{URL: "https://x"}, "Config.Secrets is empty"},
		"both":            {&ferrywebhook.Config{URL: "https://x", Secrets: []string{secret}, Unsigned: true}, "remove one of them"},
		"bad secret":      {&ferrywebhook.Config{URL: "https://x", Secrets: []string{secret, "hunter2"}}, "secret 2 of 2"},
		"reserved header": {&ferrywebhook.Config{URL: "https://x", Unsigned: true, Header: http.Header{"Webhook-Id": {"x"}}}, `"Webhook-Id" is written by Ferry`},
		"content-type":    {&ferrywebhook.Config{URL: "https://x", Unsigned: true, Header: http.Header{"Content-Type": {"x"}}}, "Event.ContentType"},
		"header name":     {&ferrywebhook.Config{URL: "https://x", Unsigned: true, Header: http.Header{"X Y": {"x"}}}, "not a valid HTTP header name"},
		"header value":    {&ferrywebhook.Config{URL: "https://x", Unsigned: true, Header: http.Header{"X-Y": {"a\nb"}}}, "control character"},
		"timeout":         {&ferrywebhook.Config{URL: "https://x", Unsigned: true, Timeout: -1}, "Config.Timeout"},
		"attempts":        {&ferrywebhook.Config{URL: "https://x", Unsigned: true, MaxAttempts: -1}, "Config.MaxAttempts"},
		"retry":           {&ferrywebhook.Config{URL: "https://x", Unsigned: true, RetryBase: time.Minute}, "Config.RetryBase"},
		"retry after":     {&ferrywebhook.Config{URL: "https://x", Unsigned: true, MaxRetryAfter: -1}, "Config.MaxRetryAfter"},
		"in flight":       {&ferrywebhook.Config{URL: "https://x", Unsigned: true, MaxInFlight: -1}, "Config.MaxInFlight"},
		"body":            {&ferrywebhook.Config{URL: "https://x", Unsigned: true, MaxBodyBytes: -1}, "Config.MaxBodyBytes"},
		"status":          {&ferrywebhook.Config{URL: "https://x", Unsigned: true, TransientStatus: []int{204}}, "Config.TransientStatus"},
	} {
		_, err := ferrywebhook.New(tc.cfg)
		require.ErrorContains(t, err, tc.want, name)
		require.NotContains(t, err.Error(), "pw@", "%s: credentials stay out of errors", name)
	}

	c := (&ferrywebhook.Config{}).WithDefaults()
	require.Equal(t, ferrywebhook.DefaultTimeout, c.Timeout)
	require.Equal(t, ferrywebhook.DefaultMaxAttempts, c.MaxAttempts)
	require.Equal(t, ferrywebhook.DefaultMaxInFlight, c.MaxInFlight)
	require.Equal(t, ferrywebhook.DefaultMaxBodyBytes, c.MaxBodyBytes)
	require.Equal(t, ferrywebhook.DefaultMaxRetryAfter, c.MaxRetryAfter)
	require.Equal(t, ferrywebhook.DefaultRetryBase, c.RetryBase)
	require.Equal(t, ferrywebhook.DefaultRetryMax, c.RetryMax)
}
