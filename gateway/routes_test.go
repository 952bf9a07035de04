package gateway

import (
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestRouteTable: a route is one entry of the table. Two added here — an
// admitted one, reusing chat's API, and one the gateway answers itself —
// are dispatched, refused a method they do not take, listed by the 404
// and kept from the passthrough list, with nothing else changed.
func TestRouteTable(t *testing.T) {
	_, simURL := startSim(t, nil)
	cfg, err := Parse([]byte(baseConfig(simURL, "")), ".")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	table := append(slices.Clone(routeTable),
		route{method: "POST", path: "/test/chat", admits: true, api: chatCompletions},
		route{method: "GET", path: "/test/hello", serve: func(_ *Server, ctx *fasthttp.RequestCtx, _ string) {
			writeJSON(ctx, 200, map[string]string{"hello": "world"})
		}})
	s.routes = newRoutes(table)
	gwURL := serveLoopback(t, s.Serve, s.Shutdown)

	r := postJSON(gwURL, "/test/chat", chatBody("hi", 5, false))
	if r.err != nil || r.status != 200 || !strings.Contains(r.body, `"choices"`) {
		t.Fatalf("admitted route: %d %v %s", r.status, r.err, r.body)
	}
	resp, err := httpClient.Get(gwURL + "/test/hello/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"world"`) {
		t.Fatalf("own route: %d %s", resp.StatusCode, body)
	}
	r = postJSON(gwURL, "/test/hello", `{}`)
	if r.status != 405 || r.header.Get("Allow") != "GET" {
		t.Fatalf("wrong method: %d Allow %q %s", r.status, r.header.Get("Allow"), r.body)
	}
	r = postJSON(gwURL, "/test/nothing", `{}`)
	if e := decodeError(t, r.body); r.status != 404 || !strings.Contains(e.Error.Message, "POST /test/chat, GET /test/hello") {
		t.Fatalf("unknown route: %d %s", r.status, r.body)
	}
	for _, own := range []string{"/test/chat", "/test/hello"} {
		if !slices.Contains(s.routes.own, own) {
			t.Errorf("%s is not among the routes no passthrough entry may name: %v", own, s.routes.own)
		}
	}
	// The table served by default is untouched.
	if slices.Contains(ownRoutes, "/test/chat") {
		t.Error("the default table changed")
	}
}
