package ferry_test

import "github.com/ferry-dev/ferry/ferrydriver/ferrypg/ferrypgtest"

func exampleURL() string { return ferrypgtest.URL() }
