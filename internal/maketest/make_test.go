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

// `make build` stamps the version and commit into the binary, also where
// the build's own stamping is off (GOFLAGS=-buildvcs=false, as here): ferry
// version printed "(devel)" and no commit.
func TestMakeBuildStampsTheVersion(t *testing.T) {
	for _, tool := range []string{"make", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not installed (CI=true: failing instead of skipping)", tool)
			}
			t.Skipf("%s is not installed: install it (apt-get install %s) to run this test", tool, tool)
		}
	}
	bin := filepath.Join(t.TempDir(), "ferry")
	cmd := exec.Command("make", "-C", "../..", "build", "BIN="+bin)
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "make build:\n%s", out)
	head, err := exec.Command("git", "-C", "../..", "rev-parse", "HEAD").Output()
	require.NoError(t, err)
	out, err = exec.Command(bin, "version").Output()
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, lines, 3, "%s", out)
	require.NotEqual(t, "ferry (devel)", lines[0])
	require.NotContains(t, lines[0], "(unknown)")
	require.True(t, strings.HasPrefix(lines[1], "commit "+strings.TrimSpace(string(head))), "%s", out)
}
