// Package ferrykafka is Ferry's Kafka sink and consumer source, on
// franz-go (github.com/twmb/franz-go).
//
// # Sink
//
// New returns a ferrysink.Sink that produces each event as one record (see
// the wire format in wire.go: CloudEvents Kafka binding, binary mode, the
// Key as record key) with an idempotent producer and acks=all. Records are
// partitioned by key with Kafka's default murmur2 partitioner, so a key
// lands on the same partition whether Ferry or a Java producer writes it
// (Partition computes it). The sink is a ferrysink.OrderedBatcher: franz-go
// keeps each partition's records in order across its retries, and when one
// fails it fails every later record of the partition, so the relay can send
// whole batches and never sees an event acknowledged after an earlier one
// of its key failed.
//
// Outcomes: an acknowledgement from all in-sync replicas is success. A
// record larger than Config.MaxMessageBytes, or refused by the broker as
// too large or invalid, and a topic that does not exist, are permanent
// (the relay dead-letters the event with the reason). Anything else
// (leader changes, NOT_ENOUGH_REPLICAS, timeouts, a broker down) is retried
// inside the client until Config.DeliveryTimeout and then by the relay.
//
// Kafka has no deduplication by event ID across producer sessions: a relay
// that restarts republishes its last unsaved batch, and consumers drop the
// copies by event ID (Ferry's inbox does). Within one producer session the
// idempotent producer stores a retried record once. When a call fails
// after part of its batch was stored (an acknowledgement lost), the
// relay's retry can store that part again after it: each key's first
// copies stay in order, and the later copies are of earlier events.
//
// SASL, TLS and other client settings pass through Config.ClientOptions.
//
// # Source
//
// NewSource returns a consumer source (ferrysink.Source) that reads topics as a
// member of a consumer group. It hands each partition's records to ingest
// in offset order and commits the offsets only after ingest returned nil;
// a failed batch is retried, with backoff, before anything later of its
// partition, and rebalances wait for the batch in hand. Records that are
// not Ferry events are reported to SourceConfig.Invalid and passed over:
// Kafka cannot reject one record.
//
// # Verification
//
// The tests run on kfake, an in-process Kafka cluster that speaks the real
// protocol (no broker runs on the project's machines): the ferrysinktest
// conformance suite with produce faults and leader moves, the source suite,
// Java-compatible partitioning against Kafka's murmur2 test vectors, and a
// partition refusing records past the delivery timeout.
package ferrykafka
