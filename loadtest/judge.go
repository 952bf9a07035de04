package loadtest

import (
	"fmt"
	"strings"
	"time"
)

// criteria are what a safe step must show.
type criteria struct {
	ceiling     float64 // peak KV usage must not exceed it
	slo         sloLimits
	minRequests int // judged requests below this are too few to say
	timeout     time.Duration
}

// judge fills s's verdict. A step is safe when none of its requests (warm-up
// included: it is not measured, but its failures count) overflowed, failed on the server, timed out, was refused by the client side
// of the API (4xx) or lost its connection; when the server preempted none
// (where it reports preemptions); when its peak KV usage stayed at or
// under the ceiling; when it was not over-saturated or cut; and, with SLOs,
// when the share of requests that met every SLO is proven at or above the
// target by its Wilson interval. Shed requests (429) are not failures.
//
// A step with no failure but too little evidence — fewer than minRequests
// judged requests, or an attainment interval straddling the target — is
// inconclusive, and the plan runs it again.
func judge(s *StepReport, c criteria) {
	var fail, unsure []string
	n := s.Requests
	if n.Overflow > 0 {
		fail = append(fail, fmt.Sprintf("overflow: %d requests failed with out of memory", n.Overflow))
	}
	if n.WarmupOverflow > 0 {
		fail = append(fail, fmt.Sprintf("overflow: %d warm-up requests failed with out of memory", n.WarmupOverflow))
	}
	if n.WarmupFailed > 0 {
		fail = append(fail, fmt.Sprintf("%d warm-up requests failed", n.WarmupFailed))
	}
	if s.KV != nil && s.KV.OOMEvents > 0 && n.Overflow+n.WarmupOverflow == 0 {
		fail = append(fail, fmt.Sprintf("overflow: the server reported %.0f out-of-memory events", s.KV.OOMEvents))
	}
	if n.Server5xx > 0 {
		fail = append(fail, fmt.Sprintf("%d server errors (5xx)", n.Server5xx))
	}
	if n.Timeout > 0 {
		fail = append(fail, fmt.Sprintf("%d requests timed out (over %s)", n.Timeout, c.timeout))
	}
	if n.ConnError > 0 {
		fail = append(fail, fmt.Sprintf("%d connection errors", n.ConnError))
	}
	if n.Client4xx > 0 {
		fail = append(fail, fmt.Sprintf("%d client errors (4xx other than 429)", n.Client4xx))
	}
	if s.KV != nil && s.KV.Preemptions > 0 {
		// vLLM preempts when its KV pool is full: the step went past what
		// the GPU holds, whatever the SLO says of the requests' latency.
		fail = append(fail, fmt.Sprintf("preemption: the server preempted %.0f sequences (its KV cache was full)", s.KV.Preemptions))
	}
	if s.KV != nil && s.KV.PeakUsage > c.ceiling {
		fail = append(fail, fmt.Sprintf("peak KV usage %.1f%% above the limit %.0f%%", 100*s.KV.PeakUsage, 100*c.ceiling))
	}
	switch s.StoppedEarly {
	case "":
	case stopSaturated:
		why := "over-saturated"
		if s.Saturation != nil && s.Saturation.Why != "" {
			why = s.Saturation.Why
		}
		fail = append(fail, why)
	case stopMaxStepTime:
		fail = append(fail, "cut at the maximum step time with requests still in flight")
	default:
		fail = append(fail, "stopped early: "+s.StoppedEarly)
	}
	if n.Dropped > 0 {
		s.Notes = append(s.Notes, fmt.Sprintf("%d arrivals dropped at the client's in-flight limit", n.Dropped))
	}
	judged := n.OK + n.Failed()
	if n.OK == 0 && n.Sent > 0 && len(fail) == 0 {
		fail = append(fail, "no request was served")
	}
	if s.SLO != nil {
		switch s.SLO.Verdict {
		case "fail":
			fail = append(fail, fmt.Sprintf("SLO attainment %.1f%% (interval %.1f–%.1f%%) below the target %.1f%%",
				100*s.SLO.Attainment, 100*s.SLO.Low, 100*s.SLO.High, 100*s.SLO.Target))
		case "inconclusive":
			unsure = append(unsure, fmt.Sprintf("SLO attainment %.1f%% over %d requests: interval %.1f–%.1f%% straddles the target %.1f%%",
				100*s.SLO.Attainment, s.SLO.Judged, 100*s.SLO.Low, 100*s.SLO.High, 100*s.SLO.Target))
		}
	}
	if judged < c.minRequests {
		unsure = append(unsure, fmt.Sprintf("only %d requests completed; at least %d are needed to judge", judged, c.minRequests))
	}
	switch {
	case len(fail) > 0:
		s.Verdict, s.Safe, s.Reasons = Fail.String(), false, fail
	case len(unsure) > 0:
		s.Verdict, s.Safe, s.Reasons = Inconclusive.String(), false, unsure
	default:
		s.Verdict, s.Safe, s.Reasons = Pass.String(), true, []string{}
	}
}

// verdictOf maps a judged step to the plan's verdict.
func verdictOf(s *StepReport) Judgement {
	switch s.Verdict {
	case Pass.String():
		return Judgement{Verdict: Pass}
	case Inconclusive.String():
		return Judgement{Verdict: Inconclusive, Reason: joinReasons(s.Reasons)}
	}
	return Judgement{Verdict: Fail, Reason: joinReasons(s.Reasons)}
}

func joinReasons(rs []string) string { return strings.Join(rs, "; ") }
