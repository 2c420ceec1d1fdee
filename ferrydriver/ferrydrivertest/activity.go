package ferrydrivertest

import (
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/stretchr/testify/require"
)

// ActivityHarness adapts a backend to the activity part of the suite.
type ActivityHarness struct {
	// New returns a fresh, migrated store.
	New func(t *testing.T) ferrydriver.Admin
	// ServerExpires says that the server removes expired samples by
	// itself (MongoDB's TTL index) rather than RecordActivity: the
	// retention test then checks nothing.
	ServerExpires bool
}

// ExerciseActivity runs the activity part of the suite: samples recorded
// by relays and consumers read back in time order, whole, filtered and
// bounded, and removed once past their retention.
func ExerciseActivity(t *testing.T, h ActivityHarness) {
	t.Run("RecordAndList", func(t *testing.T) { t.Parallel(); testActivityRecordAndList(t, h.New(t)) })
	t.Run("Retention", func(t *testing.T) {
		t.Parallel()
		if h.ServerExpires {
			t.Log("the server expires samples (a TTL index): RecordActivity removes none")
			return
		}
		testActivityRetention(t, h.New(t))
	})
}

func testActivityRecordAndList(t *testing.T, d ferrydriver.Admin) {
	ctx := ctxT(t, 30*time.Second)
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	samples := []*ferrydriver.ActivitySample{
		{Kind: ferrydriver.ActivityRelay, Name: "default/0", Process: "p1", At: t0, Interval: 10 * time.Second, Done: 12_345, Failed: 3, Dead: 1,
			LatencyP50: 2500 * time.Microsecond, LatencyP99: 41 * time.Millisecond, LagEvents: 123_456_789, LagAge: 95*time.Second + 250*time.Millisecond},
		{Kind: ferrydriver.ActivityConsumer, Name: "billing", Process: "p1", At: t0.Add(time.Second), Interval: 9500 * time.Millisecond, Done: 700,
			LatencyP50: 8 * time.Millisecond, LatencyP99: 30 * time.Millisecond, HandlerP50: 900 * time.Microsecond, HandlerP99: 4 * time.Millisecond},
		{Kind: ferrydriver.ActivityConsumer, Name: "billing", Process: "p2", At: t0.Add(2 * time.Second), Interval: 10 * time.Second, Failed: 5, Dead: 2},
	}
	require.NoError(t, d.RecordActivity(ctx, &ferrydriver.RecordActivityParams{Samples: samples[:2]}))
	require.NoError(t, d.RecordActivity(ctx, &ferrydriver.RecordActivityParams{Samples: samples[2:]}))
	got, err := d.ListActivity(ctx, &ferrydriver.ListActivityParams{Since: t0})
	require.NoError(t, err)
	require.Len(t, got, 3)
	for i, want := range samples {
		g := got[i]
		require.Equal(t, want.Kind, g.Kind)
		require.Equal(t, want.Name, g.Name)
		require.Equal(t, want.Process, g.Process)
		require.WithinDuration(t, want.At, g.At, time.Millisecond)
		require.Equal(t, []int64{want.Done, want.Failed, want.Dead, want.LagEvents}, []int64{g.Done, g.Failed, g.Dead, g.LagEvents})
		for j, pair := range [][2]time.Duration{{want.Interval, g.Interval}, {want.LatencyP50, g.LatencyP50}, {want.LatencyP99, g.LatencyP99},
			{want.HandlerP50, g.HandlerP50}, {want.HandlerP99, g.HandlerP99}, {want.LagAge, g.LagAge}} {
			require.InDelta(t, pair[0], pair[1], float64(time.Microsecond), "sample %d, duration %d", i, j)
		}
	}
	count := func(p *ferrydriver.ListActivityParams) int {
		got, err := d.ListActivity(ctx, p)
		require.NoError(t, err)
		return len(got)
	}
	require.Equal(t, 2, count(&ferrydriver.ListActivityParams{Since: t0, Kind: ferrydriver.ActivityConsumer}))
	require.Equal(t, 2, count(&ferrydriver.ListActivityParams{Since: t0, Name: "billing"}))
	require.Equal(t, 1, count(&ferrydriver.ListActivityParams{Since: t0, Kind: ferrydriver.ActivityRelay, Name: "default/0"}))
	require.Equal(t, 0, count(&ferrydriver.ListActivityParams{Since: t0, Kind: ferrydriver.ActivityRelay, Name: "billing"}))
	require.Equal(t, 1, count(&ferrydriver.ListActivityParams{Since: t0.Add(1500 * time.Millisecond)}))
	require.Equal(t, 2, count(&ferrydriver.ListActivityParams{Since: t0, Limit: 2}))
}

func testActivityRetention(t *testing.T, d ferrydriver.Admin) {
	ctx := ctxT(t, 30*time.Second)
	now := time.Now().UTC()
	old := &ferrydriver.ActivitySample{Kind: ferrydriver.ActivityRelay, Name: "default/0", Process: "p1", At: now.Add(-2 * time.Hour), Interval: 10 * time.Second, Done: 1}
	recent := &ferrydriver.ActivitySample{Kind: ferrydriver.ActivityRelay, Name: "default/0", Process: "p1", At: now.Add(-30 * time.Minute), Interval: 10 * time.Second, Done: 2}
	require.NoError(t, d.RecordActivity(ctx, &ferrydriver.RecordActivityParams{Samples: []*ferrydriver.ActivitySample{old, recent}}))
	got, err := d.ListActivity(ctx, &ferrydriver.ListActivityParams{Since: now.Add(-3 * time.Hour)})
	require.NoError(t, err)
	require.Len(t, got, 2, "within the default retention: both kept")
	require.NoError(t, d.RecordActivity(ctx, &ferrydriver.RecordActivityParams{Retention: time.Hour,
		Samples: []*ferrydriver.ActivitySample{{Kind: ferrydriver.ActivityRelay, Name: "default/0", Process: "p1", At: now, Interval: 10 * time.Second}}}))
	got, err = d.ListActivity(ctx, &ferrydriver.ListActivityParams{Since: now.Add(-3 * time.Hour)})
	require.NoError(t, err)
	require.Len(t, got, 2, "the sample older than the retention was removed")
	require.Equal(t, int64(2), got[0].Done)
}
