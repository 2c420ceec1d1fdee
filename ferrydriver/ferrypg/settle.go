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
	waiters map[uuid.UUID]map[*subscriber]struct{}
	subs    map[*subscriber]struct{}
	ready   chan struct{} // closed once LISTEN is in place
	running bool
	stop    context.CancelFunc
}

// subscriber receives the notifications of its events. When one cannot be
// delivered (its buffer is full) or the hub reconnected (notifications may
// have been lost), dirty is signalled: the caller must read states again.
type subscriber struct {
	notes chan string
	dirty chan struct{}
}

func (s *subscriber) markDirty() {
	select {
	case s.dirty <- struct{}{}:
	default:
	}
}

type hubDriver[TTx any] struct{ d *Driver[TTx] }

func (h hubDriver[TTx]) session(ctx context.Context) (*session, error) { return h.d.session(ctx) }
func (h hubDriver[TTx]) channel() string                               { return h.d.settleChannel() }

// subscribe registers interest in ids and returns a subscriber and a
// cancel function. It returns once the hub listens, so that any
// notification sent after it returned is received.
func (h *settleHub) subscribe(ctx context.Context, ids []uuid.UUID) (*subscriber, func(), error) {
	sub := &subscriber{notes: make(chan string, 2*len(ids)+1), dirty: make(chan struct{}, 1)}
	h.mu.Lock()
	if h.waiters == nil {
		h.waiters = map[uuid.UUID]map[*subscriber]struct{}{}
		h.subs = map[*subscriber]struct{}{}
	}
	for _, id := range ids {
		if h.waiters[id] == nil {
			h.waiters[id] = map[*subscriber]struct{}{}
		}
		h.waiters[id][sub] = struct{}{}
	}
	h.subs[sub] = struct{}{}
	if !h.running {
		hctx, cancel := context.WithCancel(context.Background())
		h.running, h.stop, h.ready = true, cancel, make(chan struct{})
		go h.run(hctx, h.ready)
	}
	ready := h.ready
	h.mu.Unlock()
	cancel := func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, id := range ids {
			delete(h.waiters[id], sub)
			if len(h.waiters[id]) == 0 {
				delete(h.waiters, id)
			}
		}
		delete(h.subs, sub)
		if len(h.subs) == 0 && h.running {
			h.stop()
			h.running = false
		}
	}
	select {
	case <-ready:
		return sub, cancel, nil
	case <-ctx.Done():
		cancel()
		return nil, nil, ctx.Err()
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
			for sub := range h.subs {
				sub.markDirty()
			}
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
			for sub := range h.waiters[id] {
				select {
				case sub.notes <- payload:
				default:
					sub.markDirty()
				}
			}
			h.mu.Unlock()
		}
		sess.close()
	}
}
