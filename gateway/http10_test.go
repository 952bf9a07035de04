package gateway

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// Issue 26, R8: RFC 9112 §6.1 forbids chunked transfer coding in an answer
// to an HTTP/1.0 request; a streamed answer went out chunked all the same.
// It is close-delimited instead: no Transfer-Encoding, no Content-Length,
// and the connection ends with the stream.
func TestStreamToHTTP10IsCloseDelimited(t *testing.T) {
	_, url := startSim(t, nil)
	_, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	for _, tc := range []struct {
		name   string
		stream bool
	}{{"streamed", true}, {"whole", false}} {
		t.Run(tc.name, func(t *testing.T) {
			body := chatBody("hi", 5, tc.stream)
			c, err := net.Dial("tcp", strings.TrimPrefix(gwURL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.0\r\nHost: kvgate\r\nContent-Type: application/json\r\nContent-Length: "+
				strconv.Itoa(len(body))+"\r\n\r\n"+body); err != nil {
				t.Fatal(err)
			}
			raw, err := io.ReadAll(c) // the answer ends with the connection
			if err != nil {
				t.Fatalf("reading the answer: %v", err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(string(raw))), nil)
			if err != nil {
				t.Fatalf("the answer: %v\n%s", err, raw)
			}
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("the body: %v\n%s", err, raw)
			}
			if resp.StatusCode != 200 || len(resp.TransferEncoding) > 0 || strings.Contains(strings.ToLower(string(raw)), "transfer-encoding") {
				t.Fatalf("status %d, transfer coding %v: an HTTP/1.0 client cannot read it\n%s", resp.StatusCode, resp.TransferEncoding, raw)
			}
			if tc.stream && !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
				t.Errorf("the stream does not end with [DONE]:\n%s", b)
			}
			if !tc.stream && !strings.Contains(string(b), `"usage"`) {
				t.Errorf("whole answer: %s", b)
			}
		})
	}
}
