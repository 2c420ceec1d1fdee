package main

import (
	"context"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrysink/ferrywebhook"
)

// TestRelayToWebhook runs `ferry relay --sink-url http://...` against a
// receiver built on ferrywebhook.Handler with the same secret: every event
// arrives signed, once, in key order.
func TestRelayToWebhook(t *testing.T) {
	secret := ferrywebhook.NewSecret()
	t.Setenv("FERRY_WEBHOOK_SECRETS", secret)
	var mu sync.Mutex
	got := map[string][]int64{}
	ids := map[string]bool{}
	srv := httptest.NewServer(ferrywebhook.Handler([]string{secret}, func(_ context.Context, ev ferry.Event) error {
		mu.Lock()
		defer mu.Unlock()
		if !ids[ev.ID.String()] {
			ids[ev.ID.String()] = true
			got[ev.Key] = append(got[ev.Key], ev.Seq)
		}
		return nil
	}))
	defer srv.Close()

	f := newFixture(t)
	f.sinkArgs = []string{"--sink-url", srv.URL + "/hooks/ferry"}
	relay := f.startRelay("webhook")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	emitted := f.produce(ctx, 300, 20, 4, 1000)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ids) == len(emitted)
	}, 30*time.Second, 20*time.Millisecond)
	relay.stop(t)
	for key, seqs := range got {
		for i, s := range seqs {
			require.EqualValues(t, i+1, s, "key %s out of order: %v", key, seqs)
		}
	}
}
