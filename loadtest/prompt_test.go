package loadtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
)

// pieceTokenizer counts like a byte-level BPE: every space-led word is cut
// into pieces of at most four bytes, plus a BOS token; a chat adds a
// template of chatOverhead tokens. It is additive over words, as real
// whitespace-splitting tokenizers are.
type pieceTokenizer struct {
	chatOverhead int
	noChat       bool
	calls        atomic.Int64
}

func (p *pieceTokenizer) Count(_ context.Context, prompt string) (int, error) {
	p.calls.Add(1)
	n := 1 // BOS
	for i, w := range strings.Fields(prompt) {
		b := len(w)
		if i > 0 {
			b++ // the leading space
		}
		n += (b + 3) / 4
	}
	return n, nil
}

func (p *pieceTokenizer) CountChat(ctx context.Context, content string) (int, error) {
	if p.noChat {
		return 0, fmt.Errorf("%w: no chat template", errors.ErrUnsupported)
	}
	n, _ := p.Count(ctx, content)
	return n + p.chatOverhead, nil
}

func TestCalibrateAndBuildExactLengths(t *testing.T) {
	for _, chat := range []bool{false, true} {
		tok := &pieceTokenizer{chatOverhead: 9}
		checks := []int{2, 11, 17, 100, 512, 2048} // 11: the chat template (9) and a word with its BOS
		gen, cal, err := calibrate(context.Background(), tok, chat, checks, 1)
		if err != nil {
			t.Fatal(err)
		}
		wantErr := 0
		if chat {
			wantErr = 9 // the 2-token check cannot hold a 9-token template
		}
		if cal.Source != "tokenize" || cal.Checked != len(checks) || cal.MaxAbsError != wantErr {
			t.Errorf("chat=%v: calibration %+v, want exact", chat, cal)
		}
		if chat && (!cal.ChatOverheadKnown || cal.ChatOverhead != 9) {
			t.Errorf("chat overhead %d known %v, want 9", cal.ChatOverhead, cal.ChatOverheadKnown)
		}
		r := rand.New(rand.NewPCG(3, 4))
		for _, target := range []int{12, 64, 333, 1000, 4096} {
			text, predicted := gen.build(r, target)
			got, _ := tok.Count(context.Background(), text)
			if chat {
				got, _ = tok.CountChat(context.Background(), text)
			}
			if got != target || predicted != target {
				t.Errorf("chat=%v target %d: server counts %d, model predicts %d", chat, target, got, predicted)
			}
		}
	}
}

func TestCalibrateWithoutChatTemplate(t *testing.T) {
	tok := &pieceTokenizer{noChat: true}
	_, cal, err := calibrate(context.Background(), tok, true, []int{50}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if cal.ChatOverheadKnown || !strings.Contains(cal.Note, "cannot tokenize a chat") {
		t.Errorf("calibration %+v should say the chat template is not counted", cal)
	}
}

type noTokenizer struct{ calls atomic.Int64 }

func (n *noTokenizer) Count(context.Context, string) (int, error) {
	n.calls.Add(1)
	return 0, fmt.Errorf("%w (HTTP 404)", errNoTokenize)
}
func (n *noTokenizer) CountChat(context.Context, string) (int, error) {
	return 0, errors.ErrUnsupported
}

func TestCalibrateProbesOnce(t *testing.T) {
	tok := &noTokenizer{}
	if _, _, err := calibrate(context.Background(), tok, true, []int{10}, 1); !errors.Is(err, errNoTokenize) {
		t.Fatalf("err = %v", err)
	}
	if c := tok.calls.Load(); c != 1 {
		t.Errorf("%d tokenize calls against a server without /tokenize, want 1", c)
	}
}

func TestEstimatedPromptGen(t *testing.T) {
	g := estimatedPromptGen()
	r := rand.New(rand.NewPCG(1, 1))
	text, n := g.build(r, 100)
	if n != 100 || len(strings.Fields(text)) != 99 { // 2 for the first word (BOS), 1 each after
		t.Errorf("estimate: %d predicted, %d words", n, len(strings.Fields(text)))
	}
	if text2, _ := g.build(r, 100); text2 == text {
		t.Error("two prompts are identical: a prefix cache would serve the second")
	}
	if _, n := g.build(r, 1); n != 2 {
		t.Errorf("a 1-token target gives the smallest prompt (2), got %d", n)
	}
}
