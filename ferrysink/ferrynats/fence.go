package ferrynats

import (
	"errors"
	"net"

	"github.com/nats-io/nats.go"

	"github.com/ferry-dev/ferry/ferrysink"
)

// WriteFence returns a connection option that carries the relay's lease
// fence down to the socket. Connect the sink's connection with it:
//
//	nc, err := nats.Connect(url, ferrynats.WriteFence())
//
// Without it, the sink checks the fence (ferrysink.WithFence) before it
// hands each message to nats.go, which buffers the message and writes it
// a moment later. A leader paused in between (a long GC pause, SIGSTOP, a
// frozen VM) writes what it had buffered when it resumes, perhaps long
// after another leader took over and the stream's duplicate window ended:
// JetStream then stores those messages a second time. With WriteFence,
// every write to the socket first checks the fence of each message not yet
// written; when one has ended, the write is dropped and the connection
// closed, nats.go reconnects, and the other messages in that write are
// failed at once (as transient errors: the relay publishes them again, and
// JetStream drops a copy within the duplicate window). What is left is the
// time between that check and the write system call.
//
// WriteFence also turns off nats.go's reconnect buffer
// (nats.ReconnectBufSize(-1)), which would write messages after a
// reconnection without such a check: while the connection is down, a
// publish fails at once and the relay retries it.
//
// It installs a custom dialer: pass it after any nats.SetCustomDialer,
// whose dialer it then wraps, and not before (which would replace it).
// Use the connection for the sink only: other publishers on it lose the
// reconnect buffer too.
func WriteFence() nats.Option {
	return func(o *nats.Options) error {
		inner := o.CustomDialer
		if inner == nil {
			timeout := o.Timeout
			if timeout <= 0 {
				timeout = nats.DefaultTimeout
			}
			inner = &net.Dialer{Timeout: timeout}
		}
		o.CustomDialer = &fencedDialer{inner: inner, guard: ferrysink.NewWriteGuard()}
		o.ReconnectBufSize = -1
		return nil
	}
}

// guardOf returns the write guard of a connection made with WriteFence, or
// nil.
func guardOf(nc *nats.Conn) *ferrysink.WriteGuard {
	if d, ok := nc.Opts.CustomDialer.(*fencedDialer); ok {
		return d.guard
	}
	return nil
}

// fencedDialer dials with inner and wraps each connection in guard.
type fencedDialer struct {
	inner nats.CustomDialer
	guard *ferrysink.WriteGuard
}

func (d *fencedDialer) Dial(network, address string) (net.Conn, error) {
	c, err := d.inner.Dial(network, address)
	if err != nil {
		return nil, err
	}
	return d.guard.Conn(c), nil
}

// SkipTLSHandshake forwards the wrapped dialer's answer (see
// nats.CustomDialer).
func (d *fencedDialer) SkipTLSHandshake() bool {
	s, ok := d.inner.(interface{ SkipTLSHandshake() bool })
	return ok && s.SkipTLSHandshake()
}

// errAckDropped is the outcome of a message whose write was refused, or
// that was waiting for its acknowledgement when a write was refused.
var errAckDropped = errors.New("a write on the connection was refused because a lease fence had ended, and the acknowledgement will not come (the event may be stored: a retry within the duplicate window is dropped as a duplicate)")
