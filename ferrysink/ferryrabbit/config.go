package ferryrabbit

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/ferry-dev/ferry/ferryevent"
)

// Defaults applied by Config.WithDefaults.
const (
	// DefaultURL is a RabbitMQ on this machine with its stock user, which
	// RabbitMQ only lets in over loopback.
	DefaultURL          = "amqp://guest:guest@localhost:5672/"
	DefaultExchange     = "ferry"
	DefaultExchangeType = "topic"
	DefaultMaxInFlight  = 1024
	// DefaultConfirmTimeout bounds the wait for RabbitMQ's confirm of one
	// message.
	DefaultConfirmTimeout = 30 * time.Second
	// DefaultDialTimeout bounds connecting to RabbitMQ, TCP and AMQP
	// handshakes included.
	DefaultDialTimeout = 10 * time.Second
	// DefaultConnectionName is shown for the sink's connection in the
	// management UI and rabbitmqctl list_connections.
	DefaultConnectionName = "ferry sink"
)

// Message size limits. RabbitMQ refuses a message whose body is larger than
// its max_message_size setting by closing the channel the message came on.
const (
	// DefaultMaxMessageBytes is RabbitMQ's default max_message_size from 3.8
	// to 3.13: 128 MiB.
	DefaultMaxMessageBytes = 128 << 20
	// DefaultMaxMessageBytes4 is RabbitMQ's default max_message_size from
	// 4.0: 16 MiB.
	DefaultMaxMessageBytes4 = 16 << 20
)

// maxShortString is the longest AMQP 0-9-1 short string: exchange names,
// routing keys, header names and the content-type property.
const maxShortString = 255

