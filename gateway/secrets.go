package gateway

import (
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"strings"
	"syscall"

	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/internal/sse"
)

// Secrets never leave: an API key is not echoed to a client nor written to
// a log, and a client learns which backend failed, not where it listens.

// fasthttp's connection errors quote the bytes it could not parse — a
// client's request line and headers, its Authorization among them. Logged
// lines lose those dumps (quoted text spanning a line break, or what
// follows fasthttp's "contents:" and "buf=") and any credential left.
var (
	dumpMarkers  = []string{", contents: ", " contents: ", "buf="}
	quotedDump   = regexp.MustCompile(`"(?:[^"\\]|\\.)*\\[rn](?:[^"\\]|\\.)*"`)
	headerSecret = regexp.MustCompile(`(?i)((?:authorization|proxy-authorization|cookie|x-api-key|api-key):\s*)[^"\\\r\n]*`)
	bearerSecret = regexp.MustCompile(`(?i)(bearer\s+)[^\s"\\,]+`)
)

// redact makes a log line safe: no request dump, no credential.
func redact(s string) string {
	for _, m := range dumpMarkers {
		if i := strings.Index(s, m); i >= 0 {
			s = s[:i] + " [request bytes not logged]"
		}
	}
	s = quotedDump.ReplaceAllString(s, `"[request bytes not logged]"`)
	s = headerSecret.ReplaceAllString(s, "${1}[redacted]")
	return bearerSecret.ReplaceAllString(s, "${1}[redacted]")
}

// upstreamProblem says what went wrong talking to a backend in words a
// client may read: the backend's name and the kind of failure, never its
// address (which the error text carries, for the operator's log).
func upstreamProblem(backend string, err error) string {
	var what string
	var ne net.Error
	switch {
	case errors.Is(err, sse.ErrTruncated):
		what = "ended its stream before it was complete (no [DONE])"
	case errors.Is(err, sse.ErrTooLarge):
		what = "sent a stream event larger than this gateway relays (server.max_sse_line_bytes)"
	case errors.Is(err, backends.ErrTLS):
		// The certificate's detail is the operator's (in the log): it
		// names hosts and authorities a client need not see.
		what = "could not be reached: its TLS handshake failed"
	case errors.Is(err, syscall.ECONNREFUSED):
		what = "refused the connection"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		what = "reset the connection"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		what = "did not answer in time"
	case errors.Is(err, fasthttp.ErrConnectionClosed), strings.Contains(err.Error(), "EOF"):
		what = "closed the connection without a complete answer"
	default:
		what = "could not be reached or sent a malformed answer"
	}
	if backend == "" {
		return "The backend " + what + "."
	}
	return fmt.Sprintf("The backend %q %s.", backend, what)
}
