package ferry

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSpacedSavesOnceABatchIsUnsaved: a checkpointer waiting out saveGap
// saves as soon as the offers since make a batch's worth unsaved, not at
// the gap's end: the pipeline stops reading at two batches, so waiting
// would cap a small-batch relay at two batches per gap.
func TestSpacedSavesOnceABatchIsUnsaved(t *testing.T) {
	t.Parallel()
	c := newCheckpointer(&Relay{cfg: RelayConfig{BatchSize: 10}}, 1, nil, func(error) {})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan bool, 1)
	// A save "now" an hour ahead: only the offers can end the wait.
	go func() { done <- c.spaced(ctx, time.Now().Add(time.Hour)) }()
	c.offer([]byte("a"), 4, 1, nil)
	select {
	case <-done:
		t.Fatal("spaced returned with 4 of 10 events unsaved")
	case <-time.After(50 * time.Millisecond):
	}
	c.offer([]byte("b"), 6, 2, nil)
	select {
	case ok := <-done:
		require.True(t, ok)
	case <-time.After(10 * time.Second):
		t.Fatal("spaced still waits with a batch's worth unsaved")
	}
	go func() { done <- c.spaced(ctx, time.Now().Add(time.Hour)) }()
	require.True(t, <-done, "a batch's worth was unsaved before the wait")
	c.markSaved([]byte("b"), 10)
	go func() { done <- c.spaced(ctx, time.Now().Add(time.Hour)) }()
	cancel()
	require.False(t, <-done, "a stop ends the wait")
}
