package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBenchWithoutModePointsToTheSideBySideBench(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Equal(t, 2, run(context.Background(), []string{"bench", "--quick"}, &out, &errOut))
	require.Contains(t, errOut.String(), "ferry bench drain | latency | consume | settle")
	require.Contains(t, errOut.String(), "cd bench && go run ./cmd/ferry-bench --quick")
}
