package sim

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/backends/kvevents"
)

// KVEventsConfig makes the server publish its prefix cache's changes as
// vLLM does under --kv-events-config (vllm/distributed/kv_events.py): a
// ZeroMQ PUB socket sending [topic, 8-byte big-endian sequence number,
// msgpack KVEventBatch] once per engine step that changed the cache, and a
// ROUTER socket that replays the batches it still buffers.
type KVEventsConfig struct {
	// Endpoint is where the PUB socket listens, e.g. tcp://*:5557.
	Endpoint string
	// ReplayEndpoint is where the replay socket listens; "" for none.
	ReplayEndpoint string
	// Topic leads every message; vLLM's default is "".
	Topic string
	// BufferSteps is how many batches the replay socket keeps; 0 means
	// 10000, vLLM's default.
	BufferSteps int
	// MapEncoding writes each batch and event as a map (msgspec's default)
	// instead of vLLM's positional arrays, to exercise subscribers.
	MapEncoding bool
}

// eventLog is what the engine tells its subscribers. The engine appends
// events under its mutex (pending) and cuts a batch at the end of each
// planning or commit that made any; the publisher sends batches in order
// from the buffer, which mu guards.
type eventLog struct {
	pending []kvevents.Event // under engine.mu

	mu      sync.Mutex
	buf     []eventBatch // the last batches, oldest first
	next    int64        // the sequence number of the next batch
	max     int
	wake    chan struct{}
	dropped bool // a test's knob: leave the next batch out of the stream
}

type eventBatch struct {
	seq    int64
	ts     float64
	events []kvevents.Event
	skip   bool // buffered for replay, never published (tests)
}

func newEventLog(max int) *eventLog {
	if max <= 0 {
		max = 10000
	}
	return &eventLog{max: max, wake: make(chan struct{}, 1)}
}

// cut ends the current batch, if it has events.
func (l *eventLog) cut(now time.Time) {
	if len(l.pending) == 0 {
		return
	}
	ev := l.pending
	l.pending = nil
	l.mu.Lock()
	l.buf = append(l.buf, eventBatch{seq: l.next, ts: float64(now.UnixNano()) / 1e9, events: ev, skip: l.dropped})
	l.dropped = false
	l.next++
	if len(l.buf) > l.max {
		l.buf = append(l.buf[:0], l.buf[len(l.buf)-l.max:]...)
	}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// from is the buffered batches from seq on.
func (l *eventLog) from(seq int64) []eventBatch {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) == 0 || seq > l.buf[len(l.buf)-1].seq {
		return nil
	}
	i := max(0, int(seq-l.buf[0].seq))
	return append([]eventBatch(nil), l.buf[i:]...)
}

// cutEventsLocked ends the batch of what the engine did since the last.
func (e *engine) cutEventsLocked() {
	if e.events != nil {
		e.events.cut(e.now())
	}
}

// storedLocked notes that block j of r (of sequence sq past the prompt)
// was cached under hash h: its parent is block j−1's hash and its tokens
// are the prompt's or what sq generated.
func (e *engine) storedLocked(r *request, sq *sequence, j int, h uint64) {
	bs := e.s.blockSize
	shared := r.prompt / bs
	ev := kvevents.Event{Kind: kvevents.BlockStored, Hashes: []kvevents.Hash{kvevents.IntHash(h)},
		BlockSize: bs, LoRA: -1, TokenIDs: make([]uint32, bs)}
	if j > 0 {
		var p uint64
		if j-1 < shared {
			p = r.hashes[j-1]
		} else {
			p = sq.hashes[j-1-shared]
		}
		ev.Parent = kvevents.IntHash(p)
	}
	for i := range bs {
		pos := j*bs + i
		if pos < r.prompt {
			ev.TokenIDs[i] = r.promptIDs[pos]
		} else {
			ev.TokenIDs[i] = uint32(outputTokenID(sq.key, pos-r.prompt))
		}
	}
	e.events.pending = append(e.events.pending, ev)
}

// removedLocked notes that the cache forgot the block hashed h.
func (e *engine) removedLocked(h uint64) {
	n := len(e.events.pending)
	if n > 0 && e.events.pending[n-1].Kind == kvevents.BlockRemoved {
		p := &e.events.pending[n-1]
		p.Hashes = append(p.Hashes, kvevents.IntHash(h))
		return
	}
	e.events.pending = append(e.events.pending, kvevents.Event{Kind: kvevents.BlockRemoved,
		Hashes: []kvevents.Hash{kvevents.IntHash(h)}, LoRA: -1})
}

