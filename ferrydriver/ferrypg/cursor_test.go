package ferrypg

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCursorRoundTrip(t *testing.T) {
	t.Parallel()
	st := &feedState{V: 1, Low: 10, High: 20, After: 12, PrevXmax: 100, PrevXip: []uint64{90, 95}, CurXmax: 120, CurXip: []uint64{95, 110}, Late: []uint64{101}}
	got, err := decodeCursor(st.encode())
	require.NoError(t, err)
	require.Equal(t, st, got)
	require.ElementsMatch(t, []string{"90", "101"}, got.stragglers(), "stragglers: running at prev, not at cur, plus late")
	require.EqualValues(t, 12, got.delivered())

	empty, err := decodeCursor(nil)
	require.NoError(t, err)
	require.True(t, empty.Done, "a new feed starts by taking a snapshot")

	_, err = decodeCursor([]byte(`{"v":2}`))
	require.ErrorContains(t, err, "not a ferrypg cursor")
}

func TestParseSnapshot(t *testing.T) {
	t.Parallel()
	xmax, xip, err := parseSnapshot("100:120:101,105")
	require.NoError(t, err)
	require.EqualValues(t, 120, xmax)
	require.Equal(t, []uint64{101, 105}, xip)
	_, xip, err = parseSnapshot("7:7:")
	require.NoError(t, err)
	require.Empty(t, xip)
	for _, bad := range []string{"", "1:2", "1:x:", "1:2:3,y"} {
		_, _, err := parseSnapshot(bad)
		require.Error(t, err, bad)
	}
}

// FuzzDecodeCursor: a checkpoint read back from the database never panics
// the relay, whatever it holds.
func FuzzDecodeCursor(f *testing.F) {
	f.Add([]byte(`{"v":1,"low":1,"high":2,"after":0,"prev_xip":[1],"cur_xip":[2],"done":false}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := decodeCursor(b)
		if err != nil {
			return
		}
		_ = st.stragglers()
		_ = st.delivered()
		again, err := decodeCursor(st.encode())
		require.NoError(t, err)
		require.Equal(t, st.encode(), again.encode())
	})
}
