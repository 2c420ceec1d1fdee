package ferrychain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/ethclient"
	"github.com/google/uuid"

	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryevent"
	"github.com/ferry-dev/ferry/ferryhook"
)

// Client is the part of a JSON-RPC client the source uses. *ethclient.Client
// and go-ethereum's simulated backend client implement it.
type Client interface {
	ChainID(ctx context.Context) (*big.Int, error)
	HeaderByNumber(ctx context.Context, number *big.Int) (*types.Header, error)
	FilterLogs(ctx context.Context, q ethereum.FilterQuery) ([]types.Log, error)
	SubscribeNewHead(ctx context.Context, ch chan<- *types.Header) (ethereum.Subscription, error)
}

// Dial returns a Dial function for Config.Dial over an endpoint URL:
// ws:// or wss:// (head subscription) or http(s):// (polling only).
func Dial(url string) func(ctx context.Context) (Client, error) {
	return func(ctx context.Context) (Client, error) {
		c, err := ethclient.DialContext(ctx, url)
		if err != nil {
			return nil, err
		}
		return c, nil
	}
}

// System is the transport a Source's deliveries name ("evm": the logs of
// an EVM chain, read over JSON-RPC): the context of its Ingest calls
// carries it (ferrysink.WithSystem), so that a *ferry.Consumer reports it
// on its receive spans and its ferry_consumer_ingested_events_total.
const System = "evm"

// Inbox is where the source puts events: a consumer group's inbox.
// *ferry.Consumer implements it. Give the consumer the hooks of your
// service (ferry.ConsumerConfig.Hooks) to trace and count the deliveries.
type Inbox interface {
	Group() string
	Ingest(ctx context.Context, events []*ferryevent.Event) (int, error)
	Retract(ctx context.Context, events []*ferryevent.Event) ([]ferrydriver.InboxState, error)
	Lookup(ctx context.Context, ids []uuid.UUID) (map[uuid.UUID]*ferryevent.Event, error)
}

// Tier is how confirmed a block must be before its logs reach the group.
type Tier struct {
	kind  tierKind
	depth uint64
}

type tierKind int

const (
	tierLatest tierKind = iota
	tierDepth
	tierSafe
	tierFinalized
)

var (
	// Latest delivers logs as soon as their block is the head: fastest,
	// and reorgs retract what the group already saw.
	Latest = Tier{kind: tierLatest}
	// Safe delivers logs of blocks at or below the node's "safe" block.
	Safe = Tier{kind: tierSafe}
	// Finalized delivers logs of finalized blocks only.
	Finalized = Tier{kind: tierFinalized}
)

// Confirmations delivers logs once n blocks are built on theirs (the head
// is n deeper); Confirmations(0) is Latest.
func Confirmations(n uint64) Tier {
	if n == 0 {
		return Latest
	}
	return Tier{kind: tierDepth, depth: n}
}

// ParseTier reads "latest", "safe", "finalized" or a number of
// confirmations.
func ParseTier(s string) (Tier, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "latest", "":
		return Latest, nil
	case "safe":
		return Safe, nil
	case "finalized":
		return Finalized, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return Tier{}, fmt.Errorf("ferrychain: tier %q: use latest, safe, finalized or a number of confirmations", s)
	}
	return Confirmations(n), nil
}

func (t Tier) String() string {
	switch t.kind {
	case tierDepth:
		return strconv.FormatUint(t.depth, 10) + " confirmations"
	case tierSafe:
		return "safe"
	case tierFinalized:
		return "finalized"
	}
	return "latest"
}

// DeepReorgPolicy says what a source does when a reorg reaches blocks whose
// logs the group already received at a tier that promised it would not:
// deeper than the tier's depth, or below safe or finalized.
type DeepReorgPolicy int

const (
	// Halt stops the source with ErrDeepReorg after raising an alert: an
	// operator decides (the default for every tier but Latest).
	Halt DeepReorgPolicy = iota
	// RetractAndContinue retracts the orphaned events as for Latest and
	// goes on, after raising the alert.
	RetractAndContinue
)

// Alert is raised through Config.OnAlert.
type Alert struct {
	Group string
	// Kind is "deep-reorg", "reorg-beyond-window" or "head-stalled".
	Kind    string
	Message string
	// Depth is how many blocks the source had passed that the reorg
	// orphaned (deep reorgs).
	Depth uint64
}

// ErrDeepReorg is returned by Run when a reorg went deeper than the group's
// tier promised and the policy is Halt, or deeper than the window the
// source keeps (it cannot find the common ancestor).
var ErrDeepReorg = errors.New("ferrychain: reorg deeper than the group's confirmation tier")

