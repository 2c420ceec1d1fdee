package ferrywebhook_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves goroutines behind: a
// request, a connection or a delivery the sink did not wind down.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
