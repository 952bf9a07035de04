package gateway

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/internal/jsonscan"
)

// Resuming a stream the guard stopped.
//
// When the requests running on a GPU outgrow their forecast, the guard
// stops some of them before the backend runs out of blocks (admission's
// guard.go). A stopped stream need not be lost: the gateway does what vLLM
// does to a sequence it preempts — it frees the blocks and computes the
// sequence again later from its tokens. The upstream exchange is cut (the
// backend frees the blocks once it notices, which the reservation waits
// for), and once the request fits again it is sent anew: its prompt
// followed by what it had generated, to go on from there — for chat the
// text as a final assistant message with vLLM's continue_final_message,
// for completions the text appended to the prompt — and max_tokens less
// what was generated. The client's stream pauses and goes on; it never
// sees the cut. One stopped before its answer began (the backend still on
// its prompt) has generated nothing and sent the client nothing: it is
// sent again as it was (loop.go's turn), the cut exchange being the
// guard's, not the backend's failure.
//
// The continuation waits at the stopped request's place in the queue
// (admission.Request.Resumes) and is held at its worst case, with no
// Stopper: it cannot be stopped again, so a stream is resumed at most once
// and never starves. What cannot be continued exactly from its text is cut
// as before: several choices or sequences, a prompt of token ids, echo
// (chat's too), structured output, a client's own continue_final_message, and — found
// only while it streams — tool calls or a reasoning model's reasoning. A
// request that sets its own length goes on with it: ignore_eos as it was,
// min_tokens less what was generated. What was generated is the relay's
// count (tally.go): the backend's own where its chunks report it, or
// a bound never below it, so that the continuation never runs past the
// client's max_tokens (it may stop short of it under the bound).
//
// This file is the continuation and its turn. What it is made from is
// kept by the relay as the stream passes (resumeState, relay.go), for a
// request whose body can be continued (continuable, read with the body
// in parse.go) while the configuration resumes (AdmissionConfig.resumes).

// continuation is the body that goes on from the text generated: the body
// sent, with the text after the prompt and remaining tokens to generate.
func (rs *resumeState) continuation(kind endpoint, remaining, generated int) ([]byte, error) {
	var p, tp fastjson.Parser
	v, err := p.ParseBytes(rs.body())
	if err != nil {
		return nil, fmt.Errorf("parse the body sent: %w", err)
	}
	// Strings go in as JSON already quoted and are parsed, never read:
	// fastjson unescapes a string it is asked the type or bytes of, and
	// quotes it again the Go way (\a, \x01, \U000e0067), which is not
	// JSON. The text is the contents of JSON strings, so quoting it whole is
	// one.
	quoted := make([]byte, 0, len(rs.text.B)+2)
	quoted = append(append(append(quoted, '"'), rs.text.B...), '"')
	if err := fastjson.ValidateBytes(quoted); err != nil {
		return nil, fmt.Errorf("the generated text is not a JSON string: %w", err)
	}
	var a fastjson.Arena
	switch kind {
	case chatCompletions:
		msgs := v.Get("messages")
		if msgs == nil || msgs.Type() != fastjson.TypeArray {
			return nil, errors.New("the body sent has no messages")
		}
		text, err := tp.ParseBytes(quoted)
		if err != nil {
			return nil, fmt.Errorf("the generated text is not a JSON string: %w", err)
		}
		m := a.NewObject()
		m.Set("role", a.NewString("assistant"))
		m.Set("content", text)
		msgs.SetArrayItem(len(msgs.GetArray()), m)
		v.Set("add_generation_prompt", a.NewFalse())
		v.Set("continue_final_message", a.NewTrue())
	default:
		var prompt []byte
		if pv := v.Get("prompt"); pv != nil {
			prompt = pv.MarshalTo(nil) // as sent: a string's marshalling is its raw bytes
		}
		if len(prompt) < 2 || prompt[0] != '"' {
			return nil, errors.New("the body sent has no prompt string")
		}
		joined, err := tp.ParseBytes(append(append(prompt[:len(prompt)-1], rs.text.B...), '"'))
		if err != nil {
			return nil, fmt.Errorf("the prompt and the generated text: %w", err)
		}
		v.Set("prompt", joined)
	}
	setRemaining(v, &a, remaining, generated)
	return v.MarshalTo(nil), nil
}

