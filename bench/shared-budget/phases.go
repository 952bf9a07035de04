package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// phases runs the phases the package comment lists, in order, and
// prints the table and the verdicts.
func (b *bench) phases(ctx context.Context) error {
	o := b.o
	if o.tenants.only {
		return b.tenantsOnly()
	}
	// 1a. Saturation through the in-process gateway alone.
	mean1 := b.saturate("saturation, one gateway", []string{b.single}, "in-process")
	b.baselineOOM = b.oomSince()
	// 1b. The same load through the three replicas.
	fmt.Fprintf(os.Stderr, "saturation: %d clients across three replicas...\n", o.clients)
	fleetLoad := b.startLoad(b.replicas, o.clients)
	defer fleetLoad.halt()
	time.Sleep(o.warmup)
	kv := b.sampleKV()
	okBefore := make([]int64, 3)
	for i := range okBefore {
		okBefore[i] = fleetLoad.ok[i].Load()
	}
	_, shedB, failB, _ := fleetLoad.counts()
	oomB := b.oomSince()
	if o.trace {
		for range int(o.measure / (2 * time.Second)) {
			time.Sleep(2 * time.Second)
			var parts []string
			for i, u := range b.replicas {
				st, err := b.status(u)
				if err == nil {
					parts = append(parts, fmt.Sprintf("r%d leased %4d limit %4d committed %4d", i+1, st.leased/b.blockBytes, st.limit/b.blockBytes, st.committed/b.blockBytes))
				}
			}
			used, _ := b.simGauge("kvsim_kv_cache_used_blocks")
			fmt.Fprintf(os.Stderr, "  blocks: %s | sim used %4.0f\n", strings.Join(parts, " | "), used)
		}
	} else {
		time.Sleep(o.measure)
	}
	mean3, peak3 := kv.end()
	okA, shedA, failA, _ := fleetLoad.counts()
	oomA := b.oomSince()
	var per []string
	for i := range okBefore {
		per = append(per, strconv.FormatInt(fleetLoad.ok[i].Load()-okBefore[i], 10))
	}
	ok3 := okA - (okBefore[0] + okBefore[1] + okBefore[2])
	b.row("saturation, three replicas", "r1+r2+r3", strconv.FormatInt(ok3, 10), strconv.FormatInt(shedA-shedB, 10),
		strconv.FormatInt(failA-failB, 10), strconv.FormatInt(oomA-oomB, 10), pct(mean3), pct(peak3),
		fmt.Sprintf("%.1f req/s; served per replica %s", float64(ok3)/o.measure.Seconds(), strings.Join(per, "/")))
	b.check(mean1-mean3 <= 0.10, "real KV use at saturation: three replicas %s vs one gateway %s (within 10 points: %+.1f)", pct(mean3), pct(mean1), 100*(mean3-mean1))

	// 2. A capped tenant beside the bulk one, on all three replicas.
	b.tenantPhase(fleetLoad)

	// 3. Big requests at one replica while all three are busy.
	b.bigRequests(ctx, fleetLoad)

	// 4. Silent replicas: r1 paused, r2 cut off from Redis, r3 killed.
	b.paused(fleetLoad)
	b.cutOff(fleetLoad)
	b.killed(fleetLoad)
	st3 := gpuStatus{budget: b.budgetBlocks * b.blockBytes}

	// 5. Redis stopped, then started again.
	okB, shedB, failB, _ := fleetLoad.counts()
	oomB = b.oomSince()
	fmt.Fprintln(os.Stderr, "stopping redis-server...")
	b.redis.Stop()
	tookFallback, fellBack := waitUntil(30*time.Second, func() bool {
		_, _, fb := b.leasesOf(b.replicas[0], b.replicas[1])
		return fb == 2
	})
	kv = b.sampleKV()
	time.Sleep(15 * time.Second)
	meanOut, peakOut := kv.end()
	var limits []string
	for _, u := range b.replicas[:2] {
		if st, err := b.status(u); err == nil {
			limits = append(limits, fmt.Sprintf("%.0f", float64(st.limit)/(1<<20)))
		}
	}
	okA, shedA, failA, _ = fleetLoad.counts()
	oomA = b.oomSince()
	b.row("Redis stopped", "r1+r2", strconv.FormatInt(okA-okB, 10), strconv.FormatInt(shedA-shedB, 10), strconv.FormatInt(failA-failB, 10), strconv.FormatInt(oomA-oomB, 10),
		pct(meanOut), pct(peakOut), fmt.Sprintf("fallback after %.1f s; limits %s MiB (share %.0f MiB)", tookFallback.Seconds(), strings.Join(limits, "/"), float64(st3.budget/3)/(1<<20)))
	b.check(fellBack && okA > okB && oomA == oomB, "Redis stopped: both replicas on static shares after %.1f s, %d served, 0 overflow", tookFallback.Seconds(), okA-okB)

	okB, shedB, failB, _ = fleetLoad.counts()
	oomB = b.oomSince()
	fmt.Fprintln(os.Stderr, "starting redis-server again...")
	redis, err := b.kit.StartRedis(ctx, o.redisServer, b.redis.Addr)
	if err != nil {
		return err
	}
	b.redis = redis
	tookBack, back := waitUntil(30*time.Second, func() bool {
		for _, u := range b.replicas[:2] {
			st, err := b.status(u)
			if err != nil || st.fallback || st.leased == 0 || len(st.fleet) < 2 {
				return false
			}
		}
		return true
	})
	time.Sleep(5 * time.Second)
	okA, shedA, failA, _ = fleetLoad.counts()
	oomA = b.oomSince()
	l12, _, _ := b.leasesOf(b.replicas[0], b.replicas[1])
	b.row("Redis restarted", "r1+r2", strconv.FormatInt(okA-okB, 10), strconv.FormatInt(shedA-shedB, 10), strconv.FormatInt(failA-failB, 10), strconv.FormatInt(oomA-oomB, 10),
		"", "", fmt.Sprintf("leases resumed after %.1f s; r1+r2 lease %.0f MiB", tookBack.Seconds(), float64(l12)/(1<<20)))
	b.check(back, "Redis restarted: leases resumed after %.1f s", tookBack.Seconds())
	fleetLoad.halt()

	// 6. Light load: the latency a shared replica adds. Last, so that its
	// short answers (all cut by max_tokens) are a small part of what the
	// predictors learned.
	fmt.Fprintf(os.Stderr, "light load: %d requests to each of a shared replica and the in-process gateway...\n", o.latencyRequests)
	oomB = b.oomSince()
	if lat, err := b.latency([2]string{b.replicas[0], b.single}, o.latencyRequests); err != nil {
		// The table so far still says where an overflow happened.
		b.row("light load (2 clients)", "both", "", "", "", strconv.FormatInt(b.oomSince()-oomB, 10), "", "", "stopped: "+err.Error())
		b.check(false, "light load: %v", err)
	} else {
		shared, inproc := p50(lat[0]), p50(lat[1])
		added := shared - inproc
		b.row("light load (2 clients)", "in-process", strconv.Itoa(len(lat[1])), "", "", "", "", "", "p50 "+ms(inproc))
		b.row("light load (2 clients)", "shared r1", strconv.Itoa(len(lat[0])), "", "", "", "", "", fmt.Sprintf("p50 %s (%+.2f ms)", ms(shared), float64(added)/float64(time.Millisecond)))
		b.check(added <= time.Millisecond, "p50 latency added by the shared budget %+.2f ms (≤ 1 ms)", float64(added)/float64(time.Millisecond))
	}

	return b.finish()
}

