// Package ferrywebhook delivers Ferry events to HTTP endpoints. Its Sink,
// for the relay, POSTs each event as one signed request and reports it
// published once the endpoint answered 2xx. For the receiving side, Handler
// (or Verify and DecodeRequest) checks the signature and turns the request
// back into an event.
//
// The package is part of Ferry's main module and adds no dependency to it.
//
// # Publishing
//
// Generate a secret once with NewSecret, store it where both sides read
// their configuration, and give it to the sink:
//
//	sink, err := ferrywebhook.New(&ferrywebhook.Config{
//		URL:     "https://billing.internal.example.com/hooks/ferry",
//		Secrets: []string{os.Getenv("FERRY_WEBHOOK_SECRET")}, // "whsec_..."
//	})
//	if err != nil {
//		return err
//	}
//	defer sink.Close(ctx)
//	relay, err := ferry.NewRelay(drv, sink, nil)
//
// Config.Endpoint routes events to several URLs instead (one per topic, or
// per tenant). Config.Header adds fixed headers, such as an Authorization
// token; Config.Client brings your own TLS, mutual TLS or proxy settings.
//
// # Wire format
//
// One event is one POST in the binary content mode of the CloudEvents HTTP
// protocol binding, signed as Standard Webhooks (www.standardwebhooks.com)
// specifies. The body is the Payload, untouched. Headers:
//
//	Content-Type          ContentType, when set (absent otherwise)
//	ce-specversion        1.0
//	ce-id                 event ID
//	ce-source             Source, or "ferry" when empty
//	ce-type               Type
//	ce-subject            Key
//	ce-time               CreatedAt, RFC 3339 in UTC with nanoseconds
//	ce-ferrytopic         Topic
//	ce-ferrykeyseq        Seq, when set; receivers use it to detect gaps and regressions
//	webhook-id            event ID: the signed ID, and the key to deduplicate on
//	webhook-timestamp     time of this attempt, Unix seconds
//	webhook-signature     "v1,<base64 HMAC-SHA256>", one per secret, space separated
//	Ferry-Headers         names of the event's own headers, comma separated, as the event
//	                      spelled them (absent when it has none)
//	<name>                each of the event's Headers, under its own name
//	User-Agent            "ferrywebhook (...)", unless Config.Header or the event sets one
//
// plus Config.Header. The ce- values are percent-encoded as the binding
// requires (space, '"', '%' and every byte outside printable ASCII become
// %XX); DecodeRequest decodes them. net/http writes header names in
// canonical form (Ce-Id, Webhook-Signature); HTTP names ignore case.
//
// The event's header values are sent as they are, UTF-8 included. Emit
// refuses what HTTP could not carry unchanged (ferryevent.Validate: control
// characters, white space at either end, names that are not HTTP tokens or
// differ only in case, reserved names). An event that holds one all the
// same (an outbox row stored by an earlier version) is sent with control
// characters in header values turned into spaces, or fails permanently for
// a name HTTP cannot carry or a ContentType with a control character. The
// names above, the headers HTTP manages (Host, Connection, Content-Length,
// ...) and the names in Config.Header belong to the sink: an event header
// with one of them, ignoring case, fails the event permanently, so an
// event can never replace an attribute, the signature or the sink's
// credentials, nor arrive without one of its headers.
//
// # Signatures
//
// Each attempt is signed afresh: the signed content is
// "{webhook-id}.{webhook-timestamp}.{body}", the signature its HMAC-SHA256
// under the secret's key (the base64 text after "whsec_"), and the header
// holds one signature per secret in Config.Secrets. To rotate a secret,
// add the new one to the sink (requests then carry both signatures), move
// every receiver to the new one, and remove the old one from the sink.
// Receivers accept a request when any of their secrets matches any
// signature, compared in constant time, and when webhook-timestamp is
// within a tolerance of their clock (DefaultTolerance, five minutes), which
// bounds replays.
//
// The signature covers the ID, the timestamp and the body, as Standard
// Webhooks defines it, and not the ce- headers: Handler also checks that
// ce-id equals the signed webhook-id, and HTTPS keeps the other headers
// from being changed on the way. Use https URLs outside a trusted network.
//
// # Outcomes
//
// Publish reports each event's outcome. By the endpoint's answer:
//
//	2xx                        delivered
//	408, 429, 5xx              retried within the call, then returned as a
//	                           plain error: the relay retries later
//	timeout, connection error  same (Config.Timeout bounds each attempt)
//	3xx                        permanent: redirects are not followed
//	401, 403                   permanent: wrong secret or credentials
//	404, 410                   permanent: no route for the event
//	other 4xx, 1xx, others     permanent
//
// A permanent failure is a ferrysink.PermanentError whose reason holds the
// URL (without query or credentials), the status and the first 512 bytes of
// the response body, cleaned for a log line, plus what to do; the relay
// dead-letters the event and redrive sends it again once fixed. Statuses in
// Config.TransientStatus are retried instead: list 401 and 403 while a
// secret rotation rolls out, or 404 while receivers are being deployed, so
// that those events wait rather than pile up as dead letters. An endpoint
// that wants an event again later answers 503 (with Retry-After) or 429,
// never 404.
//
// Before any request, an event fails permanently when its payload is over
// Config.MaxBodyBytes (DefaultMaxBodyBytes, 1 MiB, Ferry's default payload
// limit), when Config.Endpoint gives it no http(s) URL, or when HTTP cannot
// carry its headers.
//
// Within a call, a transient failure is retried up to Config.MaxAttempts
// attempts in all, after a jittered exponential backoff (Config.RetryBase
// to Config.RetryMax) or after the wait a Retry-After header asks for, in
// seconds or as an HTTP date, at most Config.MaxRetryAfter. When that wait
// would end after the call's context deadline, the failure is returned at
// once. A context that ends makes Publish return at once with errors
// wrapping context.Cause, never permanent ones.
//
// # Ordering
//
// The relay never puts two events of one key in a call and waits for a
// call's outcome before it sends a key's next event, so Publish sends the
// events of a call concurrently, up to Config.MaxInFlight at a time across
// the sink, and the endpoint receives each key's events in order. The sink
// adds two guards: a key never has two requests in flight, even when a
// call ended before its request did; and should a call hold several
// events of one key, they are sent one after the other, and once one fails
// the later ones fail without being sent. The sink does not implement
// ferrysink.OrderedBatcher.
//
// HTTP gives no way to take back a request: one that timed out, or whose
// connection broke after it was sent, may still be processed by the
// endpoint, possibly after the retry that succeeded and after the key's
// next event. Delivery is therefore at least once, and in order except
// for such a late copy of an event already delivered. Receivers apply each
// event ID once (Ferry's consumer inbox does) and can use ce-ferrykeyseq
// to notice a copy arriving after a later event.
//
// # Receiving
//
// In Go, mount Handler, which verifies, decodes and calls your function:
//
//	http.Handle("POST /hooks/ferry", ferrywebhook.Handler(secrets, func(ctx context.Context, ev ferryevent.Event) error {
//		_, err := consumer.Ingest(ctx, []*ferryevent.Event{&ev}) // the group's inbox deduplicates
//		return err
//	}))
//
// It answers 204 when the function returns nil, 500 when it fails (the
// sink retries), 422 when it fails with a ferrysink.PermanentError (the
// sink dead-letters the event with its reason), 401 for a bad signature,
// 400 for a malformed event and 413 for a body over DefaultMaxBodyBytes.
// Verify and DecodeRequest are its parts, for another body limit or
// tolerance.
//
// In another language: read the raw body; check that webhook-timestamp is
// within five minutes of your clock; compute base64(HMAC-SHA256(key,
// "{webhook-id}.{webhook-timestamp}.{body}")) with key the base64-decoded
// text after "whsec_", and compare it in constant time with each
// space-separated "v1," entry of webhook-signature. Any Standard Webhooks
// library does exactly this. Then read the event from the ce- headers
// (percent-decoded), Content-Type and the body, or with any CloudEvents
// SDK's binary-mode HTTP reader.
//
// Stability: this package may change between minor versions until 1.0.
package ferrywebhook