// Config configures a Sink. The zero value (or a nil *Config) publishes to
// the existing durable topic exchange "ferry" on a local RabbitMQ, with each
// event's Topic as its routing key.
type Config struct {
	// URL is the AMQP URI of the broker, such as
	// "amqps://user:password@rabbit.internal:5671/vhost". Percent-encode
	// reserved characters in the user name and password. Default:
	// DefaultURL.
	URL string

	// AMQP, when set, is the connection configuration passed to
	// amqp091.DialConfig: TLS (TLSClientConfig), SASL mechanisms, vhost,
	// heartbeat, frame size, client properties, a custom Dial. The sink
	// copies it for every connection; leave Recovery nil, the sink
	// reconnects on its own.
	AMQP *amqp.Config

	// ConnectionName is the connection_name client property, shown in the
	// management UI, unless AMQP.Properties sets one. Default:
	// DefaultConnectionName.
	ConnectionName string

	// Exchange receives every event. Default: DefaultExchange. The default
	// exchange ("") cannot be used: bind queues to a named exchange.
	Exchange string

	// DeclareExchange makes New declare Exchange, durable and of type
	// ExchangeType, when it does not exist. An existing exchange is left as
	// it is, but New fails if its type or durability differ. When false,
	// New fails if the exchange is missing.
	DeclareExchange bool

	// ExchangeType is the type of an exchange New declares (only with
	// DeclareExchange): "topic", "direct", "fanout", "headers" or a plugin's
	// type. Default: DefaultExchangeType.
	ExchangeType string

	// RoutingKey, when set, returns the routing key for an event in place
	// of its Topic. It must be safe for concurrent use. A key no queue's
	// binding matches makes the event fail permanently (see Publish).
	RoutingKey func(ev *ferryevent.Event) string

	// MaxMessageBytes is the largest message body (the event's Payload)
	// sent; a larger event fails permanently without being sent. Set it to
	// the broker's max_message_size when that is lower than the default.
	// Default: RabbitMQ's default for the version of the broker New
	// connects to, DefaultMaxMessageBytes before 4.0 and
	// DefaultMaxMessageBytes4 from 4.0.
	MaxMessageBytes int

	// MaxInFlight bounds the messages published and not yet confirmed,
	// across all Publish calls of the sink. A call that reaches the bound
	// waits for confirms. Default: DefaultMaxInFlight.
	MaxInFlight int

	// ConfirmTimeout bounds the wait for RabbitMQ's confirm of one message;
	// past it the event fails with a retryable error. Default:
	// DefaultConfirmTimeout.
	ConfirmTimeout time.Duration

	// DialTimeout bounds each connection attempt. Default:
	// DefaultDialTimeout.
	DialTimeout time.Duration

	// Logger receives the sink's warnings (lost connections, resource
	// alarms) and debug messages. Default: slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns a copy of c (which may be nil) with every unset field
// set to its default. MaxMessageBytes stays 0 when unset: New sets it from
// the broker's version.
func (c *Config) WithDefaults() *Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.URL == "" {
		out.URL = DefaultURL
	}
	if out.ConnectionName == "" {
		out.ConnectionName = DefaultConnectionName
	}
	if out.Exchange == "" {
		out.Exchange = DefaultExchange
	}
	if out.ExchangeType == "" {
		out.ExchangeType = DefaultExchangeType
	}
	if out.MaxInFlight == 0 {
		out.MaxInFlight = DefaultMaxInFlight
	}
	if out.ConfirmTimeout == 0 {
		out.ConfirmTimeout = DefaultConfirmTimeout
	}
	if out.DialTimeout == 0 {
		out.DialTimeout = DefaultDialTimeout
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return &out
}

// validate checks a Config that went through WithDefaults.
func (c *Config) validate() error {
	if err := checkURL(c.URL, "Config.URL"); err != nil {
		return err
	}
	if reason := invalidExchange(c.Exchange, c.DeclareExchange); reason != "" {
		return fmt.Errorf("ferryrabbit: Config.Exchange %q cannot be used: %s", c.Exchange, reason)
	}
	switch {
	case c.MaxMessageBytes < 0:
		return fmt.Errorf("ferryrabbit: Config.MaxMessageBytes is %d; set it to the broker's max_message_size, or 0 for RabbitMQ's default", c.MaxMessageBytes)
	case c.MaxInFlight < 0:
		return fmt.Errorf("ferryrabbit: Config.MaxInFlight is %d; set it > 0, or 0 for %d", c.MaxInFlight, DefaultMaxInFlight)
	case c.ConfirmTimeout < 0:
		return fmt.Errorf("ferryrabbit: Config.ConfirmTimeout is %s; set it > 0, or 0 for %s", c.ConfirmTimeout, DefaultConfirmTimeout)
	case c.DialTimeout < 0:
		return fmt.Errorf("ferryrabbit: Config.DialTimeout is %s; set it > 0, or 0 for %s", c.DialTimeout, DefaultDialTimeout)
	case c.AMQP != nil && c.AMQP.Recovery != nil:
		return fmt.Errorf("ferryrabbit: Config.AMQP.Recovery is set; leave it nil: the sink reconnects itself and must learn of every lost connection to fail the events in flight")
	}
	return nil
}

// checkURL parses an AMQP URI, naming the setting in the error and never
// echoing a password.
func checkURL(raw, field string) error {
	if _, err := amqp.ParseURI(raw); err != nil {
		return fmt.Errorf("ferryrabbit: %s %q is not an AMQP URI (amqp://user:password@host:5672/vhost): %v", field, redact(raw), err)
	}
	return nil
}

// invalidExchange says why name cannot be the exchange, or returns "".
func invalidExchange(name string, declare bool) string {
	switch {
	case len(name) > maxShortString:
		return fmt.Sprintf("it is %d bytes long, more than AMQP's %d", len(name), maxShortString)
	case declare && strings.HasPrefix(name, "amq."):
		return `RabbitMQ reserves names starting with "amq." and refuses to declare them; choose another name, or use the existing exchange without Config.DeclareExchange`
	}
	return ""
}

// defaultMaxMessageBytes is RabbitMQ's default max_message_size for the
// broker version reported in the connection's server properties.
func defaultMaxMessageBytes(conn *amqp.Connection) int {
	version, _ := conn.Properties["version"].(string)
	major, _, _ := strings.Cut(version, ".")
	if n, err := strconv.Atoi(major); err == nil && n >= 4 {
		return DefaultMaxMessageBytes4
	}
	return DefaultMaxMessageBytes
}
