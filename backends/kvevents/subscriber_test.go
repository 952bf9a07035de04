package kvevents

import (
	"context"
	"encoding/binary"
	"runtime"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// rawPub is a publisher kvgate did not write: a bare zmq4 PUB socket whose
// messages the test builds frame by frame, as vLLM's ZmqEventPublisher
// sends them.
type rawPub struct {
	t    *testing.T
	sock zmq4.Socket
	addr string
}

func listenPub(t *testing.T, ctx context.Context, addr string) *rawPub {
	t.Helper()
	p := zmq4.NewPub(ctx)
	if err := p.Listen(addr); err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	return &rawPub{t: t, sock: p, addr: "tcp://" + p.Addr().String()}
}

// waitSubscribed returns once a subscriber's subscription reached the
// socket: PUB drops what it sends before.
func (p *rawPub) waitSubscribed() {
	tp := p.sock.(interface{ Topics() []string })
	deadline := time.Now().Add(10 * time.Second)
	for len(tp.Topics()) == 0 {
		if time.Now().After(deadline) {
			p.t.Fatal("no subscriber subscribed")
		}
		runtime.Gosched()
	}
}

func (p *rawPub) send(frames ...[]byte) {
	p.t.Helper()
	if err := p.sock.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
		p.t.Fatal(err)
	}
}

func seqFrame(n int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(n)) }

// storedPayload is a positional batch, hand-built, storing blocks named
// hashes (ints) of bs token ids each under parent (0 for none).
func storedPayload(t *testing.T, parent int64, ids []int, bs int, hashes ...int64) []byte {
	t.Helper()
	hs := make([]any, len(hashes))
	for i, h := range hashes {
		hs[i] = h
	}
	var p any
	if parent != 0 {
		p = parent
	}
	b, err := msgpack.Marshal([]any{1.5, []any{[]any{"BlockStored", hs, p, ids, bs, nil, nil}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// until waits for the subscriber's Stats to satisfy ok, woken by its
// changes; the deadline only ends a test that would hang.
func until(t *testing.T, s *Subscriber, what string, ok func(Stats) bool) Stats {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		ch := s.Changed()
		if st := s.Stats(); ok(st) {
			return st
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("never %s: %+v", what, s.Stats())
		}
	}
}

func u32(ids []int) []uint32 {
	out := make([]uint32, len(ids))
	for i, id := range ids {
		out[i] = uint32(id)
	}
	return out
}

func TestSubscriberRawPublisherFaults(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := listenPub(t, ctx, "tcp://127.0.0.1:0")
	x := NewIndex(testChain)
	sub := NewSubscriber(Config{Endpoint: pub.addr, Topic: "kv", Retry: 5 * time.Millisecond}, x, nil, nil)
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	pub.waitSubscribed()

	ids := []int{1, 2, 3, 4, 5, 6, 7, 8}
	chain := names(u32(ids), 4)
	topic := []byte("kv")

	// From the publisher's start: whole and exact.
	pub.send(topic, seqFrame(0), storedPayload(t, 0, ids[:4], 4, 11))
	pub.send(topic, seqFrame(1), storedPayload(t, 11, ids[4:], 4, 12))
	until(t, sub, "applied two batches", func(s Stats) bool { return s.Batches == 2 })
	if n, ok := x.Cached(chain); n != 2 || !ok {
		t.Fatalf("cached %d (whole %v), want 2 whole", n, ok)
	}

	// A gap with no replay socket: counted, and the index is not relied on.
	pub.send(topic, seqFrame(3), storedPayload(t, 0, ids[:4], 4, 21))
	st := until(t, sub, "counted the gap", func(s Stats) bool { return s.Faults[FaultGap] == 1 && s.Batches == 3 })
	if st.Whole {
		t.Fatal("whole after a gap")
	}
	if n, ok := x.Cached(chain); ok || n != 1 {
		t.Fatalf("after the gap: cached %d (whole %v), want the 1 block stored since, not whole", n, ok)
	}

	// A garbage frame: counted.
	pub.send(topic, seqFrame(4), []byte{0x93, 0xc1, 0xc1})
	pub.send(topic, []byte{1, 2, 3})
	until(t, sub, "counted the garbage", func(s Stats) bool { return s.Faults[FaultGarbage] == 2 })

	// The publisher goes away: counted; it restarts on the same address
	// from sequence 0, with an empty cache, and the index is whole again.
	if err := pub.sock.Close(); err != nil {
		t.Fatal(err)
	}
	until(t, sub, "noticed the publisher gone", func(s Stats) bool { return s.Faults[FaultGone] >= 1 && !s.Connected })
	pub = listenPub(t, ctx, pub.addr)
	pub.waitSubscribed()
	pub.send(topic, seqFrame(0), storedPayload(t, 0, ids, 4, 31, 32))
	st = until(t, sub, "recovered", func(s Stats) bool { return s.Whole && s.LastSeq == 0 })
	if n, ok := x.Cached(chain); n != 2 || !ok || st.Blocks != 2 {
		t.Fatalf("after the restart: cached %d (whole %v), %d blocks; want 2, whole, 2", n, ok, st.Blocks)
	}

	// Another topic is not ours.
	pub.send([]byte("other"), seqFrame(1), []byte("not even msgpack"))
	pub.send(topic, seqFrame(1), storedPayload(t, 0, []int{7, 7, 7, 7}, 4, 41))
	until(t, sub, "applied past the other topic", func(s Stats) bool { return s.LastSeq == 1 })
	if g := sub.Stats().Faults[FaultGarbage]; g != 2 {
		t.Fatalf("garbage faults %d after another topic's message, want still 2", g)
	}
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("Run returned %v", err)
	}
	pub.sock.Close()
}

// rawReplay answers replay requests as vLLM's ROUTER does: each buffered
// batch from the asked sequence as [id, "", seq, payload], then the end
// marker [id, "", -1, ""].
func rawReplay(t *testing.T, ctx context.Context, buffered map[int64][]byte) string {
	t.Helper()
	r := zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("replay")))
	if err := r.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer r.Close()
		for {
			msg, err := r.Recv()
			if err != nil {
				return
			}
			f := msg.Frames
			if len(f) != 3 || len(f[2]) != 8 {
				continue
			}
			id := f[0]
			for seq := int64(binary.BigEndian.Uint64(f[2])); ; seq++ {
				p, ok := buffered[seq]
				if !ok {
					break
				}
				_ = r.SendMulti(zmq4.NewMsgFrom(id, []byte{}, seqFrame(seq), p))
			}
			_ = r.SendMulti(zmq4.NewMsgFrom(id, []byte{}, seqFrame(-1), []byte{}))
		}
	}()
	return "tcp://" + r.Addr().String()
}

