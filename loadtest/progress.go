package loadtest

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// StepInfo names the attempt a progress call is about.
type StepInfo struct {
	Target   string
	Mode     Mode
	Level    float64
	Attempt  int
	Requests int           // counted requests planned; 0 when time-bound
	Duration time.Duration // counted time planned; 0 when count-bound

	// The whole run: this is step Step (from 1) of Steps planned (every
	// level of every target; 0 when a search decides how many), begun
	// RunElapsed after the run's first. A plan that stops at its first
	// unsafe level may end sooner; re-runs come on top.
	Step, Steps int
	RunElapsed  time.Duration
}

// runPart places the step in the whole run: "step 3/10, 1m20s in, ~2m40s
// left", the time left at the pace of the steps done so far.
func (s StepInfo) runPart() string {
	if s.Step == 0 {
		return ""
	}
	part := fmt.Sprintf("step %d", s.Step)
	if s.Steps > 0 {
		part += fmt.Sprintf("/%d", s.Steps)
	}
	part += ", " + s.RunElapsed.Round(time.Second).String() + " in"
	if done := s.Step - 1; done > 0 && s.Steps >= s.Step {
		left := s.RunElapsed / time.Duration(done) * time.Duration(s.Steps-done)
		part += ", ~" + left.Round(time.Second).String() + " left"
	}
	return part
}

func (s StepInfo) label() string {
	l := "c=" + fmtLevel(s.Level)
	if s.Mode == ModeRate {
		l = "rate=" + fmtLevel(s.Level) + "/s"
	}
	if s.Attempt > 0 {
		l += fmt.Sprintf(" (re-run %d)", s.Attempt)
	}
	return s.Target + " " + l
}

// Progress is told about a run as it goes. Calls come from several
// goroutines, never two at once for one run.
type Progress interface {
	Message(msg string)
	StepStart(s StepInfo)
	StepUpdate(s StepInfo, snap ProgressSnapshot)
	StepDone(s StepInfo, r *StepReport)
}

type nopProgress struct{}

func (nopProgress) Message(string)                        {}
func (nopProgress) StepStart(StepInfo)                    {}
func (nopProgress) StepUpdate(StepInfo, ProgressSnapshot) {}
func (nopProgress) StepDone(StepInfo, *StepReport)        {}

// NewLineProgress writes plain lines, one when a step starts and one when it
// ends: for logs and pipes.
func NewLineProgress(w io.Writer) Progress { return &lineProgress{w: w} }

type lineProgress struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *lineProgress) Message(msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintln(p.w, msg)
}

func (p *lineProgress) StepStart(s StepInfo) {
	p.mu.Lock()
	defer p.mu.Unlock()
	run := ""
	if r := s.runPart(); r != "" {
		run = " [" + r + "]"
	}
	fmt.Fprintf(p.w, "step %s: started, %s%s\n", s.label(), plannedWork(s), run)
}

func (p *lineProgress) StepUpdate(StepInfo, ProgressSnapshot) {}

func (p *lineProgress) StepDone(s StepInfo, r *StepReport) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "step %s: %s\n", s.label(), stepLine(r))
}

func plannedWork(s StepInfo) string {
	switch {
	case s.Requests > 0 && s.Duration > 0:
		return fmt.Sprintf("%d requests or %s", s.Requests, s.Duration)
	case s.Duration > 0:
		return s.Duration.String()
	}
	return fmt.Sprintf("%d requests", s.Requests)
}

func stepLine(r *StepReport) string {
	kv := "kv n/a"
	if r.KV != nil {
		kv = fmt.Sprintf("kv peak %.0f%%", 100*r.KV.PeakUsage)
	}
	line := fmt.Sprintf("%s — %d ok, %d failed, %d shed, %.2f req/s, p99 ttft %s, p99 e2e %s, %s",
		r.Verdict, r.Requests.OK, r.Requests.Failed(), r.Requests.Shed, r.RequestsPerS, fmtP99OrDash(r.TTFT), fmtP99OrDash(r.E2E), kv)
	if len(r.Reasons) > 0 {
		line += " (" + strings.Join(r.Reasons, "; ") + ")"
	}
	return line
}

// NewBarProgress redraws one status line per step on a terminal and leaves
// the step's result line behind when it ends.
func NewBarProgress(w io.Writer) Progress { return &barProgress{w: w} }

type barProgress struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *barProgress) Message(msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "\r\033[K%s\n", msg)
}

func (p *barProgress) StepStart(s StepInfo) {
	p.StepUpdate(s, ProgressSnapshot{Total: s.Requests, Duration: s.Duration})
}

func (p *barProgress) StepUpdate(s StepInfo, snap ProgressSnapshot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "\r\033[K%s", barLine(s, snap, 28))
}

func (p *barProgress) StepDone(s StepInfo, r *StepReport) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "\r\033[Kstep %s: %s\n", s.label(), stepLine(r))
}

// barLine is the live line: a bar of the counted work done, by requests or
// by time, whichever bounds the step (the nearer to its end when both do).
func barLine(s StepInfo, snap ProgressSnapshot, width int) string {
	frac := -1.0
	if snap.Total > 0 {
		frac = float64(snap.Done) / float64(snap.Total)
	}
	if snap.Duration > 0 {
		frac = max(frac, min(snap.Elapsed.Seconds()/snap.Duration.Seconds(), 1))
	}
	frac = min(max(frac, 0), 1)
	filled := int(frac*float64(width) + 0.5)
	bar := strings.Repeat("█", filled) + strings.Repeat("░", width-filled)
	kv := ""
	if snap.HasKV {
		kv = fmt.Sprintf("  kv %3.0f%%", 100*snap.KVUsage)
	}
	total := "?"
	if snap.Total > 0 {
		total = fmt.Sprint(snap.Total)
	}
	run := ""
	if r := s.runPart(); r != "" {
		run = "  [" + r + "]"
	}
	return fmt.Sprintf("%s %s %3.0f%%  %d/%s done  ok %d  fail %d  shed %d  in flight %d%s  %s%s",
		s.label(), bar, 100*frac, snap.Done, total, snap.OK, snap.Failed, snap.Shed, snap.InFlight, kv,
		snap.Elapsed.Truncate(100*time.Millisecond), run)
}
