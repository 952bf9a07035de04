package admission

import "math/bits"

// blockTable counts the holders of each shared prompt block of a GPU, by
// the block's name (a hash, mixed once more so that patterned names, as
// tests make them, spread too). An open-addressing table with linear probing: a
// request of a 4k-token prompt enters and takes out 255 names, which a Go
// map made a third of the scheduler's time per request. A slot is free
// when its count is 0; deletion shifts the probe run back, so no
// tombstones accumulate.
type blockTable struct {
	keys   []uint64
	counts []int32
	n      int  // names held
	shift  uint // 64 − log2(len(keys))
}

// home is name's first slot: Fibonacci hashing of it.
func (t *blockTable) home(name uint64) uint64 { return (name * 0x9e3779b97f4a7c15) >> t.shift }

// get is how many tickets hold name.
func (t *blockTable) get(name uint64) int32 {
	if t.n == 0 {
		return 0
	}
	mask := uint64(len(t.keys) - 1)
	for i := t.home(name); ; i = (i + 1) & mask {
		switch {
		case t.counts[i] == 0:
			return 0
		case t.keys[i] == name:
			return t.counts[i]
		}
	}
}

// inc adds a holder of name; first says it had none.
func (t *blockTable) inc(name uint64) (first bool) {
	if 2*(t.n+1) > len(t.keys) {
		t.grow()
	}
	mask := uint64(len(t.keys) - 1)
	for i := t.home(name); ; i = (i + 1) & mask {
		switch {
		case t.counts[i] == 0:
			t.keys[i], t.counts[i] = name, 1
			t.n++
			return true
		case t.keys[i] == name:
			t.counts[i]++
			return false
		}
	}
}

// dec takes a holder of name away; last says it was the last. A name not
// held is left alone.
func (t *blockTable) dec(name uint64) (last bool) {
	if t.n == 0 {
		return false
	}
	mask := uint64(len(t.keys) - 1)
	i := t.home(name)
	for ; t.keys[i] != name || t.counts[i] == 0; i = (i + 1) & mask {
		if t.counts[i] == 0 {
			return false
		}
	}
	if t.counts[i]--; t.counts[i] > 0 {
		return false
	}
	t.n--
	// Shift back the entries of the probe run after i that may sit
	// earlier, so that every entry stays reachable from its home slot.
	for j := (i + 1) & mask; t.counts[j] != 0; j = (j + 1) & mask {
		home := t.home(t.keys[j])
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.keys[i], t.counts[i] = t.keys[j], t.counts[j]
			t.counts[j] = 0
			i = j
		}
	}
	return true
}

func (t *blockTable) grow() {
	old, oldCounts := t.keys, t.counts
	size := max(2*len(old), 64)
	t.keys, t.counts, t.n = make([]uint64, size), make([]int32, size), 0
	t.shift = uint(64 - bits.TrailingZeros(uint(size)))
	mask := uint64(size - 1)
	for k, c := range oldCounts {
		if c == 0 {
			continue
		}
		i := t.home(old[k])
		for t.counts[i] != 0 {
			i = (i + 1) & mask
		}
		t.keys[i], t.counts[i] = old[k], c
		t.n++
	}
}

// each calls f for every name held and its count (tests).
func (t *blockTable) each(f func(name uint64, count int32)) {
	for i, c := range t.counts {
		if c != 0 {
			f(t.keys[i], c)
		}
	}
}
