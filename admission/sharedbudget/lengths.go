package sharedbudget

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/admission/predict"
)

// The output lengths a fleet learns, shared. Every LengthsInterval each
// replica appends what its scheduler learned since the last time (a delta:
// admission.LengthsDelta, only samples it observed itself) to one Redis
// stream per model, and merges every other replica's deltas it has not yet
// read into its own predictors. Each sample is so counted once by every
// replica; a replica's own entries are skipped, and what it merged is never
// handed on. Old samples fade through the predictors' own decay window, so
// a replica that left stops counting as new traffic comes in; the stream
// keeps lengthsRetention of history, from which a replica that starts (or
// restarts) warms up at once: Start reads it before the gateway admits
// anything. An entry is skipped only when this process wrote it (its
// replica name and its instance, a random id per process): a replica that
// restarts under the same name reads what it learned before.
//
// While Redis is unreachable deltas accumulate locally and go out with the
// next exchange that succeeds.

// lengthsRetention is how much of a model's history its stream keeps: what
// a starting replica reads to warm up.
const lengthsRetention = 10 * time.Minute

// lengthsBatch bounds the entries read per model and exchange; more wait
// for the next one.
const lengthsBatch = 1000

// lengthSharer runs the exchange for one replica. sync runs on one
// goroutine at a time (run's, or close's after run returned); its fields
// need no lock.
type lengthSharer struct {
	client  redis.Cmdable
	sched   Scheduler
	prefix  string
	replica string
	// instance tells this process's entries from those of an earlier
	// process of the same replica name.
	instance string
	models   func() []string
	observe  func(op string, took time.Duration, err error)
	log      *slog.Logger
	now      func() time.Time // times the round trips

	last    map[string]string                 // per model: the last stream id read
	pending map[string]admission.LengthsDelta // per model: deltas not yet sent
	refused map[string]bool                   // per model and replica: a layout mismatch already logged
	failing bool                              // the last exchange failed (logged once per run of failures)
	merged  map[string]int                    // per model: entries merged, for logWarm
}

func newLengthSharer(c redis.Cmdable, sched Scheduler, prefix, replica string, models func() []string,
	observe func(string, time.Duration, error), log *slog.Logger, now func() time.Time) *lengthSharer {
	return &lengthSharer{client: c, sched: sched, prefix: prefix, replica: replica, models: models, observe: observe,
		log: log, now: now, last: map[string]string{}, pending: map[string]admission.LengthsDelta{},
		refused: map[string]bool{}, merged: map[string]int{}, instance: newInstanceID()}
}

func (x *lengthSharer) key(model string) string { return x.prefix + "lengths:" + model }

// run exchanges now and then every period on clock, until ctx ends.
func (x *lengthSharer) run(ctx context.Context, clock admission.Clock, period time.Duration) {
	t := newTicker(clock, period)
	for {
		_ = x.sync(ctx) // a failure is logged, and its samples wait for the next exchange
		if !t.wait(ctx) {
			return
		}
	}
}

// lengthsEntry is one stream entry's fields.
const (
	fieldReplica  = "r"
	fieldInstance = "i"
	fieldDelta    = "d"
)

// newInstanceID is a random id for this process's entries.
func newInstanceID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail on Linux
	return hex.EncodeToString(b[:])
}

// logWarm says what the first exchange merged, model by model.
func (x *lengthSharer) logWarm() {
	for m, n := range x.merged {
		x.log.Info("a model starts from the fleet's learned lengths", "model", m, "entries", n)
	}
}

