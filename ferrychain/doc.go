// Package ferrychain ingests EVM contract logs into a Ferry consumer
// group's inbox: each log once, in chain order per contract, at the group's
// confirmation tier, and retracting what a reorg undid. It is its own
// module because go-ethereum is heavy; no core package imports it.
//
// # Model
//
// A Source reads the logs of Config.Contracts from a JSON-RPC node (Dial:
// WebSocket with a head subscription, or HTTP with polling; the head is
// always read back over RPC, so the subscription only wakes the source and
// a dropped one loses nothing) and hands them to one group's inbox
// (*ferry.Consumer). Its cursor, the last block ingested and a window of
// recent (number, hash, parent, event IDs), is saved through the driver
// seam as a fenced checkpoint named "chain/<group>", under a lease of the
// same name: one source per group runs at a time, and a restart resumes
// exactly.
//
// An event's ID is derived from (chain ID, block hash, log index), so every
// delivery of one log has one ID; its Key is the contract address, its Type
// the ABI event name (Config.ABI) or the first topic, its payload a
// LogPayload (block, transaction, log index, address, topics, data), and
// its headers the chain ID, block number and hash, transaction hash and log
// index.
//
// # Reorgs
//
// Before each step the source checks that its cursor's block is still
// canonical, and every new block's parent against the cursor. On a
// mismatch it walks the window back to the common ancestor, retracts the
// events of the orphaned blocks (Consumer.Retract: those not yet run never
// run; those already processed are undone once, in key order, by the
// group's retraction handler) and ingests the canonical blocks as new
// events. A transaction re-mined into another block, or at another log
// index, is therefore processed once in net effect: its orphaned log
// undone if it had run, its new log run once. A block that a reorg orphans
// and a later reorg restores gets events of a new incarnation (the old
// ones stay RETRACTED).
//
// # Confirmation tiers
//
// Config.Tier is Latest, Confirmations(n), Safe or Finalized: the source
// ingests only blocks at or below that point, so a group at n confirmations
// never sees an event that a reorg shallower than n removes. A reorg that
// reaches blocks such a group already received (deeper than its tier) is
// raised through Config.OnAlert ("deep-reorg") and, under the default Halt
// policy, stops the source with ErrDeepReorg without retracting anything:
// an operator decides, and restarts it with DeepReorg RetractAndContinue to
// retract and go on. A reorg deeper than the window cannot find its common
// ancestor and always halts ("reorg-beyond-window"). A head that stops
// moving for Config.StallAfter raises "head-stalled".
//
// # Catching up
//
// Blocks more than a window below the tier's target are read with
// eth_getLogs ranges of up to Config.MaxRange blocks, halved when the
// provider refuses a range; the last window is read block by block, by
// hash.
//
// # Telemetry
//
// Config.Hooks takes ferry.MetricsHooks for the source's ferry_chain_*
// metrics. The source's Ingest calls name "evm" (System) as the transport
// of their events (ferrysink.WithSystem), so that a *ferry.Consumer given
// hooks reports them on its receive spans (ferryotel) and in
// ferry_consumer_ingested_events_total{system="evm"}.
//
// # Verification
//
// The tests run go-ethereum's simulated backend (which can fork) against
// PostgreSQL: a 2-block reorg with a 3-confirmation group beside a Latest
// one, a transaction re-mined at another log index, a crash injected before
// and after every inbox operation of the reorg, clean restarts between its
// steps, a WebSocket endpoint whose connections are cut (through a proxy),
// a deep reorg halting a 1-confirmation group, and a reorg's metrics read
// from a Prometheus registry (ferryprom). The simulated backend's
// "safe" equals "latest" and its "finalized" moves in 32-block steps, so
// the tier tests use confirmations.
package ferrychain