// setRemaining sets a continuation's length fields: what remains to
// generate, and a floor on the output less what was generated.
func setRemaining(v *fastjson.Value, a *fastjson.Arena, remaining, generated int) {
	set := false
	for _, k := range [...]string{"max_tokens", "max_completion_tokens"} {
		if f := v.Get(k); f != nil && f.Type() != fastjson.TypeNull {
			v.Set(k, a.NewNumberInt(remaining))
			set = true
		}
	}
	if !set {
		v.Set("max_tokens", a.NewNumberInt(remaining))
	}
	// A floor on the output is a floor on the whole answer: what was
	// generated counts towards it. (ignore_eos goes on as it was.)
	if f := v.Get("min_tokens"); f != nil && f.Type() == fastjson.TypeNumber {
		v.Set("min_tokens", a.NewNumberInt(max(f.GetInt()-generated, 0)))
	}
}

// generatedForResume is what the stopped stream generated, as the
// continuation's max_tokens, min_tokens and usage take it: the relay's
// count where the backend reported it or events are tokens; where it is
// a bound (bytes of text), the backend's own count of the text, asked of
// its /tokenize — a bound would leave the continuation short of the
// client's max_tokens, or with none left at all — and the bound still
// where that fails.
func (x *exchange) generatedForResume() int {
	n := x.res.gen[0]
	c := x.res.counts[0]
	if c.hasReport || n <= c.events || x.backend == nil || !x.resume.capturing() {
		return n
	}
	body := make([]byte, 0, len(x.resume.text.B)+64)
	body = jsonscan.AppendString(append(body, `{"model":`...), x.m.name)
	body = append(append(append(body, `,"prompt":"`...), x.resume.text.B...), `","add_special_tokens":false}`...)
	t, err := x.backend.Tokenize(&x.rctx, body)
	if err != nil || t < c.events {
		x.s.log.Warn("could not count a stopped stream's text; resuming it by its bound", "backend", x.backend.Name(), "err", err)
		return n
	}
	return min(t, n)
}

// resumeTurn is the loop's turn for a stream the guard stopped (see the
// comment at the top): the continuation reserved, admitted at the stopped
// request's place in the queue, sent and its first event read. The error
// is why the stream cannot go on, as failure reads it.
func (x *exchange) resumeTurn() (upstream, error) {
	areq, body, err := x.continueFrom()
	if err != nil {
		return upstream{}, err
	}
	up, err := x.turn(areq, body, x.resume)
	if err == nil && up.er == nil {
		status := up.resp.Status()
		msg, _ := up.resp.ReadAll(64 << 10)
		up.release()
		return up, fmt.Errorf("the backend answered the continuation %d: %s", status, bytes.TrimSpace(msg))
	}
	if err == nil {
		x.stage.Store(stageStreaming) // a hang-up while it waited ended the request
	}
	return up, err
}

// continueFrom is how the stopped stream goes on: the continuation's
// reservation (its prompt the stopped one's and what was generated, its
// output what remains) and body. The error says why it cannot: the
// stream is then stopped as any other, or its client was gone.
func (x *exchange) continueFrom() (admission.Request, []byte, error) {
	rs := x.resume
	// While it waits nothing is written to the client, so a hang-up is
	// acted on at once, as before a stream.
	if x.stage.Swap(stageBefore) == stageHungUp {
		x.clientGone()
		return admission.Request{}, nil, errClientGone
	}
	generated := x.generatedForResume()
	remaining := x.res.outs[0] - generated
	var body []byte
	err := errStoppedForMemory
	if rs.capturing() && remaining >= 1 {
		if body, err = rs.continuation(x.req.kind, remaining, generated); err != nil {
			x.s.log.Warn("could not resume a stopped stream", "model", x.req.model, "err", err)
		}
	}
	if err != nil {
		x.rctx.cancel(errStoppedForMemory)
		return admission.Request{}, nil, err
	}
	rs.resumed, rs.carried, rs.opening = true, generated, true
	rs.lost.Store(true)
	// The stopped ticket is its linger's now: nothing of this exchange
	// may release it before the backend has let its blocks go, even if
	// the continuation is never admitted.
	stopped := x.ticket
	x.ticket = nil
	x.one = oneChoice{}
	x.counts[0] = x.res.prompts[0] + generated
	x.one.outs[0] = remaining
	x.res = newReservation(x.res.layout, x.counts[:1], x.one.outs[:], 1, 1, &x.one)
	return admission.Request{Pinned: true, Resumes: stopped}, body, nil
}
