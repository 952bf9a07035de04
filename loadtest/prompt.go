package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// vocabulary is what prompts are made of: common English words, each a single
// token after a space in the tokenizers of the common model families, so the
// estimate without /tokenize is close too. Random words keep every prompt
// distinct (no prefix-cache hits between requests or steps).
var vocabulary = strings.Fields(`
the of and to in is was he for it with as his on be at by had are but from or
have an they which one you were all we her she there would their will when who
him been has more if no out so said what up its about than into them can only
other new some could time these two may first then do any like my now over such
our man me even most made after also did many before must through back years
where much your way well down should because each just those people how too
little state good very make world still own see men work long get here between
both life being under never day same another know while last might us great old
year off come since against go came right used take three states himself few
house use during without again place around however home small found thought
went say part once high general upon school every does got united left number
course war until always away something fact water though less public put think
almost hand enough far took head yet government system better set told nothing
night end why called find going look asked later knew point next city business
give group toward young let room side social present given several order second
rather per least possible sense early body light face real form field whole
major line show music story case family word plan
`)

// promptGen builds prompts of a requested token length from the vocabulary.
// The model is additive: a prompt "w1 w2 … wk" holds first[w1] tokens (the
// first word plus whatever the server adds, a BOS token for instance) plus
// cost[wi] for every later word (" wi", with its leading space). With a
// whitespace-splitting tokenizer (BPE and SentencePiece both pre-split on
// spaces) that sum is exact; calibrate measures first and cost on the target
// and then checks the sum on sample prompts.
type promptGen struct {
	words    []string
	first    []int
	cost     []int
	ones     []int // words whose cost is exactly 1, to land on the length
	overhead int   // chat template tokens around a user message
	maxCost  int
	cheapest int // the word with the smallest first cost
}

func newPromptGen(words []string, first, cost []int, overhead int) *promptGen {
	g := &promptGen{words: words, first: first, cost: cost, overhead: overhead}
	for i, c := range cost {
		if c == 1 {
			g.ones = append(g.ones, i)
		}
		g.maxCost = max(g.maxCost, c)
		if first[i] < first[g.cheapest] {
			g.cheapest = i
		}
	}
	return g
}

// estimatedPromptGen assumes one token a word, one more for the first (a BOS
// token) and no chat overhead: the fallback when the target cannot tokenize.
func estimatedPromptGen() *promptGen {
	first, cost := make([]int, len(vocabulary)), make([]int, len(vocabulary))
	for i := range vocabulary {
		first[i], cost[i] = 2, 1
	}
	return newPromptGen(vocabulary, first, cost, 0)
}

// build returns a prompt of target tokens as the server will count them, and
// the count the model predicts (short of target only when target is below
// the smallest possible prompt).
func (g *promptGen) build(r *rand.Rand, target int) (string, int) {
	var b strings.Builder
	b.Grow(target * 6)
	w := r.IntN(len(g.words))
	if g.overhead+g.first[w] > target {
		w = g.cheapest // a short target still gets as close as it can
	}
	b.WriteString(g.words[w])
	total := g.overhead + g.first[w]
	for total < target {
		left := target - total
		var pick int
		switch {
		case left >= g.maxCost:
			pick = r.IntN(len(g.words))
		case len(g.ones) > 0:
			pick = g.ones[r.IntN(len(g.ones))]
		default:
			pick = -1
			for i := range g.words { // rare: no one-token word
				if g.cost[i] <= left {
					pick = i
					break
				}
			}
			if pick < 0 {
				return b.String(), total
			}
		}
		if g.cost[pick] > left || g.cost[pick] <= 0 {
			continue
		}
		b.WriteByte(' ')
		b.WriteString(g.words[pick])
		total += g.cost[pick]
	}
	return b.String(), total
}

// Tokenizer counts tokens the way the target does.
type Tokenizer interface {
	// Count is the number of tokens of prompt (with the special tokens the
	// server adds to a completion prompt).
	Count(ctx context.Context, prompt string) (int, error)
	// CountChat is the number of tokens of a chat with one user message,
	// template included; ErrUnsupported when the server cannot say.
	CountChat(ctx context.Context, content string) (int, error)
}

// errNoTokenize means the target has no usable /tokenize.
var errNoTokenize = errors.New("no /tokenize endpoint")

// httpTokenizer is vLLM's POST /tokenize: {"model","prompt"} or
// {"model","messages"} → {"count","max_model_len","tokens"}.
type httpTokenizer struct {
	client *http.Client
	url    string
	model  string
	apiKey string

	mu          sync.Mutex
	maxModelLen int // from the last answer; 0 when not given
}

type tokenizeAnswer struct {
	Count       *int `json:"count"`
	MaxModelLen int  `json:"max_model_len"`
}

