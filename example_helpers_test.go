package ferry_test

import "github.com/ferry-dev/ferry/internal/pgtest"

func exampleURL() string { return pgtest.URL() }