// sync does one exchange: send this replica's new samples, merge the
// others'. It returns the error of a failed round trip (logged once per
// run of failures; the samples wait for the next exchange).
func (x *lengthSharer) sync(ctx context.Context) error {
	models := x.models()
	for _, m := range models {
		d, ok, err := x.sched.LengthsDelta(m)
		if err != nil || !ok {
			continue
		}
		x.pending[m] = addDelta(x.pending[m], d)
	}
	// Wall time, not the injected clock: the stream's ids are Redis's own
	// Unix milliseconds, and what is trimmed must be old by Redis's time.
	minID := strconv.FormatInt(time.Now().Add(-lengthsRetention).UnixMilli(), 10) + "-0"
	pipe := x.client.Pipeline()
	for _, m := range models {
		d, ok := x.pending[m]
		if !ok {
			continue
		}
		b, err := json.Marshal(d)
		if err != nil {
			delete(x.pending, m) // cannot happen with finite counts; never retry it
			continue
		}
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: x.key(m), MinID: minID, Approx: true,
			Values: []any{fieldReplica, x.replica, fieldInstance, x.instance, fieldDelta, b}})
		pipe.PExpire(ctx, x.key(m), lengthsRetention)
	}
	reads := make(map[string]*redis.XMessageSliceCmd, len(models))
	for _, m := range models {
		from := "-"
		if id, ok := x.last[m]; ok {
			from = "(" + id
		}
		reads[m] = pipe.XRangeN(ctx, x.key(m), from, "+", lengthsBatch)
	}
	start := x.now()
	_, err := pipe.Exec(ctx)
	if x.observe != nil {
		x.observe("lengths", x.now().Sub(start), err)
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		if !x.failing {
			x.failing = true
			x.log.Warn("sharing learned output lengths failed; retrying", "err", err)
		}
		return fmt.Errorf("lengths exchange: %w", err)
	}
	if x.failing {
		x.failing = false
		x.log.Info("sharing learned output lengths again")
	}
	clear(x.pending)
	for m, cmd := range reads {
		msgs, err := cmd.Result()
		if err != nil {
			continue
		}
		for _, msg := range msgs {
			x.last[m] = msg.ID
			x.mergeEntry(m, msg.Values)
		}
	}
	return nil
}

// mergeEntry merges one stream entry of model, unless this process wrote
// it (an entry of this replica's name without an instance is taken as its
// own too).
func (x *lengthSharer) mergeEntry(model string, v map[string]any) {
	from, _ := v[fieldReplica].(string)
	inst, _ := v[fieldInstance].(string)
	raw, _ := v[fieldDelta].(string)
	if (from == x.replica && (inst == "" || inst == x.instance)) || raw == "" {
		return
	}
	var d admission.LengthsDelta
	if err := json.Unmarshal([]byte(raw), &d); err != nil {
		x.log.Warn("unreadable learned-lengths entry from another replica; skipped", "model", model, "from", from, "err", err)
		return
	}
	if err := x.sched.MergeLengths(model, d); err != nil {
		if k := model + "\x00" + from; !x.refused[k] {
			x.refused[k] = true
			x.log.Warn("another replica's learned lengths do not merge here (does it configure another max_model_len?)",
				"model", model, "from", from, "err", err)
		}
		return
	}
	x.merged[model]++
}

// addDelta adds b to a (a delta not sent yet). A change of layout (a
// reload changed the model's max_model_len) drops what a counted in the
// old one.
func addDelta(a, b admission.LengthsDelta) admission.LengthsDelta {
	if a.All.Layout != b.All.Layout {
		return b
	}
	a.All = addSnapshot(a.All, b.All)
	a.Tenants = addSnapshots(a.Tenants, b.Tenants)
	a.Classes = addSnapshots(a.Classes, b.Classes)
	return a
}

// addSnapshots adds b's snapshots to a's of the same name.
func addSnapshots(a, b map[string]predict.Snapshot) map[string]predict.Snapshot {
	for name, s := range b {
		if a == nil {
			a = map[string]predict.Snapshot{}
		}
		if old, ok := a[name]; ok {
			a[name] = addSnapshot(old, s)
		} else {
			a[name] = s
		}
	}
	return a
}

func addSnapshot(a, b predict.Snapshot) predict.Snapshot {
	if len(a.Ended) != len(b.Ended) || len(a.Capped) != len(b.Capped) {
		return b
	}
	for i := range a.Ended {
		a.Ended[i] += b.Ended[i]
		a.Capped[i] += b.Capped[i]
	}
	return a
}
