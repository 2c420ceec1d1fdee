package ferrywebhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Signature headers, in the Standard Webhooks form (www.standardwebhooks.com).
const (
	// HeaderID carries the event ID; it is part of the signed content and
	// the key receivers deduplicate on.
	HeaderID = "webhook-id"
	// HeaderTimestamp carries the time of the attempt in Unix seconds;
	// receivers refuse a timestamp too far from their clock.
	HeaderTimestamp = "webhook-timestamp"
	// HeaderSignature carries one or more space-separated signatures
	// "v1,<base64 HMAC-SHA256>", one per secret.
	HeaderSignature = "webhook-signature"
)

// SecretPrefix starts every secret, as in Standard Webhooks.
const SecretPrefix = "whsec_"

// MinSecretBytes is the shortest secret accepted, in bytes before base64
// encoding (Standard Webhooks asks for 24 to 64).
const MinSecretBytes = 24

// DefaultTolerance is how far a signature's timestamp may be from the
// receiver's clock, either way, before Verify refuses it.
const DefaultTolerance = 5 * time.Minute

// signatureVersion prefixes an HMAC-SHA256 signature.
const signatureVersion = "v1,"

// ErrInvalidSignature is returned, wrapped, by Verify when a request is not
// signed by one of the secrets within the tolerance. Test for it with
// errors.Is.
var ErrInvalidSignature = errors.New("ferrywebhook: invalid webhook signature")

// NewSecret returns a new random secret: "whsec_" and the base64 encoding
// of 32 bytes from crypto/rand. Give it to Config.Secrets on the sender and
// to Handler or Verify on the receivers.
func NewSecret() string {
	key := make([]byte, 32)
	_, _ = rand.Read(key) // never fails: crypto/rand crashes the program instead
	return SecretPrefix + base64.StdEncoding.EncodeToString(key)
}

// parseSecrets decodes whsec_ secrets into HMAC keys.
func parseSecrets(secrets []string) ([][]byte, error) {
	keys := make([][]byte, 0, len(secrets))
	for i, s := range secrets {
		key, err := parseSecret(s)
		if err != nil {
			return nil, fmt.Errorf("secret %d of %d: %w", i+1, len(secrets), err)
		}
		keys = append(keys, key)
	}
	return keys, nil
}

func parseSecret(s string) ([]byte, error) {
	enc, ok := strings.CutPrefix(s, SecretPrefix)
	if !ok {
		return nil, fmt.Errorf("it does not start with %q; use a secret made by ferrywebhook.NewSecret (or %q followed by base64)", SecretPrefix, SecretPrefix)
	}
	key, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return nil, fmt.Errorf("the text after %q is not standard base64: %v", SecretPrefix, err)
	}
	if len(key) < MinSecretBytes {
		return nil, fmt.Errorf("it holds %d bytes, fewer than %d; make a longer one with ferrywebhook.NewSecret", len(key), MinSecretBytes)
	}
	return key, nil
}

// mac returns the HMAC-SHA256 of the signed content "{id}.{timestamp}.{body}".
func mac(h hash.Hash, id, timestamp string, body []byte) []byte {
	h.Reset()
	h.Write([]byte(id))
	h.Write([]byte{'.'})
	h.Write([]byte(timestamp))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// signature returns the webhook-signature value for the content: one v1
// signature per key, separated by spaces.
func signature(keys [][]byte, id, timestamp string, body []byte) string {
	var b strings.Builder
	for i, key := range keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(signatureVersion)
		b.WriteString(base64.StdEncoding.EncodeToString(mac(hmac.New(sha256.New, key), id, timestamp, body)))
	}
	return b.String()
}

// Sign returns the webhook-signature header value the sink would send for a
// message: one "v1," signature per secret, over "{id}.{timestamp}.{body}"
// with timestamp in Unix seconds. The Sink signs on its own; Sign is for
// receivers' tests, to build signed requests.
func Sign(secrets []string, id string, timestamp time.Time, body []byte) (string, error) {
	keys, err := parseSecrets(secrets)
	if err != nil {
		return "", fmt.Errorf("ferrywebhook: Sign: %w", err)
	}
	if len(keys) == 0 {
		return "", errors.New("ferrywebhook: Sign: no secret given")
	}
	return signature(keys, id, strconv.FormatInt(timestamp.Unix(), 10), body), nil
}

// Verify checks that a request was signed by one of secrets (any of them:
// keep the old and the new one during a rotation): header is the request's
// header, body its unmodified body. It reads webhook-id, webhook-timestamp
// and webhook-signature, refuses a timestamp more than tolerance away from
// now either way (tolerance <= 0: DefaultTolerance; a zero now: the
// current time), and accepts the request when any "v1" signature in the
// header matches, comparing in constant time. Signatures of other versions
// are ignored.
//
// It returns nil or an error wrapping ErrInvalidSignature that says what is
// wrong; an error that does not wrap it means a secret is malformed.
func Verify(secrets []string, header http.Header, body []byte, tolerance time.Duration, now time.Time) error {
	keys, err := parseSecrets(secrets)
	if err != nil {
		return fmt.Errorf("ferrywebhook: Verify: %w", err)
	}
	if len(keys) == 0 {
		return errors.New("ferrywebhook: Verify: no secret given; pass the secrets configured on the sender")
	}
	return verify(keys, header, body, tolerance, now)
}

func verify(keys [][]byte, header http.Header, body []byte, tolerance time.Duration, now time.Time) error {
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	if now.IsZero() {
		now = time.Now()
	}
	id := header.Get(HeaderID)
	ts := header.Get(HeaderTimestamp)
	sigs := header.Values(HeaderSignature)
	switch {
	case id == "":
		return fmt.Errorf("%w: the %s header is missing", ErrInvalidSignature, HeaderID)
	case ts == "":
		return fmt.Errorf("%w: the %s header is missing", ErrInvalidSignature, HeaderTimestamp)
	case len(sigs) == 0:
		return fmt.Errorf("%w: the %s header is missing", ErrInvalidSignature, HeaderSignature)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %s %q is not a number of seconds", ErrInvalidSignature, HeaderTimestamp, ts)
	}
	if skew := skewSeconds(sec, now); skew > tolerance.Seconds() {
		return fmt.Errorf("%w: %s %d is %.0fs from the receiver's clock (tolerance %s): a replay, or a clock to set right (NTP)",
			ErrInvalidSignature, HeaderTimestamp, sec, skew, tolerance)
	}

	macs := make([][]byte, len(keys))
	for i, key := range keys {
		macs[i] = mac(hmac.New(sha256.New, key), id, ts, body)
	}
	seen := 0
	for _, value := range sigs {
		for field := range strings.FieldsSeq(value) {
			enc, ok := strings.CutPrefix(field, signatureVersion)
			if !ok {
				continue // another scheme (v1a, ...) or garbage
			}
			seen++
			got, err := base64.StdEncoding.DecodeString(enc)
			if err != nil {
				continue
			}
			for _, want := range macs {
				if hmac.Equal(got, want) {
					return nil
				}
			}
		}
	}
	if seen == 0 {
		return fmt.Errorf("%w: %s holds no %q signature", ErrInvalidSignature, HeaderSignature, strings.TrimSuffix(signatureVersion, ","))
	}
	return fmt.Errorf("%w: none of the %d v1 signatures matches any of the %d secrets (wrong secret, or the body or %s was changed)",
		ErrInvalidSignature, seen, len(keys), HeaderID)
}

// skewSeconds is |sec - now| in seconds, without overflow.
func skewSeconds(sec int64, now time.Time) float64 {
	return math.Abs(float64(sec) - float64(now.Unix()))
}
