package sim

import (
	"context"
	"encoding/binary"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

var recordKVEvents = flag.Bool("record-kv-events", false, "record the simulator's KV-event stream, in both encodings, into ../kvevents/testdata")

// TestRecordKVEvents records what a subscriber receives from the simulator's
// publisher, off the socket, for the decoder's tests in package kvevents:
// two sessions that share a system prompt, a second turn of each, and a
// long prompt that evicts blocks, on a pool of 24 blocks. The engine runs
// on a manual clock, so both encodings carry the same batches. Run with
// -record-kv-events to write the files again.
func TestRecordKVEvents(t *testing.T) {
	if !*recordKVEvents {
		t.Skip("records only with -record-kv-events")
	}
	for _, enc := range []struct {
		name   string
		mapEnc bool
	}{{"positional", false}, {"map", true}} {
		frames := recordStream(t, enc.mapEnc)
		out := filepath.Join("..", "kvevents", "testdata", "sim-"+enc.name+".frames")
		if err := os.WriteFile(out, frames, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d bytes", out, len(frames))
	}
}

// recordStream runs the workload and returns the messages received, each
// as a 4-byte big-endian count of frames, then each frame as a 4-byte
// big-endian length and its bytes.
func recordStream(t *testing.T, mapEnc bool) []byte {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := poolConfig(24)
	c.KVEvents = &KVEventsConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "kv", MapEncoding: mapEnc}
	e, _ := newTestEngine(t, c)
	pub, err := startPublisher(*e.s.kvEvents, e.events, e.s.logger)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.close()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.Dial("tcp://" + pub.Addr()); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"kv", "probe"} {
		if err := sub.SetOption(zmq4.OptionSubscribe, topic); err != nil {
			t.Fatal(err)
		}
	}
	msgs := make(chan zmq4.Msg, 1024)
	go func() {
		for {
			msg, err := sub.Recv()
			if err != nil {
				close(msgs)
				return
			}
			msgs <- msg
		}
	}()
	// A subscription reaches the publisher when it does: probe until a
	// probe comes through, then every batch will.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for probed := false; !probed; {
		select {
		case m := <-msgs:
			probed = string(m.Frames[0]) == "probe"
		case <-tick.C:
			if err := pub.pub.Send(zmq4.NewMsgFrom([]byte("probe"))); err != nil {
				t.Fatal(err)
			}
		}
	}
	for len(msgs) > 0 {
		<-msgs // probes sent before the first arrived
	}

	system := ids(9000, 32) // two blocks of 16 every session shares
	run := func(prompt []int, out int) {
		r := hreq(e.s, prompt, "", out, 1)
		if err := e.submit(r); err != nil {
			t.Fatal(err)
		}
		for r.state != stateDone {
			if _, ok := e.step(); !ok {
				t.Fatal("engine idle before the request finished")
			}
		}
	}
	a := append(append([]int(nil), system...), ids(1, 40)...)
	b := append(append([]int(nil), system...), ids(2, 40)...)
	run(a, 20)
	run(b, 20)
	run(append(a, ids(3, 20)...), 10) // a second turn re-sends a's history
	run(append(b, ids(4, 20)...), 10)
	run(ids(5, 300), 8) // a long prompt evicts what the sessions left
	e.events.mu.Lock()
	batches := int(e.events.next)
	e.events.mu.Unlock()

	var rec []byte
	for got := 0; got < batches; {
		msg, ok := <-msgs
		if !ok {
			t.Fatalf("stream ended after %d of %d batches", got, batches)
		}
		if string(msg.Frames[0]) == "probe" {
			continue
		}
		got++
		rec = binary.BigEndian.AppendUint32(rec, uint32(len(msg.Frames)))
		for _, f := range msg.Frames {
			rec = binary.BigEndian.AppendUint32(rec, uint32(len(f)))
			rec = append(rec, f...)
		}
	}
	return rec
}
