// Package ferrytest helps a service test its own use of Ferry, without a
// broker and without a relay running beside the test:
//
//   - RequireEmittedTx and RequireNotEmittedTx assert on what a transaction
//     emitted (or did not), before it commits; RequireEmitted and
//     RequireNotEmitted on what was committed. A Match selects events by
//     topic, key, type and a payload predicate.
//   - Sink is an in-memory destination that keeps what it was given, in
//     order, and can refuse chosen events.
//   - Drain publishes everything committed to the outbox into a sink with a
//     real Relay and returns when the feed has caught up: an end-to-end test
//     of a service in one process.
//
// The assertions read the outbox through ferrydriver.OutboxReader, which
// the PostgreSQL, MariaDB and SQLite drivers implement. The outbox keeps an
// event until retention deletes it after delivery (RelayConfig.Retention,
// a day by default), so a test sees everything it emitted.
package ferrytest
