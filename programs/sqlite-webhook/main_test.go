package main

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferrysink/ferrywebhook"
)

// TestDeliversEveryOrder: the service's events reach the endpoint, signed,
// each once, each order's in order.
func TestDeliversEveryOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	secret := ferrywebhook.NewSecret()
	var mu sync.Mutex
	got := map[string]int{}
	all := make(chan struct{})
	endpoint := httptest.NewServer(ferrywebhook.Handler([]string{secret}, func(_ context.Context, ev ferryevent.Event) error {
		mu.Lock()
		defer mu.Unlock()
		got[ev.Key]++
		if len(got) == 10 {
			select {
			case <-all:
			default:
				close(all)
			}
		}
		return nil
	}))
	defer endpoint.Close()
	done := make(chan error, 1)
	rctx, stop := context.WithCancel(ctx)
	go func() { done <- run(rctx, filepath.Join(t.TempDir(), "orders.db"), endpoint.URL, secret, 10) }()
	select {
	case <-all:
	case err := <-done:
		t.Fatalf("the service stopped before delivering: %v", err)
	case <-ctx.Done():
		t.Fatalf("10 orders' events were not delivered within a minute: %v", got)
	}
	stop()
	if err := <-done; err != nil && rctx.Err() == nil {
		t.Fatal(err)
	}
	for key, n := range got {
		if n != 1 {
			t.Errorf("order %s's event was delivered %d times", key, n)
		}
	}
}
