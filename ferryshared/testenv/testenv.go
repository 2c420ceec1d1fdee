// Package testenv is what Ferry's tests do when a service they need is not
// there: skip, saying which variable names a server, or fail under CI=true.
package testenv

import (
	"fmt"
	"os"
	"testing"
)

// Unavailable skips (or, under CI=true, fails) a test whose service is
// absent, naming the variable that points the test at a server.
func Unavailable(t testing.TB, service, envVar string, err error) {
	t.Helper()
	Missing(t, fmt.Sprintf("%s is not reachable (%v): set %s to a server to run this test", service, err, envVar))
}

// Missing skips a test whose service or tool is absent, with msg saying
// what to install or set; under CI=true, which must provide everything,
// it fails instead.
func Missing(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " (CI=true: failing instead of skipping)")
	}
	t.Skip(msg)
}
