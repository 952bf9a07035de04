package gateway

import (
	"encoding/hex"
	"math/rand/v2"

	"github.com/valyala/fasthttp"
)

// Request ids: every answer carries X-Request-Id, and the access line, the
// span and the backend (vLLM takes the header as its own request id) carry
// the same, so that a client's id finds its request in the operator's log
// and the backend's. A client's id is kept when it is sane — 1 to
// maxRequestID visible ASCII bytes, as Envoy and nginx expect of the
// header — and replaced otherwise, so that nothing a client sends is
// logged raw; a request without one gets a random (version 4) UUID, unique
// across replicas and restarts where a counter is not.

const (
	headerRequestID = "X-Request-Id"
	// maxRequestID bounds a client's X-Request-Id.
	maxRequestID = 128
)

// stampRequestID makes the request's X-Request-Id the one the gateway uses
// and puts it on the answer. It runs before routing, so every answer and
// refusal carries it; an error's reset of the answer keeps it (errors.go).
func stampRequestID(ctx *fasthttp.RequestCtx) {
	id := ctx.Request.Header.Peek(headerRequestID)
	if !saneRequestID(id) {
		var b [36]byte
		id = appendUUID(b[:0])
		ctx.Request.Header.SetBytesV(headerRequestID, id)
	}
	ctx.Response.Header.SetBytesV(headerRequestID, id)
}

// saneRequestID says whether a client's id may be kept as it is.
func saneRequestID(id []byte) bool {
	if len(id) == 0 || len(id) > maxRequestID {
		return false
	}
	for _, c := range id {
		if c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

// appendUUID appends a random version 4 UUID. math/rand/v2's generator is
// seeded from the system's entropy and is per-thread: no lock, no syscall.
func appendUUID(dst []byte) []byte {
	var u [16]byte
	hi, lo := rand.Uint64(), rand.Uint64()
	for i := range 8 {
		u[i], u[8+i] = byte(hi>>(56-8*i)), byte(lo>>(56-8*i))
	}
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], u[10:16])
	return append(dst, s[:]...)
}
