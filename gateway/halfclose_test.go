package gateway

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/backends/sim"
)

// Issue 26, R5: a client that sends its request and then shuts its sending
// side (RFC 9112 allows it) was taken for gone: a non-streamed answer came
// back 200 with an empty body, a stream stopped without an error event or
// [DONE]. A stream under way now runs to its end for such a client; a
// request cancelled for the half-close says so (499 client_closed_request,
// or a final error event); none looks like a success it is not.
func TestHalfClosedClient(t *testing.T) {
	_, url := startSim(t, func(c *sim.Config) { c.TimeScale = 1 }) // 60 tokens take ~1 s: the hang-up watch is armed by then
	_, gwURL := startGateway(t, baseConfig(url, ""), Options{})
	for _, tc := range []struct {
		name   string
		stream bool
		// afterFirstEvent: shut the sending side once the stream's first
		// event has been read, else right after sending the request.
		afterFirstEvent bool
		// whole: the complete answer is owed; else a 499 or a final error
		// event is acceptable, an answer that looks complete but is not is
		// not.
		whole bool
	}{
		{"non-streamed", false, false, false},
		{"streamed, shut before the answer", true, false, false},
		{"streamed, shut during the stream", true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := chatBody("hi", 60, tc.stream)
			c, err := net.Dial("tcp", strings.TrimPrefix(gwURL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: kvgate\r\nContent-Type: application/json\r\nContent-Length: "+
				strconv.Itoa(len(body))+"\r\n\r\n"+body); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(c)
			var got strings.Builder
			if tc.afterFirstEvent {
				for !strings.Contains(got.String(), "data: {") {
					line, err := br.ReadString('\n')
					if err != nil {
						t.Fatalf("before the first event: %v\n%s", err, got.String())
					}
					got.WriteString(line)
				}
			}
			if err := c.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			rest, err := io.ReadAll(br) // the gateway closes after this answer
			if err != nil {
				t.Fatalf("reading the answer: %v", err)
			}
			got.Write(rest)
			resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(got.String())), nil)
			if err != nil {
				t.Fatalf("no answer: %v\n%q", err, got.String())
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			answer := string(b)
			complete := strings.Contains(answer, `"finish_reason":"length"`) && (!tc.stream || strings.HasSuffix(answer, "data: [DONE]\n\n"))
			switch {
			case resp.StatusCode == 200 && complete:
			case tc.whole:
				t.Fatalf("a half-closed client that still reads lost its answer: %d\n%s", resp.StatusCode, answer)
			case resp.StatusCode == statusClientClosed:
				if e := decodeError(t, answer); e.Error.Code == nil || *e.Error.Code != "client_closed_request" {
					t.Errorf("499: %s", answer)
				}
			case resp.StatusCode == 200 && tc.stream && strings.Contains(answer, `"code":"client_closed_request"`) && strings.HasSuffix(answer, "data: [DONE]\n\n"):
			default:
				t.Fatalf("a false success: %d\n%s", resp.StatusCode, answer)
			}
		})
	}
}
