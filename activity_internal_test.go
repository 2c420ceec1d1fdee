package ferry

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestActivityMeterSample: a sample sums what the interval did, its
// percentiles come from a bounded reservoir whatever the count, and the
// next sample starts from zero.
func TestActivityMeterSample(t *testing.T) {
	m := newActivityMeter("consumer", "g", "p")
	now := time.Now()
	created := make([]time.Time, 10_000)
	for i := range created {
		created[i] = now.Add(-time.Duration(i%100+1) * time.Millisecond) // 1 to 100 ms old
	}
	m.did(now, 2*time.Millisecond, created...)
	m.fail(3, 1)
	s := m.take(now.Add(time.Second))
	require.Equal(t, []int64{10_000, 3, 1}, []int64{s.Done, s.Failed, s.Dead})
	require.InDelta(t, float64(50*time.Millisecond), float64(s.LatencyP50), float64(8*time.Millisecond), "a uniform sample's median")
	require.InDelta(t, float64(99*time.Millisecond), float64(s.LatencyP99), float64(3*time.Millisecond))
	require.Equal(t, 2*time.Millisecond, s.HandlerP99)
	require.LessOrEqual(t, len(m.latency.vals), reservoirSize)
	next := m.take(now.Add(2 * time.Second))
	require.Equal(t, time.Second, next.Interval)
	require.Zero(t, next.Done+next.Failed+next.Dead)
	require.Zero(t, next.LatencyP99)
	var none *activityMeter
	none.did(now, 0, now) // a relay or consumer without a meter counts nothing
	none.fail(1, 1)
}
