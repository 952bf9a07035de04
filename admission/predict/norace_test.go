//go:build !race

package predict_test

// raceEnabled: see race_test.go.
const raceEnabled = false