// tenantsOnly is the tenants phase alone, after the fleet's warm-up.
func (b *bench) tenantsOnly() error {
	fmt.Fprintf(os.Stderr, "warm-up: %d clients across three replicas...\n", b.o.clients)
	fleetLoad := b.startLoad(b.replicas, b.o.clients)
	time.Sleep(b.o.warmup)
	b.tenantPhase(fleetLoad)
	fleetLoad.halt()
	return b.finish()
}

// finish checks the overflow over the whole run, prints the table and the
// verdicts, and fails if a bar was missed.
func (b *bench) finish() error {
	oom := b.oomSince() - b.baselineOOM
	b.check(oom == 0, "zero overflow behind the replicas: %d out-of-memory events in the simulator from the fleet's first request to the end", oom)
	if b.baselineOOM > 0 {
		b.note("the in-process gateway alone overflowed the simulator %d times on the same load: a limit of its %s policy, not of the shared budget", b.baselineOOM, b.o.reservation)
	}
	b.print()
	for _, v := range b.verdicts {
		if !v.ok {
			return errors.New("a bar was missed")
		}
	}
	return nil
}

// saturate runs the saturating load through targets and returns the mean
// KV use over the measured window.
func (b *bench) saturate(phase string, targets []string, label string) float64 {
	fmt.Fprintf(os.Stderr, "saturation: %d clients through %s...\n", b.o.clients, label)
	l := b.startLoad(targets, b.o.clients)
	time.Sleep(b.o.warmup)
	kv := b.sampleKV()
	okB, shedB, failB, _ := l.counts()
	oomB := b.oomSince()
	time.Sleep(b.o.measure)
	mean, peak := kv.end()
	okA, shedA, failA, _ := l.counts()
	oomA := b.oomSince()
	l.halt()
	ok := okA - okB
	b.row(phase, label, strconv.FormatInt(ok, 10), strconv.FormatInt(shedA-shedB, 10), strconv.FormatInt(failA-failB, 10), strconv.FormatInt(oomA-oomB, 10),
		pct(mean), pct(peak), fmt.Sprintf("%.1f req/s", float64(ok)/b.o.measure.Seconds()))
	// Let what is in flight finish before the next phase.
	time.Sleep(2 * time.Second)
	return mean
}

// waitUntil polls cond every 50 ms for up to limit and says how long it
// took (false if it never held).
func waitUntil(limit time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for time.Since(start) < limit {
		if cond() {
			return time.Since(start), true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return limit, false
}
