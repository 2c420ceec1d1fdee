package main

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrydrivertest"
	"github.com/ferry-dev/ferry/ferrydriver/ferrysqlite"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/stretchr/testify/require"
)

// `ferry status` estimates the lag beyond ExactCountLimit events, says
// so, and counts it all with --exact.
func TestStatusSaysWhichFiguresAreEstimates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "app.db")
	drv, err := ferrysqlite.Open(path, nil)
	require.NoError(t, err)
	_, err = drv.Migrate(ctx, &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	n := 2*ferrydriver.ExactCountLimit + 500
	var evs []*ferryevent.Event
	for i := range n {
		evs = append(evs, ferrydrivertest.Event("t", "k"+strconv.Itoa(i%9), ""))
	}
	require.NoError(t, drv.Append(ctx, &ferrydriver.AppendParams{Events: evs}))
	require.NoError(t, drv.Close())
	db := []string{"--database-url", "sqlite:" + path}

	out, code := ferryCmd(t, append([]string{"status"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "~"+strconv.Itoa(n), "one partition without gaps: the estimate is the count, marked as an estimate")
	require.Contains(t, out, "--exact counts them all")

	out, code = ferryCmd(t, append([]string{"status", "--json"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `"lag_estimated": true`)

	out, code = ferryCmd(t, append([]string{"status", "--exact"}, db...)...)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, " "+strconv.Itoa(n)+" ")
	require.NotContains(t, out, "~")
}
