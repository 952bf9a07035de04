package sim

// How a stream's tokens are cut into SSE events. vLLM sends one token an
// event only when its API server keeps up: --stream-interval N sends every
// N tokens, and a server that lags its engine merges the deltas it has
// not sent yet. Config.StreamInterval and Config.StreamMerge simulate
// both, so that what sits in front of the server can be tried against
// streams whose events are not tokens.

// saltMerge keeps the merge draws apart from the text and length draws.
const saltMerge uint64 = 0x6d657267 // "merg"

// eventTokens is how many tokens the event that starts at token t of the
// sequence with key k carries, if the sequence runs on.
func (s *settings) eventTokens(k uint64, t int) int {
	if s.api.streamMerge > 0 {
		return 1 + int(mix(k^saltMerge^uint64(t)*0x9e3779b97f4a7c15)%uint64(s.api.streamMerge))
	}
	return s.api.streamInterval
}

// nextEvent is the end of the event that starts at token sent of the
// sequence with key k, given pub tokens published so far: 0 when the
// event must wait for more tokens. ended says the sequence generates no
// more (finished, or its request failed): what is left goes out.
func (s *settings) nextEvent(k uint64, sent, pub int, ended bool) int {
	if sent >= pub {
		return 0
	}
	end := sent + s.eventTokens(k, sent)
	if end > pub {
		if !ended {
			return 0
		}
		end = pub
	}
	return end
}