func (t *httpTokenizer) post(ctx context.Context, body any) (int, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url, bytes.NewReader(data))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if t.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+t.apiKey)
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("tokenize: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return 0, fmt.Errorf("tokenize: %w", err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed:
		return 0, fmt.Errorf("%w (HTTP %d)", errNoTokenize, resp.StatusCode)
	case resp.StatusCode != http.StatusOK:
		return 0, fmt.Errorf("tokenize: %s", errorMessage(raw, resp.Status))
	}
	var a tokenizeAnswer
	if err := json.Unmarshal(raw, &a); err != nil || a.Count == nil {
		return 0, fmt.Errorf("%w: answer has no count: %s", errNoTokenize, truncate(string(raw), 200))
	}
	if a.MaxModelLen > 0 {
		t.mu.Lock()
		t.maxModelLen = a.MaxModelLen
		t.mu.Unlock()
	}
	return *a.Count, nil
}

func (t *httpTokenizer) Count(ctx context.Context, prompt string) (int, error) {
	return t.post(ctx, map[string]any{"model": t.model, "prompt": prompt})
}

func (t *httpTokenizer) CountChat(ctx context.Context, content string) (int, error) {
	n, err := t.post(ctx, map[string]any{
		"model": t.model, "messages": []chatMessage{{Role: "user", Content: content}}, "add_generation_prompt": true,
	})
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errors.ErrUnsupported, err)
	}
	return n, nil
}

func (t *httpTokenizer) MaxModelLen() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.maxModelLen
}

// PromptCalibration reports how prompt lengths were fitted to the target.
type PromptCalibration struct {
	// Source is "tokenize" (measured with the target's /tokenize, or with
	// the target named in From) or "estimate" (no /tokenize: one token a
	// word assumed).
	Source string `json:"source"`
	From   string `json:"from,omitempty"`
	// ChatOverhead is the chat template's tokens around the user message,
	// subtracted from every chat prompt; ChatOverheadKnown is false when the
	// server could not tokenize a chat, and the template is then not counted.
	ChatOverhead      int  `json:"chat_overhead_tokens"`
	ChatOverheadKnown bool `json:"chat_overhead_known"`
	// Check: sample prompts built and then tokenized; the largest and mean
	// absolute difference from the length aimed at.
	Checked     int     `json:"checked"`
	MaxAbsError int     `json:"max_abs_error_tokens"`
	MeanAbsErr  float64 `json:"mean_abs_error_tokens"`
	Note        string  `json:"note,omitempty"`
}

// calibrate measures the vocabulary on tok (two counts a word, sixteen at a
// time) and checks the model on sample prompts of the lengths in checks.
func calibrate(ctx context.Context, tok Tokenizer, chat bool, checks []int, seed uint64) (*promptGen, PromptCalibration, error) {
	cal := PromptCalibration{Source: "tokenize"}
	n := len(vocabulary)
	first, cost := make([]int, n), make([]int, n)
	// Probe once so a server without /tokenize costs one request, not 600.
	if _, err := tok.Count(ctx, vocabulary[0]); err != nil {
		return nil, cal, err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i, w := range vocabulary {
		g.Go(func() error {
			a, err := tok.Count(gctx, w)
			if err != nil {
				return err
			}
			b, err := tok.Count(gctx, w+" "+w)
			if err != nil {
				return err
			}
			first[i], cost[i] = a, b-a
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, cal, err
	}
	overhead := 0
	if chat {
		sample := "the world is still young"
		c, cerr := tok.CountChat(ctx, sample)
		p, perr := tok.Count(ctx, sample)
		if cerr == nil && perr == nil && c >= p {
			// The completion count holds the BOS the chat count also
			// holds, so the difference is the template alone.
			overhead, cal.ChatOverheadKnown = c-p, true
		} else {
			cal.Note = "the target cannot tokenize a chat; chat template tokens are not counted in prompt lengths"
		}
	}
	cal.ChatOverhead = overhead
	gen := newPromptGen(vocabulary, first, cost, overhead)
	r := rand.New(rand.NewPCG(seed, 0xca11b4a7e))
	var sumErr int
	for _, target := range checks {
		text, _ := gen.build(r, target)
		var got int
		var err error
		if chat && cal.ChatOverheadKnown {
			got, err = tok.CountChat(ctx, text)
		} else {
			got, err = tok.Count(ctx, text)
		}
		if err != nil {
			return nil, cal, err
		}
		d := got - target
		if d < 0 {
			d = -d
		}
		cal.Checked++
		sumErr += d
		cal.MaxAbsError = max(cal.MaxAbsError, d)
	}
	if cal.Checked > 0 {
		cal.MeanAbsErr = float64(sumErr) / float64(cal.Checked)
	}
	return gen, cal, nil
}
