package ferry_test

import (
	"testing"

	"github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"
)

func TestMain(m *testing.M) { ferrypgtest.Main(m) }
