package backoff

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDelayGrowsAndCaps(t *testing.T) {
	t.Parallel()
	p := Policy{Base: 100 * time.Millisecond, Max: time.Second}
	for range 100 {
		d1 := p.Delay(1)
		require.GreaterOrEqual(t, d1, 50*time.Millisecond)
		require.LessOrEqual(t, d1, 100*time.Millisecond)
		d3 := p.Delay(3)
		require.GreaterOrEqual(t, d3, 200*time.Millisecond)
		require.LessOrEqual(t, d3, 400*time.Millisecond)
		d50 := p.Delay(50)
		require.GreaterOrEqual(t, d50, 500*time.Millisecond)
		require.LessOrEqual(t, d50, time.Second)
	}
}

func TestSleepStopsEarly(t *testing.T) {
	t.Parallel()
	done := make(chan struct{})
	close(done)
	require.False(t, Policy{Base: time.Hour, Max: time.Hour}.Sleep(done, 1))
}
