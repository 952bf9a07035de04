package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/admission"
)

// Config is where a publisher speaks: what vLLM's --kv-events-config
// names.
type Config struct {
	// Endpoint is the publisher's PUB socket, e.g. tcp://10.0.0.5:5557.
	Endpoint string
	// Topic is the topic its messages carry; "" takes every message.
	Topic string
	// Replay is its replay socket (ROUTER), e.g. tcp://10.0.0.5:5558; ""
	// when it has none, and then a lost message resets the index.
	Replay string
	// Retry is how long to wait before dialling again a publisher that
	// went away; default 1s.
	Retry time.Duration
	// ReplayTimeout bounds a replay request; default 2s.
	ReplayTimeout time.Duration
}

// Fault is a way the event stream failed the index.
type Fault uint8

// The faults a subscriber counts (Stats.Faults).
const (
	// FaultGone: the publisher could not be reached, or its connection
	// closed.
	FaultGone Fault = iota
	// FaultGap: a sequence number was skipped and replay did not fill it.
	FaultGap
	// FaultGarbage: a message that is not [topic, sequence, batch], or a
	// batch that does not decode.
	FaultGarbage
	numFaults
)

var faultNames = [numFaults]string{"publisher_gone", "gap", "garbage"}

func (f Fault) String() string { return faultNames[f] }

// Faults lists every Fault, for metrics.
func Faults() []Fault { return []Fault{FaultGone, FaultGap, FaultGarbage} }

// Stats is a subscriber's record, for metrics and /status.
type Stats struct {
	Connected bool
	Whole     bool
	Blocks    int
	Batches   uint64 // applied, replayed ones included
	Replayed  uint64 // batches recovered from the replay socket
	Restarts  uint64 // times the publisher's sequence started over
	Resets    uint64 // times the index was dropped for a lost message
	Faults    [numFaults]uint64
	LastFault string // the latest fault's error; "" if none
	LastSeq   int64  // -1 before the first message
}

// Subscriber follows one publisher's events into its Index. Run owns the
// sockets; Stats and the Index may be read from any goroutine.
//
// Sequence numbers are the publisher's count of its batches from 0. A
// number one past the last is applied; a skip asks the replay socket for
// what was missed and, failing that, resets the index (not whole); a
// number at or below the last means the publisher started over (a new
// process, whose cache starts empty): from 0 the index is whole again.
type Subscriber struct {
	cfg   Config
	index *Index
	clock admission.Clock
	log   *slog.Logger

	// last is the sequence number last applied, -1 before any; lost says
	// a message since was garbage, for which the index was reset already.
	// Only Run's goroutine touches them.
	last int64
	lost bool
	// dupUpTo is the last sequence number a replay at connection applied:
	// the SUB socket may deliver those again.
	dupUpTo int64

	connected atomic.Bool
	batches   atomic.Uint64
	replayed  atomic.Uint64
	restarts  atomic.Uint64
	resets    atomic.Uint64
	faults    [numFaults]atomic.Uint64
	lastSeq   atomic.Int64
	mu        sync.Mutex
	lastFault string
	changed   chan struct{} // closed and replaced at every change of Stats
}

// NewSubscriber follows cfg's publisher into x. A nil clock is the wall
// clock; a nil log discards.
func NewSubscriber(cfg Config, x *Index, clock admission.Clock, log *slog.Logger) *Subscriber {
	if cfg.Retry <= 0 {
		cfg.Retry = time.Second
	}
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = 2 * time.Second
	}
	if clock == nil {
		clock = admission.SystemClock()
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Subscriber{cfg: cfg, index: x, clock: clock, log: log, last: -1, dupUpTo: -1, changed: make(chan struct{})}
	s.lastSeq.Store(-1)
	return s
}

// Index is the index the subscriber keeps.
func (s *Subscriber) Index() *Index { return s.index }

// Changed is closed at the next change of the subscriber's Stats: a test
// or a status page waits on it instead of polling.
func (s *Subscriber) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

func (s *Subscriber) notify() {
	s.mu.Lock()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// Stats is the subscriber's record now.
func (s *Subscriber) Stats() Stats {
	st := Stats{
		Connected: s.connected.Load(),
		Batches:   s.batches.Load(),
		Replayed:  s.replayed.Load(),
		Restarts:  s.restarts.Load(),
		Resets:    s.resets.Load(),
		LastSeq:   s.lastSeq.Load(),
	}
	st.Blocks, st.Whole = s.index.Blocks()
	for i := range st.Faults {
		st.Faults[i] = s.faults[i].Load()
	}
	s.mu.Lock()
	st.LastFault = s.lastFault
	s.mu.Unlock()
	return st
}

// Run subscribes until ctx ends, dialling again after the publisher goes
// away; it returns ctx's error.
func (s *Subscriber) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		err := s.session(ctx)
		s.connected.Store(false)
		s.notify()
		if ctx.Err() != nil {
			break
		}
		s.fault(FaultGone, err)
		// What it publishes while it is away is lost to the index.
		s.reset()
		s.lost = true
		s.wait(ctx, s.cfg.Retry)
	}
	return ctx.Err()
}

