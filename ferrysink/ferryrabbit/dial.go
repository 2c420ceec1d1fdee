package ferryrabbit

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// dial connects to rawURL within timeout and ctx, TCP, TLS and AMQP
// handshakes included. base, when not nil, is the caller's connection
// configuration; name becomes the connection_name client property unless
// base sets one.
func dial(ctx context.Context, rawURL string, base *amqp.Config, name string, timeout time.Duration) (*amqp.Connection, error) {
	var cfg amqp.Config
	if base != nil {
		cfg = *base
		if cfg.TLSClientConfig != nil {
			cfg.TLSClientConfig = cfg.TLSClientConfig.Clone() // amqp091 sets its ServerName
		}
	}
	if cfg.Properties == nil {
		cfg.Properties = amqp.NewConnectionProperties()
	} else {
		cfg.Properties = maps.Clone(cfg.Properties)
	}
	if _, ok := cfg.Properties["connection_name"]; !ok && name != "" {
		cfg.Properties["connection_name"] = name
	}

	// The handshake is bounded by a deadline on the socket, which amqp091
	// clears once the connection is open, and cut short when ctx ends.
	var (
		mu     sync.Mutex
		socket net.Conn
	)
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	userDial := cfg.Dial
	cfg.Dial = func(network, addr string) (net.Conn, error) {
		var (
			c   net.Conn
			err error
		)
		if userDial != nil {
			c, err = userDial(network, addr)
		} else {
			d := net.Dialer{Deadline: deadline}
			c, err = d.DialContext(ctx, network, addr)
		}
		if err != nil {
			return nil, err
		}
		if err := c.SetDeadline(deadline); err != nil {
			_ = c.Close()
			return nil, err
		}
		mu.Lock()
		socket = c
		mu.Unlock()
		return c, nil
	}
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if socket != nil {
			_ = socket.SetDeadline(time.Unix(1, 0)) // fails the handshake at once
		}
	})
	conn, err := amqp.DialConfig(rawURL, cfg)
	if !stop() {
		// ctx ended during the handshake: the deadline set above may have
		// broken the connection even if the handshake completed.
		if err == nil {
			_ = conn.Close()
		}
		return nil, context.Cause(ctx)
	}
	if err != nil {
		return nil, err
	}
	return conn, nil
}

// redact returns rawURL with its password replaced, for messages and logs.
func redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// amqpError returns the *amqp.Error err wraps, or nil.
func amqpError(err error) *amqp.Error {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		return ae
	}
	return nil
}

// hasCode reports whether err is (or wraps) an AMQP error with that reply
// code.
func hasCode(err error, code int) bool {
	ae := amqpError(err)
	return ae != nil && ae.Code == code
}

// closeChannel closes ch, ignoring the error of a channel the broker
// already closed.
func closeChannel(ch *amqp.Channel) {
	if ch != nil && !ch.IsClosed() {
		_ = ch.Close()
	}
}

// closeConn closes conn gracefully, waiting at most until deadline for the
// broker's answer. Closing a connection closes its channels.
func closeConn(conn *amqp.Connection, deadline time.Time) error {
	if conn == nil || conn.IsClosed() {
		return nil
	}
	err := conn.CloseDeadline(deadline)
	if errors.Is(err, amqp.ErrClosed) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("close the RabbitMQ connection: %w", err)
	}
	return nil
}
