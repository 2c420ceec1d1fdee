package bench

import (
	"encoding/binary"
	"errors"
	"strconv"

	"github.com/google/uuid"
)

// PayloadSize is the size of every benchmark event's payload.
const PayloadSize = 256

// Topic is the topic (and so the subject suffix) of every benchmark event.
const Topic = "events"

// The payload is JSON with fixed-width fields, so the bench's consumer can
// read it at fixed offsets and every contender can store it as JSON or
// bytes alike:
//
//	{"g":"<16 digits>","k":"<6>","s":"<10>","t":"<19>","pad":"xxx…"}
//
// g is the phase's global event index, k the key (account id), s the
// per-key sequence (the account's balance after the producer's update, so
// it follows commit order per key), t the intended send time in ns since the
// phase's clock base (0 for preloaded backlogs).
const (
	offG, lenG = 6, 16
	offK, lenK = offG + lenG + 7, 6
	offS, lenS = offK + lenK + 7, 10
	offT, lenT = offS + lenS + 7, 19
	offPad     = offT + lenT + 9
)

// Meta is what a benchmark event carries for the checks.
type Meta struct {
	G        int64 // global index within the phase
	Key      int   // account id
	Seq      int64 // per-key sequence, in commit order per key
	Intended int64 // intended send time, ns since the phase base; 0 if none
}

// EncodePayload writes m into a new PayloadSize-byte payload.
func EncodePayload(m Meta) []byte {
	b := make([]byte, 0, PayloadSize)
	b = append(b, `{"g":"`...)
	b = appendPadded(b, m.G, lenG)
	b = append(b, `","k":"`...)
	b = appendPadded(b, int64(m.Key), lenK)
	b = append(b, `","s":"`...)
	b = appendPadded(b, m.Seq, lenS)
	b = append(b, `","t":"`...)
	b = appendPadded(b, m.Intended, lenT)
	b = append(b, `","pad":"`...)
	for len(b) < PayloadSize-2 {
		b = append(b, 'x')
	}
	b = append(b, `"}`...)
	return b
}

func appendPadded(b []byte, v int64, width int) []byte {
	if v < 0 {
		v = 0
	}
	s := strconv.FormatInt(v, 10)
	for i := len(s); i < width; i++ {
		b = append(b, '0')
	}
	return append(b, s...)
}

var errPayload = errors.New("not a benchmark payload")

// DecodePayload reads the Meta of a payload made by EncodePayload.
func DecodePayload(p []byte) (Meta, error) {
	if len(p) != PayloadSize || p[0] != '{' || p[offG-1] != '"' || p[offPad-1] != '"' {
		return Meta{}, errPayload
	}
	g, ok1 := digits(p[offG : offG+lenG])
	k, ok2 := digits(p[offK : offK+lenK])
	s, ok3 := digits(p[offS : offS+lenS])
	t, ok4 := digits(p[offT : offT+lenT])
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return Meta{}, errPayload
	}
	return Meta{G: g, Key: int(k), Seq: s, Intended: t}, nil
}

func digits(b []byte) (int64, bool) {
	var v int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	return v, true
}

// EventID is the deterministic ID of event g of a phase: 8 bytes of the
// phase's nonce and 8 of g, with UUID version 8 bits. Every contender
// publishes it as the JetStream message ID (Nats-Msg-Id), so redelivered
// copies are dropped by the stream's duplicate window alike.
func EventID(nonce uint64, g int64) uuid.UUID {
	var u uuid.UUID
	binary.BigEndian.PutUint64(u[0:8], nonce)
	binary.BigEndian.PutUint64(u[8:16], uint64(g))
	u[6] = (u[6] & 0x0f) | 0x80 // version 8
	u[8] = (u[8] & 0x3f) | 0x80 // RFC 4122 variant
	return u
}

// KeyString is the event key of an account.
func KeyString(k int) string { return "acct-" + strconv.Itoa(k) }
