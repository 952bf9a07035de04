package gateway

import (
	"bytes"
	"crypto/subtle"

	"github.com/valyala/fasthttp"
)

// authenticate finds the tenant of a request. With no keys configured every
// request is anonymous (nil tenant).
func (rt *runtime) authenticate(ctx *fasthttp.RequestCtx) (*tenant, bool) {
	if !rt.auth {
		return nil, true
	}
	key := bearer(ctx)
	if key == nil {
		return nil, false
	}
	t := rt.tenants[string(key)]
	return t, t != nil
}

// bearer is the key of an Authorization: Bearer header, nil without one.
func bearer(ctx *fasthttp.RequestCtx) []byte {
	auth := ctx.Request.Header.Peek("Authorization")
	if len(auth) < 7 || !bytes.EqualFold(auth[:7], []byte("bearer ")) {
		return nil
	}
	return bytes.TrimSpace(auth[7:])
}

// adminAllowed says whether a request may read an operator's view: always
// without admin keys, else only with one of them. Keys are compared in
// constant time.
func (rt *runtime) adminAllowed(ctx *fasthttp.RequestCtx) bool {
	keys := rt.cfg.Admin.APIKeys
	if len(keys) == 0 {
		return true
	}
	got := bearer(ctx)
	ok := 0
	for _, k := range keys {
		ok |= subtle.ConstantTimeCompare(got, []byte(k))
	}
	return ok == 1
}

func unauthorized() *apiError {
	return &apiError{status: 401, typ: typeAuthentication, code: "invalid_api_key",
		message: "Incorrect or missing API key. Send it as: Authorization: Bearer <key>."}
}
