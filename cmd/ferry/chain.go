package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ferry-dev/ferry"
	"github.com/ferry-dev/ferry/ferrychain"
	"github.com/ferry-dev/ferry/ferrydriver"
	"github.com/ferry-dev/ferry/ferryhook"
	"github.com/ferry-dev/ferry/ferryprom"
)

// cmdChain runs `ferry chain run|status`.
func cmdChain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	action, err := pickSubcommand("chain", args, []subcommand{
		{"run", "ingest a contract's logs into a consumer group's inbox, reorgs retracted"},
		{"status", "where a group's chain cursor is"},
	}, stdout)
	if err != nil {
		return err
	}
	if action == "run" {
		return cmdChainRun(ctx, args[1:], stderr)
	}
	return cmdChainStatus(ctx, args[1:], stdout, stderr)
}

type chainFlags struct {
	db                        dbFlags
	rpcURL, group, contracts  string
	abiPath, tier, deepReorg  string
	topic, metricsAddr, level string
	startBlock                int
	window                    int
	poll, stall               time.Duration
}

func (c *chainFlags) register(f *envFlags) {
	c.db.register(f)
	f.String(&c.rpcURL, "rpc-url", "FERRY_CHAIN_RPC_URL", "", "the node's JSON-RPC endpoint: ws:// or wss:// (head subscription), or http(s):// (polling)")
	f.String(&c.group, "group", "FERRY_CHAIN_GROUP", "", "consumer group whose inbox receives the logs; its handlers run in your service (ferry.NewConsumer with this group)")
}

func cmdChainRun(ctx context.Context, args []string, stderr io.Writer) error {
	f := newFlags("chain run", stderr)
	var c chainFlags
	c.register(f)
	f.String(&c.contracts, "contracts", "FERRY_CHAIN_CONTRACTS", "", "comma-separated contract addresses whose logs to read")
	f.String(&c.abiPath, "abi", "FERRY_CHAIN_ABI", "", "JSON ABI file: events are typed by their ABI name (default: the first topic in hex)")
	f.Int(&c.startBlock, "start-block", "FERRY_CHAIN_START_BLOCK", 0, "where a group with no saved cursor starts")
	f.String(&c.tier, "tier", "FERRY_CHAIN_TIER", "latest", "confirmation tier: latest, safe, finalized, or a number of confirmations")
	f.String(&c.deepReorg, "deep-reorg", "FERRY_CHAIN_DEEP_REORG", "", "on a reorg deeper than the tier: halt (default except for latest) or retract")
	f.Int(&c.window, "window", "FERRY_CHAIN_WINDOW", 128, "recent blocks remembered to find a reorg's common ancestor")
	f.Duration(&c.poll, "poll-interval", "FERRY_CHAIN_POLL_INTERVAL", 2*time.Second, "how often the head is read without a subscription")
	f.Duration(&c.stall, "stall-after", "FERRY_CHAIN_STALL_AFTER", 2*time.Minute, "alert when the head has not moved for this long")
	f.String(&c.topic, "topic", "FERRY_CHAIN_TOPIC", "chain", "Ferry topic of the events")
	f.String(&c.metricsAddr, "metrics-addr", "FERRY_METRICS_ADDR", "127.0.0.1:9465", "serve /metrics, /livez (/healthz), /readyz here (\"off\": no server)")
	f.String(&c.level, "log-level", "FERRY_LOG_LEVEL", "info", "debug, info, warn or error")
	if err := f.Parse(args); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.level)); err != nil {
		return usagef("--log-level %q: use debug, info, warn or error", c.level)
	}
	log := slog.New(tracedLogs(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})))
	if c.rpcURL == "" || c.group == "" || c.contracts == "" {
		return usagef("--rpc-url, --group and --contracts are required (or FERRY_CHAIN_RPC_URL, FERRY_CHAIN_GROUP, FERRY_CHAIN_CONTRACTS)")
	}
	var addrs []common.Address
	for _, a := range strings.Split(c.contracts, ",") {
		a = strings.TrimSpace(a)
		if !common.IsHexAddress(a) {
			return usagef("--contracts: %q is not a 0x-prefixed 20-byte address", a)
		}
		addrs = append(addrs, common.HexToAddress(a))
	}
	tier, err := ferrychain.ParseTier(c.tier)
	if err != nil {
		return usagef("--tier: %v", err)
	}
	cfg := &ferrychain.Config{Dial: ferrychain.Dial(c.rpcURL), Contracts: addrs, Tier: tier, StartBlock: uint64(max(c.startBlock, 0)),
		Window: c.window, PollInterval: c.poll, StallAfter: c.stall, Topic: c.topic, Logger: log}
	switch c.deepReorg {
	case "":
	case "halt":
		p := ferrychain.Halt
		cfg.DeepReorg = &p
	case "retract":
		p := ferrychain.RetractAndContinue
		cfg.DeepReorg = &p
	default:
		return usagef("--deep-reorg %q: use halt or retract", c.deepReorg)
	}
	if c.abiPath != "" {
		raw, err := os.ReadFile(c.abiPath)
		if err != nil {
			return usagef("--abi: %v", err)
		}
		parsed, err := abi.JSON(strings.NewReader(string(raw)))
		if err != nil {
			return usagef("--abi %s is not a JSON ABI: %v", c.abiPath, err)
		}
		cfg.ABI = &parsed
	}
	b, err := c.db.open(ctx, false)
	if err != nil {
		return err
	}
	defer b.close()
	if err := migrateUp(ctx, b.store, log); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The source's metrics and the inbox's (ingested events, by system)
	// on one registry; the tracer, when traces are exported, sees the
	// deliveries too.
	cfg.Hooks = append([]ferryhook.Hook{ferryprom.New(reg)}, hooks...)
	inbox, err := b.chainInbox(c.group, log, cfg.Hooks)
	if err != nil {
		return err
	}
	src, err := ferrychain.New(b.store, inbox, cfg)
	if err != nil {
		return usagef("%v", err)
	}
	if c.metricsAddr != "" && c.metricsAddr != "off" {
		srv, err := serveMetrics(ctx, c.metricsAddr, reg, b.ping, nil)
		if err != nil {
			return fmt.Errorf("serve metrics on --metrics-addr %s: %w (\"off\" disables it)", c.metricsAddr, err)
		}
		defer srv.Close()
	}
	log.Info("ferry: chain source starting", "group", c.group, "tier", tier.String(), "contracts", len(addrs), "database", b.label)
	return src.Run(ctx)
}

func cmdChainStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("chain status", stderr)
	var c chainFlags
	c.register(f)
	var asJSON bool
	f.Bool(&asJSON, "json", "FERRY_STATUS_JSON", false, "print JSON")
	if err := f.Parse(args); err != nil {
		return err
	}
	if c.group == "" {
		return usagef("--group is required")
	}
	b, err := c.db.open(ctx, false)
	if err != nil {
		return err
	}
	defer b.close()
	info, err := ferrychain.ReadCursor(ctx, b.store, c.group)
	if err != nil {
		return err
	}
	out := struct {
		*ferrychain.CursorInfo
		Head    *uint64 `json:"head,omitempty"`
		LagBlks *uint64 `json:"head_lag_blocks,omitempty"`
	}{CursorInfo: info}
	if c.rpcURL != "" {
		cl, err := ferrychain.Dial(c.rpcURL)(ctx)
		if err != nil {
			return fmt.Errorf("--rpc-url: %w", err)
		}
		h, err := cl.HeaderByNumber(ctx, nil)
		if err != nil {
			return fmt.Errorf("read the head: %w", err)
		}
		head := h.Number.Uint64()
		lag := head - min(head, info.Block)
		out.Head, out.LagBlks = &head, &lag
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	fmt.Fprintf(stdout, "%s: chain %d, tier %s, block %d (%s), %d reorgs, window %d blocks, saved %s\n",
		info.Name, info.ChainID, info.Tier, info.Block, info.Hash.Hex(), info.Reorgs, info.Window, info.SavedAt.Format(time.RFC3339))
	if out.Head != nil {
		fmt.Fprintf(stdout, "  head %d, %d blocks behind\n", *out.Head, *out.LagBlks)
	}
	if info.Holder != "" {
		fmt.Fprintf(stdout, "  lease: %s (held: %s)\n", info.Holder, strconv.FormatBool(info.Held))
	}
	return nil
}

// chainInboxFor returns a consumer of group over drv used only to ingest
// and retract (its handlers run in the user's service). Its hooks see each
// delivery: ferry_consumer_ingested_events_total{system="evm"} and, when
// traces are exported, a receive span per block's logs.
func chainInboxFor[TTx any](drv ferrydriver.Inbox[TTx]) func(group string, log *slog.Logger, hooks []ferryhook.Hook) (ferrychain.Inbox, error) {
	return func(group string, log *slog.Logger, hooks []ferryhook.Hook) (ferrychain.Inbox, error) {
		c, err := ferry.NewConsumer(drv, &ferry.ConsumerConfig{Group: group, Logger: log, Hooks: hooks})
		if err != nil {
			return nil, usagef("--group: %v", err)
		}
		return c, nil
	}
}
