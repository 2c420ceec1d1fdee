// Package prometheus holds Ferry's alert rules (ferry-alerts.yml) and
// their promtool unit tests (ferry-alerts_test.yml); its Go test runs
// them.
package prometheus

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// promtool returns the path of promtool: Debian's prometheus package
// ships it (.ci/services installs it). Without it the test is skipped,
// and fails under CI=true.
func promtool(t *testing.T) string {
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool is not installed: apt-get install prometheus (.ci/services does)")
		}
		t.Skip("promtool is not installed: apt-get install prometheus to check the alert rules")
	}
	return p
}

// TestAlertRules: the rules are valid (promtool check rules) and each one
// alerts in its unit test, for the partition or group it should and for
// no other (promtool test rules).
func TestAlertRules(t *testing.T) {
	pt := promtool(t)
	out, err := exec.Command(pt, "check", "rules", "ferry-alerts.yml").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "SUCCESS: 9 rules found")
	out, err = exec.Command(pt, "test", "rules", "ferry-alerts_test.yml").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "SUCCESS")

	// Every rule has a test that expects it to fire.
	rules, err := os.ReadFile("ferry-alerts.yml")
	require.NoError(t, err)
	tests, err := os.ReadFile("ferry-alerts_test.yml")
	require.NoError(t, err)
	n := 0
	for _, line := range strings.Split(string(rules), "\n") {
		name, ok := strings.CutPrefix(strings.TrimSpace(line), "- alert: ")
		if !ok {
			continue
		}
		n++
		require.Contains(t, string(tests), "alertname: "+name+"\n        exp_alerts:\n          - exp_labels:", "rule %s has no test in which it fires", name)
	}
	require.Equal(t, 9, n)
}