func TestSubscriberReplaysAGap(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ids := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	chain := names(u32(ids), 4)
	batches := map[int64][]byte{
		0: storedPayload(t, 0, ids[:4], 4, 11),
		1: storedPayload(t, 11, ids[4:8], 4, 12),
		2: storedPayload(t, 12, ids[8:], 4, 13),
	}
	replay := rawReplay(t, ctx, batches)
	pub := listenPub(t, ctx, "tcp://127.0.0.1:0")
	defer pub.sock.Close()
	x := NewIndex(testChain)
	sub := NewSubscriber(Config{Endpoint: pub.addr, Replay: replay}, x, nil, nil)
	go sub.Run(ctx)
	pub.waitSubscribed()
	// Joining late, at 2: what came before comes from the replay socket
	// (asked at connection, or at the gap), and the index is whole from
	// the publisher's start.
	pub.send([]byte("kv"), seqFrame(2), batches[2])
	st := until(t, sub, "replayed", func(s Stats) bool { return s.LastSeq == 2 })
	if st.Replayed < 2 || !st.Whole || st.Faults[FaultGap] != 0 {
		t.Fatalf("stats %+v; want 2 or 3 replayed, whole, no gap", st)
	}
	if n, ok := x.Cached(chain); n != 3 || !ok {
		t.Fatalf("cached %d (whole %v), want 3 whole", n, ok)
	}
	// A gap the replay buffer no longer covers: a counted fault.
	pub.send([]byte("kv"), seqFrame(9), storedPayload(t, 0, []int{5, 5, 5, 5}, 4, 99))
	st = until(t, sub, "counted the gap", func(s Stats) bool { return s.LastSeq == 9 })
	if st.Faults[FaultGap] != 1 || st.Whole {
		t.Fatalf("stats %+v; want a gap, not whole", st)
	}
}
