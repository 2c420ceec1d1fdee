package ferrypg_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/ferry-dev/ferry/internal/pgtest"
	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves goroutines behind (a relay
// that did not stop, a feed session that was not closed).
func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Close()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines leaked by the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
