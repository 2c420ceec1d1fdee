package ferrysink_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrysink"
)

// guardedPipe returns a guarded client end of a pipe and a function that
// reads what the other end received so far.
func guardedPipe(t *testing.T, g *ferrysink.WriteGuard) (net.Conn, func() string) {
	t.Helper()
	client, server := net.Pipe()
	t.Cleanup(func() { client.Close(); server.Close() })
	got := make(chan []byte, 100)
	go func() {
		buf := make([]byte, 1024)
		for {
			n, err := server.Read(buf)
			if n > 0 {
				got <- append([]byte(nil), buf[:n]...)
			}
			if err != nil {
				close(got)
				return
			}
		}
	}()
	received := func() string {
		var s string
		for {
			select {
			case b, ok := <-got:
				if !ok {
					return s
				}
				s += string(b)
			case <-time.After(50 * time.Millisecond):
				return s
			}
		}
	}
	return g.Conn(client), received
}

// lease is a fence that holds until ended.
type lease struct{ ended atomic.Bool }

func (l *lease) fence() error {
	if l.ended.Load() {
		return errors.New("lease lost")
	}
	return nil
}

func TestWriteGuardRefusesAWriteCarryingAQueuedEventWhoseFenceEnded(t *testing.T) {
	g := ferrysink.NewWriteGuard()
	conn, received := guardedPipe(t, g)
	var l lease
	call := g.Call(ferrysink.WithFence(context.Background(), l.fence))

	// Handed over under a fence that holds, written: goes through.
	arm(t, call)
	call.Queued()
	_, err := conn.Write([]byte("one;"))
	require.NoError(t, err)
	require.Equal(t, "one;", received())

	// Handed over, then the leader pauses and loses the lease before the
	// client writes its buffer.
	dropped := arm(t, call)
	call.Queued()
	l.ended.Store(true)
	n, err := conn.Write([]byte("two;"))
	require.ErrorIs(t, err, ferrysink.ErrWriteFenced)
	require.Zero(t, n)
	require.Empty(t, received(), "nothing of the refused write reaches the peer")
	select {
	case <-dropped:
	default:
		t.Fatal("the events waiting for an answer were not told")
	}
	_, err = conn.Write([]byte("three;"))
	require.Error(t, err, "the connection is closed: the client reconnects")
}

func TestWriteGuardForgetsQueuedEventsOnceWritten(t *testing.T) {
	g := ferrysink.NewWriteGuard()
	conn, received := guardedPipe(t, g)
	var stale, live lease
	old := g.Call(ferrysink.WithFence(context.Background(), stale.fence))
	arm(t, old)
	old.Queued()
	_, err := conn.Write([]byte("old;"))
	require.NoError(t, err)
	// The old leader's event is written; its fence ending later does not
	// hold back another call's writes.
	stale.ended.Store(true)
	cur := g.Call(ferrysink.WithFence(context.Background(), live.fence))
	arm(t, cur)
	cur.Queued()
	_, err = conn.Write([]byte("new;"))
	require.NoError(t, err)
	require.Equal(t, "old;new;", received())
}

// A client that holds events in its own batches (franz-go) keeps them
// armed until their outcome: every write meanwhile checks their fence.
func TestWriteGuardChecksArmedEventsUntilDisarmed(t *testing.T) {
	g := ferrysink.NewWriteGuard()
	conn, received := guardedPipe(t, g)
	var l lease
	call := g.Call(ferrysink.WithFence(context.Background(), l.fence))
	arm(t, call)
	_, err := conn.Write([]byte("metadata;"))
	require.NoError(t, err, "a write while the fence holds")
	l.ended.Store(true)
	_, err = conn.Write([]byte("produce;"))
	require.ErrorIs(t, err, ferrysink.ErrWriteFenced)
	require.Equal(t, "metadata;", received())

	// Once the event's outcome is known, it no longer counts.
	call.Disarm()
	conn2, received2 := guardedPipe(t, g)
	_, err = conn2.Write([]byte("next;"))
	require.NoError(t, err)
	require.Equal(t, "next;", received2())
}

func TestNilWriteGuardGuardsNothing(t *testing.T) {
	var g *ferrysink.WriteGuard
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	require.Same(t, client, g.Conn(client))
	dropped, err := g.Call(context.Background()).Arm()
	require.NoError(t, err)
	require.Nil(t, dropped)
	var l lease
	l.ended.Store(true)
	_, err = g.Call(ferrysink.WithFence(context.Background(), l.fence)).Arm()
	require.ErrorContains(t, err, "lease lost", "without a guard Arm still checks the fence")
}

// Arm checks the fence after registering: an ended fence is refused there
// and leaves nothing registered to hold later writes back.
func TestWriteGuardArmRefusesAnEndedFence(t *testing.T) {
	g := ferrysink.NewWriteGuard()
	conn, received := guardedPipe(t, g)
	var l lease
	l.ended.Store(true)
	_, err := g.Call(ferrysink.WithFence(context.Background(), l.fence)).Arm()
	require.ErrorContains(t, err, "not handed over: lease lost")
	_, err = conn.Write([]byte("other;"))
	require.NoError(t, err)
	require.Equal(t, "other;", received())
}

// arm arms an event of call under a fence that holds.
func arm(t *testing.T, call *ferrysink.GuardedCall) <-chan struct{} {
	t.Helper()
	dropped, err := call.Arm()
	require.NoError(t, err)
	return dropped
}
