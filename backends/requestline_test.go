package backends

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"

	"github.com/valyala/fasthttp"
)

// Issue 26, R10: a proxy sends the origin-form request line (RFC 9112
// §3.2.1) with the Host header set; the backends got the absolute form
// ("POST http://host:port/v1/... HTTP/1.1"), which only proxies must take.
func TestRequestLineIsOriginForm(t *testing.T) {
	for _, tc := range []struct {
		name, want string // the request line's method and target
		send       func(be *Backend) error
	}{
		{"completion", "POST /v1/chat/completions", func(be *Backend) error {
			req := fasthttp.AcquireRequest()
			defer fasthttp.ReleaseRequest(req)
			be.NewRequest(req, fasthttp.MethodPost, "/v1/chat/completions")
			req.SetBodyString("{}")
			r, err := be.Do(context.Background(), req)
			if err == nil {
				r.Release()
			}
			return err
		}},
		{"tokenize", "POST /tokenize", func(be *Backend) error {
			_, err := be.Tokenize(context.Background(), []byte(`{"model":"m","prompt":"hi"}`))
			return err
		}},
		{"health probe", "GET /health", func(be *Backend) error { be.Probe(context.Background()); return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			type seen struct{ line, host string }
			got := make(chan seen, 8)
			addr := rawServer(t, func(c net.Conn) {
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					got <- seen{req.Method + " " + req.RequestURI, req.Host} // RequestURI: the target as sent
					body := `{"count":1,"max_model_len":8192,"tokens":[1]}`
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
				}
			})
			be, err := NewBackend(Spec{Name: "b", URL: "http://" + addr, Models: []string{"m"}}, budgetOf(1), nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.send(be); err != nil {
				t.Fatal(err)
			}
			if s := <-got; s.line != tc.want || s.host != addr {
				t.Errorf("request line %q, Host %q; want %q (origin-form), Host %q", s.line, s.host, tc.want, addr)
			}
		})
	}
}
