// Package maketest checks the repository's Makefile.
package maketest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// module writes a Go module with one test that passes or fails.
func module(t *testing.T, name string, pass bool) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/"+name+"\n\ngo 1.26\n"), 0o644))
	body := "package m\n\nimport \"testing\"\n\nfunc TestIt(t *testing.T) {"
	if !pass {
		body += " t.Fatal(\"" + name + " fails\") "
	}
	body += "}\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "m_test.go"), []byte(body), 0o644))
	return dir
}

// `make test` and `make test/short` run every module, also after one
// fails, list the failing ones at the end and exit non-zero.
func TestMakeTestRunsEveryModule(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("make is not installed (CI=true: failing instead of skipping); .ci/run runs make test")
		}
		t.Skip("make is not installed: install it (apt-get install make) to run this test")
	}
	first, second, third := module(t, "first", false), module(t, "second", true), module(t, "third", false)
	for _, target := range []string{"test", "test/short"} {
		cmd := exec.Command("make", "-C", "../..", target, "MODULES="+strings.Join([]string{first, second, third}, " "))
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		out, err := cmd.CombinedOutput()
		require.Error(t, err, "make %s must fail:\n%s", target, out)
		for _, m := range []string{first, second, third} {
			require.Contains(t, string(out), "== "+m, "make %s ran %s:\n%s", target, m, out)
		}
		require.Contains(t, string(out), "FAILED modules: "+first+" "+third, "make %s:\n%s", target, out)
	}
}
