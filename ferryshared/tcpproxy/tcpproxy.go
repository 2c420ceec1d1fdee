// Package tcpproxy is a small in-process TCP proxy for fault-injection
// tests: it forwards connections to an upstream address and can reset them
// all (an abrupt close, RST where the platform allows), refuse
// connections for a while, as a network partition or a broker restart
// would look to a client, or hang: a black hole that accepts connections
// and keeps them open but forwards nothing either way, as a peer whose
// process is stuck (or a dropped route) looks, until it resumes.
package tcpproxy

import (
	"errors"
	"net"
	"sync"
	"time"
)

// Proxy forwards connections accepted on its loopback address to an
// upstream address.
type Proxy struct {
	ln       net.Listener
	upstream string

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	down  bool
	// resumed is closed when a Hang ends (nil: not hung); closed when the
	// proxy is.
	resumed chan struct{}
	closed  chan struct{}
	wg      sync.WaitGroup
}

// Start listens on a free loopback port and forwards to upstream.
func Start(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}, closed: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			abort(c)
			continue
		}
		up, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
		if err != nil {
			abort(c)
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

// pipe forwards src to dst, each chunk read only once the proxy is not
// hung.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.passable() {
				break
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
	abort(dst)
	abort(src)
}

// abort closes c at once, discarding unsent data (RST on TCP).
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// passable waits while the proxy is hung; false once it is closed.
func (p *Proxy) passable() bool {
	p.mu.Lock()
	resumed := p.resumed
	p.mu.Unlock()
	if resumed == nil {
		return true
	}
	select {
	case <-resumed:
		return true
	case <-p.closed:
		return false
	}
}

// Hang makes the proxy a black hole until Resume: open connections stay
// open and new ones are accepted, but no byte is forwarded either way (a
// client's writes are taken, up to what the socket buffers hold, and
// never answered).
func (p *Proxy) Hang() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resumed == nil {
		p.resumed = make(chan struct{})
	}
}

// Resume ends a Hang: what was held is forwarded, in order, and the
// connections carry on.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resumed != nil {
		close(p.resumed)
		p.resumed = nil
	}
}

// Reset aborts every open connection; new ones are accepted again.
func (p *Proxy) Reset() {
	p.mu.Lock()
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		abort(c)
	}
}

// Outage aborts every open connection and refuses new ones for d.
func (p *Proxy) Outage(d time.Duration) {
	p.mu.Lock()
	p.down = true
	p.mu.Unlock()
	p.Reset()
	time.Sleep(d)
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

// Close stops listening, aborts every connection and waits for the
// forwarding goroutines.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	} else {
		close(p.closed)
	}
	p.Reset()
	p.wg.Wait()
	return err
}
