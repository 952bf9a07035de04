package sharedbudget

// Evidence: a silent replica's lease (a residual hold, or a lease its
// replica missed a renewal of) ends as soon as the backend's figures show
// that its requests are gone (see doc.go, "Residual holds").
// A killed replica's connections closed with it, and the backend aborted
// its requests: what the GPU holds then is covered by what the live
// replicas' requests may hold. A paused or cut-off replica's requests run
// on, and the GPU holds more than the live replicas' bounds: the hold stays,
// up to its timer.

// EvidenceReports is how many consecutive reports of a GPU's backends must
// find its use covered by the fresh replicas' holds, while another replica
// is silent, before the silent replicas' leases on it are ended: one
// report may have been read while a paused replica's requests were between
// two steps of the backend.
const EvidenceReports = 2

// Report is one report of a GPU's backends, as the gateway reads it for the
// fleet (Replica.Observe). Bytes of one GPU.
type Report struct {
	// Used is what the backends report in use (their KV usage × pool).
	Used int64
	// Own is what the requests this replica admitted there may hold now,
	// read when the report is: the guard's now, a bound.
	Own int64
	// Tolerance is what the backends may hold beyond the admitted requests'
	// bounds without it meaning anything: scrape lag, their own blocks (the
	// reconciliation's tolerance).
	Tolerance int64
	// Running is how many requests the backends report (running and
	// waiting), OwnRunning how many this replica admitted there.
	Running, OwnRunning int64
}

// Evidence follows one GPU's reports for residual holds to end. It is a
// value with no clock and no lock; its caller serialises Observe. The zero
// value is ready.
type Evidence struct {
	covered int // consecutive reports covered while a residual hold counted
}

// Observe takes a report and this replica's lessee's standing at its last
// call (Lessee.Stats), and says whether the silent replicas' leases should
// go now (Lessee.DropResidual): for EvidenceReports reports in a row, each
// while another replica was silent (Stats.Silent), the backends held no more than this replica's
// requests may hold, plus the fresh replicas' published holds
// (Stats.OthersHold), plus the tolerance, and ran no more requests than
// this replica and the fresh ones admitted (Stats.OthersRunning). The
// silent replicas' holds are left out: what they may hold is the question.
// The live side is a bound, above the truth by the bounds' slack, which
// could hide a silent replica's memory; its requests' count has no such
// slack beyond the few between a gateway and the backend, so a silent
// replica whose requests still run shows in it.
func (e *Evidence) Observe(r Report, st Stats) bool {
	if st.Silent <= 0 || st.Fallback {
		e.covered = 0
		return false
	}
	if r.Used > r.Own+st.OthersHold+r.Tolerance || r.Running > r.OwnRunning+st.OthersRunning {
		e.covered = 0
		return false
	}
	e.covered++
	if e.covered < EvidenceReports {
		return false
	}
	e.covered = 0
	return true
}
