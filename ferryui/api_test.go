package ferryui_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferrydriver/ferrypg"
	"github.com/ferry-dev/ferry/ferryui/ferryuitest"
	"github.com/ferry-dev/ferry/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestAPISuitePostgres(t *testing.T) {
	t.Parallel()
	drv, err := ferrypg.New(pgtest.Pool(t), &ferrypg.Config{Schema: pgtest.Schema(t)})
	require.NoError(t, err)
	_, err = drv.Migrate(context.Background(), &ferrydriver.MigrateParams{})
	require.NoError(t, err)
	ferryuitest.Run(t, drv, drv)
}
