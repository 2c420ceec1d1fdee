package ferry_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrysink"
	"github.com/stretchr/testify/require"
)

// sharedSource is a source of n shares that records which consumer runs
// which share, and fails the test if two run one share at once.
type sharedSource struct {
	t  *testing.T
	n  int
	mu sync.Mutex
	// readers[i] is the consumers running share i now.
	readers map[int]map[string]bool
}

func (s *sharedSource) ReaderName() string { return "test/shared" }
func (s *sharedSource) Shares() int        { return s.n }
func (s *sharedSource) Run(context.Context, func(context.Context, []*ferry.Event) error) error {
	return errors.New("a shared source is run share by share")
}

// source returns the source as consumer who sees it.
func (s *sharedSource) source(who string) ferrysink.Source { return sharedAs{s, who} }

type sharedAs struct {
	*sharedSource
	who string
}

func (s sharedAs) RunShare(ctx context.Context, i int, _ func(context.Context, []*ferry.Event) error) error {
	s.mu.Lock()
	if s.readers[i] == nil {
		s.readers[i] = map[string]bool{}
	}
	s.readers[i][s.who] = true
	if len(s.readers[i]) > 1 {
		s.t.Errorf("share %d is read by %v at once", i, s.readers[i])
	}
	s.mu.Unlock()
	<-ctx.Done()
	s.mu.Lock()
	delete(s.readers[i], s.who)
	s.mu.Unlock()
	return nil
}

// held returns how many shares each consumer reads now, and how many
// shares are read.
func (s *sharedSource) held() (map[string]int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out, read := map[string]int{}, 0
	for _, rs := range s.readers {
		for who := range rs {
			out[who]++
		}
		if len(rs) > 0 {
			read++
		}
	}
	return out, read
}

// TestConsumeBalancesShares: consumers that run Consume on one shared
// source split its shares: one alone reads all four; a second makes it
// hand two over; a third, with two shares for three, stands by; when a
// reader stops, the standby takes its share at once. No share is ever
// read by two at a time.
func TestConsumeBalancesShares(t *testing.T) {
	t.Parallel()
	drv := newPG(t)
	type member struct {
		stop func()
		done chan error
	}
	var src *sharedSource
	start := func(who string) member {
		c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: "g", SourceLeaseTTL: time.Second})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		m := member{stop: cancel, done: make(chan error, 1)}
		go func() { m.done <- c.Consume(ctx, src.source(who)) }()
		return m
	}
	waitFor := func(want map[string]int, msg string) {
		t.Helper()
		require.Eventually(t, func() bool {
			got, _ := src.held()
			for who, n := range want {
				if got[who] != n {
					return false
				}
			}
			for who, n := range got {
				if n > 0 && want[who] == 0 {
					return false
				}
			}
			return true
		}, time.Minute, 10*time.Millisecond, msg)
	}
	src = &sharedSource{t: t, n: 4, readers: map[int]map[string]bool{}}
	a := start("a")
	waitFor(map[string]int{"a": 4}, "one consumer reads every share")
	b := start("b")
	waitFor(map[string]int{"a": 2, "b": 2}, "a second consumer makes the first hand half over")
	for _, m := range []member{a, b} {
		m.stop()
		require.NoError(t, <-m.done)
	}

	// Two shares for three: the third stands by.
	src = &sharedSource{t: t, n: 2, readers: map[int]map[string]bool{}}
	x, y, z := start("x"), start("y"), start("z")
	require.Eventually(t, func() bool { _, read := src.held(); return read == 2 }, time.Minute, 10*time.Millisecond, "both shares are read")
	time.Sleep(time.Second) // a membership refresh or three
	got, read := src.held()
	require.Equal(t, 2, read)
	require.Len(t, got, 2, "two consumers read a share each, the third stands by: %v", got)
	readers := map[string]member{"x": x, "y": y, "z": z}
	var standby string
	for who := range readers {
		if got[who] == 0 {
			standby = who
		}
	}
	require.NotEmpty(t, standby)
	for who, m := range readers {
		if who != standby {
			m.stop() // a reader stops: the standby takes its share
			require.NoError(t, <-m.done)
			require.Eventually(t, func() bool { got, read := src.held(); return read == 2 && got[standby] == 1 }, 10*time.Second, 10*time.Millisecond, "the standby takes the share over")
			break
		}
	}
	for _, m := range readers {
		m.stop()
	}
}