// Config configures a Source. Dial and Contracts are required.
type Config struct {
	// Dial connects to the node; it is called again after a connection
	// fails. Use Dial(url) for an endpoint.
	Dial func(ctx context.Context) (Client, error)
	// Contracts are the addresses whose logs are read.
	Contracts []common.Address
	// Topics filters logs as eth_getLogs does (position by position; nil
	// matches anything).
	Topics [][]common.Hash
	// StartBlock is where a source with no saved cursor starts.
	StartBlock uint64
	// Tier is the group's confirmation tier. Default Latest.
	Tier Tier
	// DeepReorg is the policy for reorgs deeper than the tier. Default
	// Halt, except RetractAndContinue for Latest (whose reorgs all are).
	DeepReorg *DeepReorgPolicy
	// Window is how many recent blocks the cursor remembers, to find a
	// reorg's common ancestor: at least the deepest reorg to survive plus
	// the tier's depth. Default 128.
	Window int
	// MaxRange bounds one eth_getLogs block range when catching up; it is
	// halved when the provider refuses a range. Default 2000.
	MaxRange uint64
	// PollInterval is how often the head is read when no subscription
	// wakes the source (HTTP endpoints, or while reconnecting). Default 2 s.
	PollInterval time.Duration
	// StallAfter raises a "head-stalled" alert when the head has not moved
	// for this long. Default 2 min.
	StallAfter time.Duration
	// ABI, when set, names each event's Type after the ABI event whose ID
	// is the log's first topic ("Transfer"); otherwise Type is the topic in
	// hex.
	ABI *abi.ABI
	// Topic is the Ferry topic of the events. Default "chain".
	Topic string
	// Name is the cursor's name (its checkpoint and lease are "chain/<Name>").
	// Default: the consumer group.
	Name string
	// Holder names this process in the lease. Default host-pid.
	Holder string
	// LeaseTTL bounds how long another process waits to take over after
	// this one dies. Default 15 s.
	LeaseTTL time.Duration
	// OnAlert is called on deep reorgs and a stalled head. Optional; alerts
	// are logged either way.
	OnAlert func(ctx context.Context, a *Alert)
	// Logger receives the source's logs. Default slog.Default().
	Logger *slog.Logger
	// Hooks observe the source: each ferryhook.MetricsHook records its metrics
	// (ferryprom.New(registerer) for Prometheus: ferry_chain_head_block,
	// _cursor_block, _head_lag_blocks, _reorgs_total, _reorg_depth_blocks,
	// _retracted_events_total, _ingested_events_total, _rpc_errors_total).
	// Optional. The inbox's own metrics and spans come from the hooks of
	// the *ferry.Consumer (ConsumerConfig.Hooks), which sees the source's
	// deliveries as system "evm" (System).
	Hooks []ferryhook.Hook
}

func (c *Config) withDefaults() (Config, error) {
	out := Config{}
	if c != nil {
		out = *c
	}
	switch {
	case out.Dial == nil:
		return out, errors.New("ferrychain: Config.Dial is nil: use ferrychain.Dial(\"wss://node.example/ws\") or a function returning a Client")
	case len(out.Contracts) == 0:
		return out, errors.New("ferrychain: Config.Contracts is empty: name the contracts whose logs to read")
	}
	if out.DeepReorg == nil {
		p := Halt
		if out.Tier.kind == tierLatest {
			p = RetractAndContinue
		}
		out.DeepReorg = &p
	}
	if out.Window == 0 {
		out.Window = 128
	}
	if out.Tier.kind == tierDepth && uint64(out.Window) <= out.Tier.depth {
		return out, fmt.Errorf("ferrychain: Config.Window %d must exceed the tier's %d confirmations", out.Window, out.Tier.depth)
	}
	if out.MaxRange == 0 {
		out.MaxRange = 2000
	}
	if out.PollInterval == 0 {
		out.PollInterval = 2 * time.Second
	}
	if out.StallAfter == 0 {
		out.StallAfter = 2 * time.Minute
	}
	if out.Topic == "" {
		out.Topic = "chain"
	}
	if !ferryevent.ValidTopic(out.Topic) {
		return out, fmt.Errorf("ferrychain: Config.Topic %q is not a topic every sink can carry: use words of ASCII letters, digits, '-' and '_' joined by single dots, at most %d bytes", out.Topic, ferryevent.MaxTopicBytes)
	}
	if out.LeaseTTL == 0 {
		out.LeaseTTL = 15 * time.Second
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out, nil
}
