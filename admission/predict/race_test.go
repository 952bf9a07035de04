//go:build race

package predict_test

// raceEnabled lets the statistical tests, which run on one goroutine and so
// gain nothing from the race detector, draw fewer batches under its 10–20×
// slowdown.
const raceEnabled = true
