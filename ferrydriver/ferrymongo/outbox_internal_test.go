package ferrymongo

import (
	"testing"

	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/stretchr/testify/require"
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
