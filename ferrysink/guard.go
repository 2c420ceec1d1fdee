package ferrysink

import (
	"context"
	"errors"
	"net"
	"sync"
)

// ErrWriteFenced is what a guarded connection's Write returns when it
// refuses to write: the fence of a message the write may carry has ended.
var ErrWriteFenced = errors.New("ferrysink: write refused: the lease fence of a message it may carry has ended")

// A WriteGuard carries the relay's fence (WithFence) down to a client
// library's network connections. A sink checks the fence right before it
// hands each event to its client, but the client may write the event a
// moment later, from a buffer: a leader paused in between (a long GC
// pause, SIGSTOP, a frozen VM) would write it on resume, after another
// leader took over. Wrap each connection the client dials with Conn, and
// register each event around its hand-off (Call, Arm, then Queued or
// Disarm): every Write then first checks the fence of each event that it
// may carry. When one has ended it writes nothing, closes the connection
// (the client reconnects) and closes the channels Arm returned, so that
// the sink reports every event waiting for an answer as failed (they may
// be stored, or not) rather than waiting for a timeout.
//
// A client that writes an event in the next write after it is buffered
// (nats.go) has the sink call Queued right after the hand-off; a client
// that may hold it longer (franz-go's batches) has the sink call Disarm
// only once the event's outcome is known. What remains is the time
// between the check and the write system call.
//
// The zero value is not usable. A nil *WriteGuard guards no connection;
// its calls still check the fence in Arm.
type WriteGuard struct {
	mu    sync.Mutex
	calls map[*GuardedCall]struct{} // with an event armed or queued
	// dropped is closed when a write is refused, then replaced.
	dropped chan struct{}
}

// NewWriteGuard returns a guard with nothing registered.
func NewWriteGuard() *WriteGuard {
	return &WriteGuard{calls: make(map[*GuardedCall]struct{}), dropped: make(chan struct{})}
}

// Conn wraps c so that each Write first checks the guard.
func (g *WriteGuard) Conn(c net.Conn) net.Conn {
	if g == nil {
		return c
	}
	return &guardedConn{Conn: c, guard: g}
}

// GuardedCall is one Publish call's fence, registered with a guard.
type GuardedCall struct {
	g      *WriteGuard // nil: nothing to register, Arm only checks
	ctx    context.Context
	armed  int // between Arm and Queued or Disarm
	queued int // handed over since the last write
}

// Call returns the registration of a Publish call made with ctx, whose
// fence (if any) every write checks while one of its events is armed or
// queued.
func (g *WriteGuard) Call(ctx context.Context) *GuardedCall {
	return &GuardedCall{g: g, ctx: ctx}
}

// Arm registers an event about to be handed to the client, then checks the
// call's fence (Fenced), in that order, so that no write can slip between
// the check and the registration. When the fence has ended the event is
// not registered and Arm returns the error: the sink must not hand the
// event over. Otherwise it returns a channel closed if a write is refused
// from now on: the event, once handed over, may not have been written, and
// its answer may never come (nil without a guard).
func (c *GuardedCall) Arm() (<-chan struct{}, error) {
	g := c.g
	if g == nil {
		return nil, Fenced(c.ctx)
	}
	g.mu.Lock()
	c.armed++
	g.calls[c] = struct{}{}
	dropped := g.dropped
	g.mu.Unlock()
	if err := Fenced(c.ctx); err != nil {
		c.Disarm()
		return nil, err
	}
	return dropped, nil
}

// Disarm ends an armed event's registration: it was not handed over, or
// its outcome is known.
func (c *GuardedCall) Disarm() {
	g := c.g
	if g == nil {
		return
	}
	g.mu.Lock()
	c.armed--
	if c.armed == 0 && c.queued == 0 {
		delete(g.calls, c)
	}
	g.mu.Unlock()
}

// Queued moves an armed event to the client's write buffer: the next write
// carries it (or an earlier one did), and the event counts as written once
// that write has been checked.
func (c *GuardedCall) Queued() {
	g := c.g
	if g == nil {
		return
	}
	g.mu.Lock()
	c.armed--
	c.queued++
	g.mu.Unlock()
}

// mayWrite checks the fence of every call with an event armed or queued.
// Either way, queued events count as gone: written, or dropped with the
// client's buffer (a client resets its buffer, or its connection, when a
// write fails).
func (g *WriteGuard) mayWrite() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	ok := true
	for c := range g.calls {
		if Fenced(c.ctx) != nil {
			ok = false
			break
		}
	}
	for c := range g.calls {
		c.queued = 0
		if c.armed == 0 {
			delete(g.calls, c)
		}
	}
	if !ok {
		close(g.dropped)
		g.dropped = make(chan struct{})
	}
	return ok
}

type guardedConn struct {
	net.Conn
	guard *WriteGuard
}

func (c *guardedConn) Write(p []byte) (int, error) {
	if !c.guard.mayWrite() {
		c.Conn.Close()
		return 0, ErrWriteFenced
	}
	return c.Conn.Write(p)
}
