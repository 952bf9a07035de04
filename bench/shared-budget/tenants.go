package main

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The tenants. Every gateway knows two: bulk, uncapped, in the default
// class, whose key the saturating load sends, and capped, with a share of
// the budget and the critical class, so that it wants more than its share
// (its requests go first wherever it is under its cap) and only its cap
// holds it back. The tenants phase adds the capped tenant's own closed
// loop, spread round robin over the three replicas, beside the bulk load
// that keeps them saturated, and samples each replica's /status: what the
// capped tenant holds on the fleet (the sum over the replicas) against
// share × budget, which the sum must never pass — each replica enforcing
// the share alone would let it hold three — and which it should come close
// to though the bulk tenant wants everything: the others' holds, read from
// Redis, must not cut it below its share.
const (
	bulkKey   = "key-bulk"
	cappedKey = "key-capped"
)

type tenantOptions struct {
	share                   float64
	clients                 int
	promptTokens, maxTokens int
	warmup, measure         time.Duration
	only                    bool
}

// tenantsYAML is the gateways' tenants section.
func (b *bench) tenantsYAML() string {
	return fmt.Sprintf("tenants:\n  - {name: bulk, api_keys: [%s]}\n  - {name: capped, api_keys: [%s], share: %g, class: critical}\n",
		bulkKey, cappedKey, b.o.tenants.share)
}

// tenantSample is one reading of the three replicas' /status.
type tenantSample struct {
	capped []int64 // per replica
	bulk   int64   // over the replicas
}

func (s tenantSample) sum() (n int64) {
	for _, v := range s.capped {
		n += v
	}
	return n
}

// tenantPhase runs the capped tenant's load beside fleetLoad (the bulk
// tenant's, saturating the three replicas) and checks its share across the
// fleet.
func (b *bench) tenantPhase(fleetLoad *load) {
	o := b.o.tenants
	st, err := b.status(b.replicas[0])
	if err != nil {
		b.check(false, "tenants: %v", err)
		return
	}
	limit := int64(o.share * float64(st.budget))
	fmt.Fprintf(os.Stderr, "tenants: %d clients of a tenant with share %g across three replicas, beside the bulk load...\n", o.clients, o.share)
	capped := b.startLoadAs(b.replicas, o.clients, tenantLoad{key: cappedKey, prompt: o.promptTokens, maxTokens: o.maxTokens})
	time.Sleep(o.warmup)
	okB, shedB := capped.served(), capped.shed.Load()
	bulkB := fleetLoad.served()
	oomB := b.oomSince()
	var samples []tenantSample
	for end := time.Now().Add(o.measure); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		s := tenantSample{capped: make([]int64, len(b.replicas))}
		ok := true
		for i, u := range b.replicas {
			st, err := b.status(u)
			if err != nil {
				ok = false
				break
			}
			s.capped[i] = st.tenants["capped"]
			s.bulk += st.tenants["bulk"]
		}
		if ok {
			samples = append(samples, s)
		}
	}
	okA, shedA := capped.served(), capped.shed.Load()
	bulkA := fleetLoad.served()
	oom := b.oomSince() - oomB
	capped.halt()
	if len(samples) == 0 {
		b.check(false, "tenants: no /status sample of the three replicas")
		return
	}

	sums := make([]int64, len(samples))
	perReplica := make([]float64, len(b.replicas))
	var bulk, over float64
	for k, s := range samples {
		sums[k] = s.sum()
		for i, v := range s.capped {
			perReplica[i] += float64(v)
		}
		bulk += float64(s.bulk)
		if sums[k] > limit {
			over++
		}
	}
	n := float64(len(samples))
	var mean float64
	for _, v := range sums {
		mean += float64(v)
	}
	mean /= n
	peak := slices.Max(sums)
	var per []string
	for i := range perReplica {
		per = append(per, mibs(int64(perReplica[i]/n)))
	}
	b.row(fmt.Sprintf("tenant share %g", o.share), "r1+r2+r3", strconv.FormatInt(okA-okB, 10), strconv.FormatInt(shedA-shedB, 10), "", strconv.FormatInt(oom, 10), "", "",
		fmt.Sprintf("capped holds (sum of r1+r2+r3, %d samples) mean %s = %.0f%% of its %s, peak %s = %.0f%%, over it in %.0f%% of samples; per replica mean %s; bulk mean %s, served %d",
			len(samples), mibs(int64(mean)), 100*mean/float64(limit), mibs(limit), mibs(peak), 100*float64(peak)/float64(limit), 100*over/n,
			strings.Join(per, "/"), mibs(int64(bulk/n)), bulkA-bulkB))
	b.check(peak <= limit, "tenant's share across the fleet: what it holds on r1+r2+r3 together peaks at %s, its share × budget %s", mibs(peak), mibs(limit))
	// Each replica takes its part of the share in whole requests, so the
	// most the tenant can hold is its share less up to a request on each:
	// not starved is within that of it on average. Its requests are all of
	// one size, the smallest hold a replica was seen with.
	req := limit
	for _, s := range samples {
		for _, v := range s.capped {
			if v > 0 {
				req = min(req, v)
			}
		}
	}
	floor := limit - int64(len(b.replicas))*req
	b.check(mean >= float64(floor), "tenant not starved beside a greedy one: it holds %.0f%% of its share on the fleet on average (>= %.0f%%: its share less a request of %s on each replica)",
		100*mean/float64(limit), 100*float64(floor)/float64(limit), mibs(req))
}

func mibs(n int64) string { return fmt.Sprintf("%.0f MiB", mib(n)) }
