package ferryevent

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRetractionRoundTrip(t *testing.T) {
	ev := &Event{Topic: "logs", Key: "0xabc", Type: "Transfer", Payload: []byte(`{"v":1}`), Headers: map[string]string{"block": "12"}}
	require.NoError(t, Prepare(ev, 0, 0, time.Now()))
	comp, err := NewRetraction(ev)
	require.NoError(t, err)
	require.Equal(t, TypeRetraction, comp.Type)
	require.Equal(t, ev.Key, comp.Key)
	again, err := NewRetraction(ev)
	require.NoError(t, err)
	require.Equal(t, comp.ID, again.ID, "one compensation per event, however often it is retracted")
	require.NotEqual(t, ev.ID, comp.ID)
	require.NoError(t, Validate(comp, 0, 0))

	back, err := RetractedEvent(comp)
	require.NoError(t, err)
	require.Equal(t, ev.ID, back.ID)
	require.Equal(t, ev.Payload, back.Payload)
	require.Equal(t, ev.Headers, back.Headers)
	require.True(t, ev.CreatedAt.Equal(back.CreatedAt))

	_, err = RetractedEvent(ev)
	require.ErrorContains(t, err, "not \"ferry.retraction\"")
}
