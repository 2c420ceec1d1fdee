package ferrywebhook_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryshared/tcpproxy"
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/ferry-dev/ferry/ferrysink/ferrysinktest"
	"github.com/ferry-dev/ferry/ferrysink/ferrywebhook"
)

// unrouted is the topic the conformance receiver has no route for: it
// answers 404 on its path, which fails the event permanently.
const unrouted = "unrouted"

// routeByTopic is the receiver's routing: everything but unrouted's path
// reaches the Handler.
func routeByTopic(w http.ResponseWriter, r *http.Request) bool {
	if r.URL.Path == "/events/"+unrouted {
		http.Error(w, "no route for topic "+unrouted, http.StatusNotFound)
		return true
	}
	return false
}

// topicEndpoint sends each event to <base>/events/<topic>.
func topicEndpoint(base string) func(ev *ferryevent.Event) string {
	return func(ev *ferryevent.Event) string {
		return base + "/events/" + url.PathEscape(ev.Topic)
	}
}

func TestConformance(t *testing.T) {
	t.Parallel()
	ferrysinktest.Exercise(t, ferrysinktest.Harness{
		Features: ferrysinktest.Features{
			// The receiver keeps every copy it is sent: it deduplicates
			// nothing, as a plain webhook endpoint does not.
			MaxPayloadBytes: ferrywebhook.DefaultMaxBodyBytes,
			UnroutableTopic: unrouted,
		},
		New: func(t *testing.T) (ferrysink.Sink, ferrysinktest.ReadFunc) {
			rc := newReceiver(t, []string{secret}, routeByTopic)
			sink, err := ferrywebhook.New(&ferrywebhook.Config{
				Endpoint: topicEndpoint(rc.srv.URL),
				Secrets:  []string{secret},
			})
			require.NoError(t, err)
			return sink, rc.read
		},
		// The sink reaches the receiver through a proxy whose connections
		// are cut, and refused, for a moment.
		NewFaulty: func(t *testing.T) (ferrysink.Sink, ferrysinktest.ReadFunc, func()) {
			rc := newReceiver(t, []string{secret}, routeByTopic)
			proxy, err := tcpproxy.Start(strings.TrimPrefix(rc.srv.URL, "http://"))
			require.NoError(t, err)
			t.Cleanup(func() { _ = proxy.Close() })
			sink, err := ferrywebhook.New(&ferrywebhook.Config{
				URL:       "http://" + proxy.Addr() + "/events/orders",
				Secrets:   []string{secret},
				Timeout:   2 * time.Second,
				RetryBase: 20 * time.Millisecond,
			})
			require.NoError(t, err)
			return sink, rc.read, func() { proxy.Outage(200 * time.Millisecond) }
		},
	})
}
