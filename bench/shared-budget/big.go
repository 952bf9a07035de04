package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"
)

// bigRequests sends four requests of about 40% of the budget each to r1
// while the saturating load keeps all three replicas busy: each is more
// than a replica's fair third, so only a turn at the lease it needs serves
// it. Every one must be served, the small requests on r1 must stay within
// 2x the others' p99, and nothing may overflow.
func (b *bench) bigRequests(ctx context.Context, l *load) {
	const n = 4
	// 40% of the budget in tokens: most of it prompt (what a reservation
	// counts whatever the policy), a little output.
	tokens := int(b.budgetBlocks*16) * 40 / 100
	prompt, maxTokens := tokens-400, 400
	okB, shedB, failB, _ := l.counts()
	oomB := b.oomSince()
	l.recorded()
	l.record.Store(true)
	fmt.Fprintf(os.Stderr, "big requests: %d of ~%d tokens (40%% of the budget) to r1...\n", n, tokens)
	type answer struct {
		status int
		took   time.Duration
	}
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 99))
			start := time.Now()
			status, _, _, err := post(ctx, b.replicas[0], bulkKey, chatBody(rng, prompt, maxTokens))
			if err != nil {
				status = -1
			}
			answers[i] = answer{status, time.Since(start)}
		}()
		time.Sleep(500 * time.Millisecond)
	}
	wg.Wait()
	lat := l.recorded()
	okA, shedA, failA, _ := l.counts()
	oom := b.oomSince() - oomB
	served := 0
	var took []string
	for _, a := range answers {
		if a.status == 200 {
			served++
		}
		took = append(took, fmt.Sprintf("%d in %.1f s", a.status, a.took.Seconds()))
	}
	p99s := make([]time.Duration, len(lat))
	for i, d := range lat {
		p99s[i] = p99(d)
	}
	others := max(p99s[1], p99s[2])
	busy := len(lat[1]) > 0 && len(lat[2]) > 0
	b.row("4 big requests at r1", "r1+r2+r3", strconv.FormatInt(okA-okB, 10), strconv.FormatInt(shedA-shedB, 10), strconv.FormatInt(failA-failB, 10), strconv.FormatInt(oom, 10), "", "",
		fmt.Sprintf("big: %v; small p99 r1 %.1f s, r2 %.1f s, r3 %.1f s (served %d/%d/%d)", took,
			p99s[0].Seconds(), p99s[1].Seconds(), p99s[2].Seconds(), len(lat[0]), len(lat[1]), len(lat[2])))
	b.check(served == n && busy, "big requests at one replica: %d of %d served while the others served %d and %d", served, n, len(lat[1]), len(lat[2]))
	b.check(p99s[0] <= 2*others, "small requests on the big requests' replica: p99 %.1f s, within 2x the others' %.1f s", p99s[0].Seconds(), others.Seconds())
	b.check(oom == 0, "big requests: %d out-of-memory events (0)", oom)
}

func p99(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)*99)/100]
}
