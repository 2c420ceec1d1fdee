package ferryrabbit

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

func TestTooLargeLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cause *amqp.Error
		want  int
	}{
		{nil, 0},
		{&amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - message size 20000000 is larger than configured max size 16777216"}, 16777216},
		{&amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - message size 600000000 is larger than max size 536870912"}, 536870912},
		{&amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - unknown delivery tag 7"}, 0},
		{&amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - message size 2 is larger than max size 1"}, 0},
	} {
		require.Equal(t, tc.want, tooLargeLimit(tc.cause), "%v", tc.cause)
	}
}

func TestDefaultMaxMessageBytes(t *testing.T) {
	t.Parallel()
	for version, want := range map[string]int{
		"3.10.8": DefaultMaxMessageBytes,
		"3.13.7": DefaultMaxMessageBytes,
		"4.0.1":  DefaultMaxMessageBytes4,
		"4.2.0":  DefaultMaxMessageBytes4,
		"10.0.0": DefaultMaxMessageBytes4,
		"":       DefaultMaxMessageBytes,
	} {
		conn := &amqp.Connection{Properties: amqp.Table{"version": version}}
		require.Equal(t, want, defaultMaxMessageBytes(conn), "version %q", version)
	}
}
