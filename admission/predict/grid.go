package predict

// The forecast grid: step offsets t_0 = 0 < t_1 < … < t_{GridLen−1} =
// MaxSteps at which a curve is evaluated. Every step below gridFine is on
// it; above, each octave has gridPerOctave evenly spaced points, so
// consecutive points differ by a factor of 1.07 to 1.125. One grid for every
// model and every budget: curves of different items and models add up index
// by index.
const (
	gridFine      = 16
	gridPerOctave = 8
	// MaxSteps is the last grid point, 2^20 steps (tokens per sequence). The
	// last interval runs from it to infinity, so longer caps still work; they
	// only see a coarse curve past it.
	MaxSteps = 1 << 20
	// GridLen is the number of grid points: the length of the mean and
	// variance slices handed to AddTo, SubFrom and Bound.
	GridLen = gridFine + (20-4)*gridPerOctave + 1
)

// grid is computed once and never written.
var grid = makeGrid()

func makeGrid() [GridLen]int {
	var g [GridLen]int
	k := 0
	for t := range gridFine {
		g[k] = t
		k++
	}
	for e := 4; e < 20; e++ { // 2^4 = gridFine, up to 2^20 = MaxSteps
		for i := range gridPerOctave {
			g[k] = (gridPerOctave + i) << (e - 3)
			k++
		}
	}
	g[k] = MaxSteps
	return g
}

// Steps returns (a copy of) the grid of future step offsets the curve is
// evaluated at: 0 first, every step up to 15, then 8 points per octave
// (16, 18, …, 30, 32, 36, …) up to MaxSteps. Index k of a curve covers the
// steps [Steps()[k], Steps()[k+1]) — the last index everything from MaxSteps
// on.
func Steps() []int {
	s := make([]int, GridLen)
	copy(s, grid[:])
	return s
}