// session is one connection: it returns why it ended.
func (s *Subscriber) session(ctx context.Context) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := zmq4.NewSub(sctx, zmq4.WithDialerMaxRetries(0)) // Run retries, on the clock: zmq4 sleeps through a cancel
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		return fmt.Errorf("kvevents: subscribe %q: %w", s.cfg.Topic, err)
	}
	if err := sub.Dial(s.cfg.Endpoint); err != nil {
		return fmt.Errorf("kvevents: dial %s: %w", s.cfg.Endpoint, err)
	}
	s.connected.Store(true)
	s.notify()
	s.log.Info("kv events: subscribed", "endpoint", s.cfg.Endpoint, "topic", s.cfg.Topic)
	s.dupUpTo = -1
	if s.cfg.Replay != "" {
		s.catchUp(ctx)
	}
	for {
		msg, err := sub.Recv()
		if err != nil {
			return fmt.Errorf("kvevents: receive from %s: %w", s.cfg.Endpoint, err)
		}
		s.handle(ctx, msg.Frames)
	}
}

// handle enters one published message.
func (s *Subscriber) handle(ctx context.Context, frames [][]byte) {
	seq, b, err := parseMessage(frames)
	if err != nil {
		// Its batch is lost, and with it what the index knew.
		s.fault(FaultGarbage, err)
		if !s.lost {
			s.reset()
		}
		s.lost = true
		return
	}
	if seq <= s.dupUpTo {
		return // already applied from the replay socket
	}
	s.dupUpTo = -1
	switch {
	case s.last >= 0 && seq == s.last+1:
	case s.last >= 0 && seq <= s.last, s.last < 0 && seq == 0:
		if s.last >= 0 {
			s.restarts.Add(1)
			s.log.Info("kv events: publisher started over", "endpoint", s.cfg.Endpoint, "seq", seq, "last", s.last)
		}
		// A new process: its cache started empty with its sequence, so
		// what it published before this message is all there is to know.
		s.last = -1
		if seq == 0 || !s.replay(ctx, seq) {
			s.index.Reset(seq == 0)
		}
	default:
		// A gap, or a first message past 0: ask for what came before.
		if !s.replay(ctx, seq) && !s.lost {
			if s.last >= 0 {
				s.fault(FaultGap, fmt.Errorf("kvevents: sequence %d after %d", seq, s.last))
			}
			s.reset()
		}
	}
	s.apply(seq, b)
}

func (s *Subscriber) apply(seq int64, b Batch) {
	s.index.Apply(b)
	s.batches.Add(1)
	s.last, s.lost = seq, false
	s.lastSeq.Store(seq)
	s.notify()
}

// reset drops the index until it is whole again.
func (s *Subscriber) reset() {
	s.index.Reset(false)
	s.resets.Add(1)
}

func (s *Subscriber) fault(f Fault, err error) {
	s.faults[f].Add(1)
	s.mu.Lock()
	s.lastFault = err.Error()
	s.mu.Unlock()
	s.notify()
	s.log.Warn("kv events: index dropped to the estimate", "endpoint", s.cfg.Endpoint, "fault", f.String(), "err", err)
}

// parseMessage reads [topic, sequence, batch].
func parseMessage(frames [][]byte) (int64, Batch, error) {
	if len(frames) != 3 {
		return 0, Batch{}, fmt.Errorf("kvevents: a message of %d frames, want [topic, sequence, batch]", len(frames))
	}
	if len(frames[1]) != 8 {
		return 0, Batch{}, fmt.Errorf("kvevents: a sequence frame of %d bytes, want 8", len(frames[1]))
	}
	seq := int64(binary.BigEndian.Uint64(frames[1]))
	if seq < 0 {
		return 0, Batch{}, fmt.Errorf("kvevents: sequence %d", seq)
	}
	b, err := Decode(frames[2])
	return seq, b, err
}

// endSeq is the sequence number of the replay socket's end marker.
const endSeq = -1

