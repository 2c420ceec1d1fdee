package ferrypg_test

import (
	"testing"

	"github.com/ferry-dev/ferry/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
