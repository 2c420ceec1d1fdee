package ferrypg

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// settleHub multiplexes one LISTEN connection among every AwaitSettled
// call of a driver. Finishing an awaited event notifies "<schema>.settle"
// with "<event id>:<state>"; the hub routes it to the callers waiting for
// that event. The connection is opened on first use and closed when no one
// waits.
type settleHub struct {
	d interface {
		session(ctx context.Context) (*session, error)
		channel() string
	}

	mu      sync.Mutex
	waiters map[uuid.UUID]map[chan string]struct{}
	// resync is closed (and replaced) when the connection was lost:
	// notifications may have been missed, callers must read again.
	resync  chan struct{}
	ready   chan struct{} // closed once LISTEN is in place
	running bool
	stop    context.CancelFunc
	count   int
}

type hubDriver[TTx any] struct{ d *Driver[TTx] }

func (h hubDriver[TTx]) session(ctx context.Context) (*session, error) { return h.d.session(ctx) }
func (h hubDriver[TTx]) channel() string                               { return h.d.settleChannel() }

// subscribe registers interest in ids and returns a channel of their
// notifications (payloads), the current resync channel, and a cancel
// function. It returns once the hub listens, so that any notification sent
// after it returned is received.
func (h *settleHub) subscribe(ctx context.Context, ids []uuid.UUID) (<-chan string, <-chan struct{}, func(), error) {
	ch := make(chan string, len(ids))
	h.mu.Lock()
	if h.waiters == nil {
		h.waiters = map[uuid.UUID]map[chan string]struct{}{}
	}
	for _, id := range ids {
		if h.waiters[id] == nil {
			h.waiters[id] = map[chan string]struct{}{}
		}
		h.waiters[id][ch] = struct{}{}
	}
	h.count++
	if !h.running {
		hctx, cancel := context.WithCancel(context.Background())
		h.running, h.stop, h.ready, h.resync = true, cancel, make(chan struct{}), make(chan struct{})
		go h.run(hctx, h.ready)
	}
	ready, resync := h.ready, h.resync
	h.mu.Unlock()
	cancel := func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, id := range ids {
			delete(h.waiters[id], ch)
			if len(h.waiters[id]) == 0 {
				delete(h.waiters, id)
			}
		}
		h.count--
		if h.count == 0 && h.running {
			h.stop()
			h.running = false
		}
	}
	select {
	case <-ready:
		return ch, resync, cancel, nil
	case <-ctx.Done():
		cancel()
		return nil, nil, nil, ctx.Err()
	}
}

// run keeps a listening session and dispatches notifications until ctx ends.
func (h *settleHub) run(ctx context.Context, ready chan struct{}) {
	first := true
	for ctx.Err() == nil {
		sess, err := h.d.session(ctx)
		if err == nil {
			_, err = sess.exec.exec(ctx, "LISTEN "+pgx.Identifier{h.d.channel()}.Sanitize())
			if err != nil {
				sess.close()
			}
		}
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		if first {
			close(ready)
			first = false
		} else {
			// Reconnected: whatever was sent meanwhile is lost; tell the
			// callers to read their events' states again.
			h.mu.Lock()
			close(h.resync)
			h.resync = make(chan struct{})
			h.mu.Unlock()
		}
		for ctx.Err() == nil {
			payload, err := sess.wait(ctx)
			if err != nil {
				break
			}
			idText, _, _ := strings.Cut(payload, ":")
			id, err := uuid.Parse(idText)
			if err != nil {
				continue
			}
			h.mu.Lock()
			for ch := range h.waiters[id] {
				select {
				case ch <- payload:
				default: // the channel holds one slot per awaited event
				}
			}
			h.mu.Unlock()
		}
		sess.close()
	}
}