// replay asks the replay socket for the batches from s.last+1 (from 0 on
// a first message) to upto−1 and applies them; it says whether they all
// came, in order. A first message with no replay socket cannot be made
// whole, but it is no fault either.
func (s *Subscriber) replay(ctx context.Context, upto int64) bool {
	if s.cfg.Replay == "" {
		return false
	}
	from := s.last + 1
	rs, ok := s.openReplay(ctx, from)
	if !ok {
		return false
	}
	defer rs.close()
	if s.last < 0 {
		s.index.Reset(false)
	}
	next := from
	for next < upto {
		seq, payload, err := rs.next()
		if errors.Is(err, errReplayFrames) {
			s.fault(FaultGarbage, err)
			return false
		}
		if err != nil {
			break
		}
		if seq < next {
			continue
		}
		if seq > next {
			break // the publisher no longer has what we missed
		}
		b, err := Decode(payload)
		if err != nil {
			s.fault(FaultGarbage, err)
			return false
		}
		if next == 0 {
			s.index.Reset(true)
		}
		s.apply(seq, b)
		s.replayed.Add(1)
		next++
	}
	return next >= upto
}

// catchUp asks a newly connected publisher's replay socket for all it
// still has. An empty buffer means it has published nothing since it
// started, so its cache is empty; a buffer from sequence 0 is its whole
// history. Either way the index is whole; otherwise it stays as it was.
func (s *Subscriber) catchUp(ctx context.Context) {
	rs, ok := s.openReplay(ctx, 0)
	if !ok {
		return
	}
	defer rs.close()
	var batches []Batch
	var seqs []int64
	for {
		seq, payload, err := rs.next()
		if errors.Is(err, errReplayEnd) {
			break
		}
		if err != nil {
			return // no end marker, or not a replay message: nothing is known
		}
		if int64(len(seqs)) != seq {
			return // not its whole history
		}
		b, err := Decode(payload)
		if err != nil {
			s.fault(FaultGarbage, err)
			return
		}
		batches, seqs = append(batches, b), append(seqs, seq)
	}
	s.index.Reset(true)
	s.last, s.lost = -1, false
	for i, b := range batches {
		s.apply(seqs[i], b)
		s.replayed.Add(1)
	}
	s.dupUpTo = s.last
	s.notify()
}

// replayStream is one request to the publisher's replay socket and the
// messages it answers with.
type replayStream struct {
	d      zmq4.Socket
	cancel context.CancelFunc
}

var (
	// errReplayEnd is the replay socket's end marker: it has sent all it has.
	errReplayEnd = errors.New("kvevents: end of replay")
	// errReplayFrames is a replay message that is not a sequence and a
	// batch.
	errReplayFrames = errors.New("kvevents: a replay message that is not a sequence and a batch")
)

// openReplay dials the replay socket and asks it for every batch from
// sequence from on. A socket deadline (ReplayTimeout) bounds the whole
// exchange: the one place a wall-clock bound is right, since it bounds a
// wait on the network, not a decision.
func (s *Subscriber) openReplay(ctx context.Context, from int64) (*replayStream, bool) {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.ReplayTimeout)
	d := zmq4.NewDealer(rctx, zmq4.WithDialerMaxRetries(0))
	rs := &replayStream{d: d, cancel: cancel}
	if err := d.Dial(s.cfg.Replay); err != nil {
		s.log.Warn("kv events: replay socket", "endpoint", s.cfg.Replay, "err", err)
		rs.close()
		return nil, false
	}
	if err := d.SendMulti(zmq4.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, uint64(from)))); err != nil {
		rs.close()
		return nil, false
	}
	return rs, true
}

// next is the next replayed batch: its sequence and payload; errReplayEnd
// at the end marker, errReplayFrames for a message that is not one, or the
// socket's error.
func (rs *replayStream) next() (int64, []byte, error) {
	msg, err := rs.d.Recv()
	if err != nil {
		return 0, nil, err
	}
	f := msg.Frames
	if len(f) > 0 && len(f[0]) == 0 {
		f = f[1:] // the ROUTER's empty delimiter
	}
	if len(f) != 2 || len(f[0]) != 8 {
		return 0, nil, fmt.Errorf("%w: %d frames", errReplayFrames, len(f))
	}
	seq := int64(binary.BigEndian.Uint64(f[0]))
	if seq == endSeq || len(f[1]) == 0 {
		return 0, nil, errReplayEnd
	}
	return seq, f[1], nil
}

func (rs *replayStream) close() {
	rs.d.Close()
	rs.cancel()
}

// wait waits d on the clock, or until ctx ends.
func (s *Subscriber) wait(ctx context.Context, d time.Duration) {
	done := make(chan struct{})
	t := s.clock.AfterFunc(d, func() { close(done) })
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-done:
	}
}
