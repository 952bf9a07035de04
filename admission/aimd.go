package admission

// Feedback closes the loop with a backend's own measurement of its KV
// cache. overCeiling = true (the backend uses more than the ceiling: the
// predictions were low) multiplies the effective capacity by AIMD.Decrease,
// never below AIMD.MinFraction of the nominal capacity; false adds back
// AIMD.Increase of the nominal capacity (at least 1), never above it.
// Shrinking revokes nothing already held; growing admits waiters at once.
func (b *Budget) Feedback(overCeiling bool) {
	b.mu.Lock()
	old := b.effective
	if overCeiling {
		b.effective = min(old, max(int64(float64(old)*b.set.aimd.decrease), b.minEffectiveLocked()))
	} else {
		b.effective = min(b.nominal, old+max(1, int64(b.set.aimd.increase*float64(b.nominal))))
	}
	if b.effective > old {
		b.dispatchLocked()
	} else {
		b.checkLocked(opFeedback)
	}
	b.mu.Unlock()
}

// minEffectiveLocked is the floor the AIMD loop never shrinks below.
func (b *Budget) minEffectiveLocked() int64 {
	return max(1, int64(b.set.aimd.minFraction*float64(b.nominal)))
}