// eventPublisher sends the engine's batches, as vLLM's ZmqEventPublisher.
type eventPublisher struct {
	cfg    KVEventsConfig
	log    *eventLog
	logger *slog.Logger
	pub    zmq4.Socket
	replay zmq4.Socket // nil without a replay endpoint
	cancel context.CancelFunc
	done   sync.WaitGroup
}

func startPublisher(cfg KVEventsConfig, l *eventLog, logger *slog.Logger) (*eventPublisher, error) {
	ctx, cancel := context.WithCancel(context.Background())
	p := &eventPublisher{cfg: cfg, log: l, logger: logger, cancel: cancel}
	p.pub = zmq4.NewPub(ctx)
	if err := p.pub.Listen(cfg.Endpoint); err != nil {
		cancel()
		return nil, fmt.Errorf("sim: kv events endpoint %s: %w", cfg.Endpoint, err)
	}
	if cfg.ReplayEndpoint != "" {
		p.replay = zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("kv-replay")))
		if err := p.replay.Listen(cfg.ReplayEndpoint); err != nil {
			cancel()
			p.pub.Close()
			return nil, fmt.Errorf("sim: kv events replay endpoint %s: %w", cfg.ReplayEndpoint, err)
		}
		p.done.Add(1)
		go p.serveReplay()
	}
	p.done.Add(1)
	go p.publish(ctx)
	logger.Info("publishing KV events", "endpoint", cfg.Endpoint, "replay", cfg.ReplayEndpoint, "topic", cfg.Topic)
	return p, nil
}

// Addr is where the PUB socket listens (its port, when asked for 0).
func (p *eventPublisher) Addr() string { return p.pub.Addr().String() }

// ReplayAddr is where the replay socket listens; "" if it has none.
func (p *eventPublisher) ReplayAddr() string {
	if p.replay == nil {
		return ""
	}
	return p.replay.Addr().String()
}

func (p *eventPublisher) encoding() kvevents.Encoding {
	if p.cfg.MapEncoding {
		return kvevents.Map
	}
	return kvevents.Positional
}

func (p *eventPublisher) encode(b eventBatch) ([]byte, error) {
	return kvevents.Encode(kvevents.Batch{TS: b.ts, Events: b.events, DPRank: -1}, p.encoding())
}

func (p *eventPublisher) publish(ctx context.Context) {
	defer p.done.Done()
	var sent int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.log.wake:
		}
		for _, b := range p.log.from(sent) {
			sent = b.seq + 1
			if b.skip {
				continue
			}
			payload, err := p.encode(b)
			if err != nil {
				p.logger.Warn("kv events: encode", "err", err)
				continue
			}
			seq := binary.BigEndian.AppendUint64(nil, uint64(b.seq))
			if err := p.pub.SendMulti(zmq4.NewMsgFrom([]byte(p.cfg.Topic), seq, payload)); err != nil {
				p.logger.Warn("kv events: publish", "err", err)
			}
		}
	}
}

// serveReplay answers [id, "", start] with [id, "", seq, batch] for each
// buffered batch from start, then [id, "", -1, ""].
func (p *eventPublisher) serveReplay() {
	defer p.done.Done()
	end := binary.BigEndian.AppendUint64(nil, ^uint64(0))
	for {
		msg, err := p.replay.Recv()
		if err != nil {
			return
		}
		f := msg.Frames
		if len(f) < 2 || len(f[len(f)-1]) != 8 {
			continue
		}
		id := f[0]
		start := int64(binary.BigEndian.Uint64(f[len(f)-1]))
		for _, b := range p.log.from(start) {
			payload, err := p.encode(b)
			if err != nil {
				continue
			}
			seq := binary.BigEndian.AppendUint64(nil, uint64(b.seq))
			if err := p.replay.SendMulti(zmq4.NewMsgFrom(id, []byte{}, seq, payload)); err != nil {
				break
			}
		}
		_ = p.replay.SendMulti(zmq4.NewMsgFrom(id, []byte{}, end, []byte{}))
	}
}

func (p *eventPublisher) close() {
	p.cancel()
	p.pub.Close()
	if p.replay != nil {
		p.replay.Close()
	}
	p.done.Wait()
}
