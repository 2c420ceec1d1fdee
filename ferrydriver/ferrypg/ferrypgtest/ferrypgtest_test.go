package ferrypgtest_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { ferrypgtest.Main(m) }

// An example that needs the server, as the root package's do: it panics
// without one.
func Example_needsTheServer() {
	pool, err := pgxpool.New(context.Background(), ferrypgtest.URL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pool.Ping(context.Background()); err != nil {
		panic(err)
	}
	fmt.Println("reached")
	// Output: reached
}

// Without a server (and CI unset), the examples are skipped, with the
// variable named, instead of panicking; under CI=true they run (and fail).
func TestExamplesSkipWithoutAServer(t *testing.T) {
	unreachable := "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2"
	for _, ci := range []string{"", "true"} {
		cmd := exec.Command(os.Args[0], "-test.run=^Example", "-test.v")
		cmd.Env = append(os.Environ(), "FERRY_TEST_PG_URL="+unreachable, "CI="+ci)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if ci == "true" {
			require.Error(t, err, "CI=true: the example runs, and fails without a server:\n%s", out.String())
			continue
		}
		require.NoError(t, err, "the examples are skipped:\n%s", out.String())
		require.Contains(t, out.String(), "set FERRY_TEST_PG_URL to a server to run them")
		require.NotContains(t, out.String(), "panic")
		require.NotContains(t, out.String(), "=== RUN   Example_needsTheServer")
	}
}
