package ferrypg

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// settleHub multiplexes one LISTEN connection among every AwaitSettled
// call of a driver. Finishing an awaited event notifies "<schema>.settle"
// with "<event id>:<state>"; the hub routes it to the callers waiting for
// that event. The connection is opened on first use and closed once no one
// has waited for hubIdle, so that sporadic callers share it too.
type settleHub struct {
	d interface {
		session(ctx context.Context) (*session, error)
		checkSession(ctx context.Context, s *session) error
		channel() string
		logger() *slog.Logger
	}

	mu      sync.Mutex
	waiters map[uuid.UUID]map[*subscriber]struct{}
	subs    map[*subscriber]struct{}
	ready   chan struct{} // closed once LISTEN is in place
	running bool
	stop    context.CancelFunc
	idle    *time.Timer // stops the hub when it fires with no subscriber
	// lastErr is why the hub could not listen, while it cannot.
	lastErr error
	// fatal is why the hub stopped trying (its connections are no
	// sessions): returned to subscribers at once.
	fatal error
	// sessions counts the listening sessions opened (tests read it).
	sessions int
}

// hubIdle is how long the hub keeps listening with no one waiting.
const hubIdle = 30 * time.Second

// errNotListening: the hub has not listened since it started.
var errNotListening = errors.New("ferrypg: the settlement listener could not LISTEN")

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
func (h hubDriver[TTx]) checkSession(ctx context.Context, s *session) error {
	return h.d.checkSession(ctx, s, "AwaitSettled's settlement listener")
}
func (h hubDriver[TTx]) channel() string      { return h.d.settleChannel() }
func (h hubDriver[TTx]) logger() *slog.Logger { return h.d.cfg.Logger }

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
	if h.idle != nil {
		h.idle.Stop()
		h.idle = nil
	}
	if !h.running {
		hctx, cancel := context.WithCancel(context.Background())
		h.running, h.stop, h.ready, h.lastErr, h.fatal = true, cancel, make(chan struct{}), nil, nil
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
		if len(h.subs) == 0 && h.running && h.idle == nil {
			h.idle = time.AfterFunc(hubIdle, h.stopIfIdle)
		}
	}
	select {
	case <-ready:
		h.mu.Lock()
		fatal := h.fatal
		h.mu.Unlock()
		if fatal != nil {
			cancel()
			return nil, nil, fatal
		}
		return sub, cancel, nil
	case <-ctx.Done():
		h.mu.Lock()
		lastErr := h.lastErr
		h.mu.Unlock()
		cancel()
		if lastErr != nil {
			return nil, nil, fmt.Errorf("%w: %w", errNotListening, lastErr)
		}
		return nil, nil, ctx.Err()
	}
}

// stopIfIdle stops the hub if no one subscribed since it went idle.
func (h *settleHub) stopIfIdle() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.idle = nil
	if len(h.subs) == 0 && h.running {
		h.stop()
		h.running = false
	}
}

// run keeps a listening session and dispatches notifications until ctx ends.
func (h *settleHub) run(ctx context.Context, ready chan struct{}) {
	first := true
	failures := 0
	var nextLog time.Time
	for ctx.Err() == nil {
		sess, err := h.d.session(ctx)
		if err == nil {
			if err = h.d.checkSession(ctx, sess); errors.Is(err, ferrydriver.ErrMisconfigured) {
				// Retrying cannot help: fail every caller now and stop;
				// the next caller starts the hub, and the check, again.
				sess.close()
				h.mu.Lock()
				h.fatal, h.running = err, false
				h.stop()
				if h.idle != nil {
					h.idle.Stop()
					h.idle = nil
				}
				h.mu.Unlock()
				if first {
					close(ready)
				}
				return
			}
		}
		if err == nil {
			_, err = sess.exec.exec(ctx, "LISTEN "+pgx.Identifier{h.d.channel()}.Sanitize())
		}
		if err != nil && sess != nil {
			sess.close()
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			h.mu.Lock()
			h.lastErr = err
			h.mu.Unlock()
			// Logged with backoff: the first failure, then at most every
			// minute while it lasts.
			if now := time.Now(); now.After(nextLog) {
				nextLog = now.Add(time.Minute)
				h.d.logger().Warn("ferrypg: the settlement listener cannot LISTEN; AwaitSettled fails after its deadline until it can",
					"channel", h.d.channel(), "failures", failures, "err", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(min(200*time.Millisecond<<min(failures-1, 5), 5*time.Second)):
			}
			continue
		}
		h.mu.Lock()
		h.lastErr = nil
		h.sessions++
		h.mu.Unlock()
		if failures > 0 {
			h.d.logger().Info("ferrypg: the settlement listener listens again", "channel", h.d.channel(), "failures", failures)
			failures = 0
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
