package loadtest

import (
	"slices"
	"strings"
	"testing"
)

func TestParseConcurrency(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []int
		wantErr string
	}{
		{in: "1,2,4", want: []int{1, 2, 4}},
		{in: "8, 1 ,4,4", want: []int{1, 4, 8}},
		{in: "1..256x2", want: []int{1, 2, 4, 8, 16, 32, 64, 128, 256}},
		{in: "1..100x2", want: []int{1, 2, 4, 8, 16, 32, 64}},
		{in: "1..10x1.5", want: []int{1, 2, 3, 5, 8}}, // 1.5→2, 3, 4.5→5, 7.5→8
		{in: "8..32+8", want: []int{8, 16, 24, 32}},
		{in: "1..4", want: []int{1, 2, 3, 4}},
		{in: "1,2,4..16x2,24", want: []int{1, 2, 4, 8, 16, 24}},
		{in: "", wantErr: "empty list"},
		{in: "1,,2", wantErr: "empty item"},
		{in: "0", wantErr: "must be positive"},
		{in: "1.5", wantErr: "not a whole number"},
		{in: "x", wantErr: "not a number"},
		{in: "16..1x2", wantErr: "start 16 is above end 1"},
		{in: "1..8x1", wantErr: "xFACTOR must be greater than 1"},
		{in: "1..8+0", wantErr: "+STEP must be a positive whole number"},
		{in: "1..8+1.5", wantErr: "+STEP must be a positive whole number"},
		{in: "1..9999999", wantErr: "above the maximum"},
		{in: "1..5000", wantErr: "more than 1000 levels"},
	} {
		got, err := ParseConcurrency(tc.in)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseConcurrency(%q) error = %v, want %q", tc.in, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("ParseConcurrency(%q): %v", tc.in, err)
		case !slices.Equal(got, tc.want):
			t.Errorf("ParseConcurrency(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestParseRates(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []float64
		wantErr string
	}{
		{in: "1,2,5,10", want: []float64{1, 2, 5, 10}},
		{in: "0.5..8x2", want: []float64{0.5, 1, 2, 4, 8}},
		{in: "0.1..0.5+0.1", want: []float64{0.1, 0.2, 0.3, 0.4, 0.5}},
		{in: "2.5", want: []float64{2.5}},
		{in: "0", wantErr: "must be positive"},
		{in: "0.0001", wantErr: "below the minimum"},
		{in: "-1", wantErr: "must be positive"},
		{in: "inf", wantErr: "not a number"},
	} {
		got, err := ParseRates(tc.in)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseRates(%q) error = %v, want %q", tc.in, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("ParseRates(%q): %v", tc.in, err)
		case !slices.Equal(got, tc.want):
			t.Errorf("ParseRates(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
