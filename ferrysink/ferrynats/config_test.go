package ferrynats

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCovers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		pattern, filter string
		want            bool
	}{
		{">", "ferry.>", true},
		{"ferry.>", "ferry.>", true},
		{"ferry.>", "ferry.orders", true},
		{"*.>", "ferry.>", true},
		{"acme.>", "acme.events.>", true},
		{"acme.*.>", "acme.events.>", true},
		{"acme.*", "acme.events.>", false},
		{"ferry.*", "ferry.>", false},
		{"ferry.orders", "ferry.>", false},
		{"ferry", "ferry.>", false},
		{"ferry.>", "ferry", false},
		{"other.>", "ferry.>", false},
		{"ferry.orders.>", "ferry.>", false},
		{"ferry.*.>", "ferry.>", false},
		{"ferry.*", "ferry.*", true},
		{"ferry.orders", "ferry.*", false},
	} {
		require.Equal(t, tc.want, covers(tc.pattern, tc.filter), "covers(%q, %q)", tc.pattern, tc.filter)
	}
}

func TestInvalidSubject(t *testing.T) {
	t.Parallel()
	for s, valid := range map[string]bool{
		"ferry.orders":     true,
		"ferry.orders-v2":  true,
		"ferry.ü":          true,
		"ferry.a*b":        true,
		"":                 false,
		"ferry orders":     false,
		"ferry.orders\r\n": false,
		"ferry..orders":    false,
		".ferry":           false,
		"ferry.":           false,
		"ferry.*":          false,
		"ferry.>":          false,
	} {
		require.Equal(t, valid, invalidSubject(s) == "", "invalidSubject(%q) = %q", s, invalidSubject(s))
	}
}
