package ferrymongo

import (
	"testing"
	"time"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// A redriven event is stored under a fresh _id with its ID in eid; the
// feed reads it back as that event.
func TestRedrivenDocumentReadsAsItsEvent(t *testing.T) {
	id, fresh := ferryevent.NewID(), ferryevent.NewID()
	ev, err := (&outboxDoc{ID: fresh.String(), EventID: id.String(), Topic: "t", Key: "k", Type: "T"}).event()
	require.NoError(t, err)
	require.Equal(t, id, ev.ID)
	ev, err = (&outboxDoc{ID: id.String(), Topic: "t", Key: "k", Type: "T"}).event()
	require.NoError(t, err)
	require.Equal(t, id, ev.ID)
}

// An event's CreatedAt comes back to the nanosecond through BSON, whose
// dates hold milliseconds, in and out of int64 nanoseconds' range.
func TestCreatedAtKeepsNanoseconds(t *testing.T) {
	for _, at := range []time.Time{
		time.Date(2026, 3, 29, 1, 59, 58, 123456789, time.UTC),
		time.Date(2026, 3, 29, 1, 59, 58, 0, time.FixedZone("KST", 9*3600)),
		time.Date(1969, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC),
	} {
		raw, err := bson.Marshal(struct {
			C createdAt `bson:",inline"`
		}{created(at)})
		require.NoError(t, err)
		var back struct {
			C createdAt `bson:",inline"`
		}
		require.NoError(t, bson.Unmarshal(raw, &back))
		require.True(t, back.C.time().Equal(at), "sent %s, got %s", at, back.C.time())
	}
}
