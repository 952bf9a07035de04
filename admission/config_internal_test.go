package admission

import (
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/confval"
)

// A class's limit that is zero takes ClassDefaults', and a zero there the
// package's default; sheddable follows the class's name unless set.
func TestClassLimitsResolve(t *testing.T) {
	no := false
	tests := []struct {
		name     string
		class    ClassConfig
		defaults ClassLimits
		want     classSpec
	}{
		{"package defaults", ClassConfig{Name: "a"}, ClassLimits{},
			classSpec{name: "a", maxQueued: DefaultMaxQueued, timeout: DefaultQueueTimeout}},
		{"class defaults", ClassConfig{Name: "a"},
			ClassLimits{MaxQueued: -1, MaxQueuedBytes: confval.Size{Bytes: 64}, QueueTimeout: confval.Duration{D: time.Second}},
			classSpec{name: "a", maxQueued: -1, maxQueuedBytes: 64, timeout: time.Second}},
		{"the class's own", ClassConfig{Name: "a", ClassLimits: ClassLimits{MaxQueued: 3, MaxQueuedBytes: confval.Size{Bytes: -1}, QueueTimeout: confval.Duration{D: -1}}},
			ClassLimits{MaxQueued: -1, MaxQueuedBytes: confval.Size{Bytes: 64}, QueueTimeout: confval.Duration{D: time.Second}},
			classSpec{name: "a", maxQueued: 3, maxQueuedBytes: -1, timeout: -1}},
		{"sheddable by name", ClassConfig{Name: "sheddable"}, ClassLimits{},
			classSpec{name: "sheddable", maxQueued: DefaultMaxQueued, timeout: DefaultQueueTimeout, sheddable: true}},
		{"sheddable said otherwise", ClassConfig{Name: "sheddable", Sheddable: &no}, ClassLimits{},
			classSpec{name: "sheddable", maxQueued: DefaultMaxQueued, timeout: DefaultQueueTimeout}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := resolve(Config{GPUs: []GPUConfig{{Name: "g", Capacity: 1}}, Queues: []QueueConfig{{GPUs: []string{"g"}}},
				Classes: []ClassConfig{tt.class}, ClassDefaults: tt.defaults})
			if err != nil {
				t.Fatal(err)
			}
			if s.classes[0] != tt.want {
				t.Fatalf("resolved %+v, want %+v", s.classes[0], tt.want)
			}
		})
	}
}

func TestBackfillResolve(t *testing.T) {
	on, off := true, false
	tests := []struct {
		name    string
		cfg     BackfillConfig
		enabled bool
		maxAge  time.Duration
	}{
		{"defaults", BackfillConfig{}, true, DefaultMaxHeadAge},
		{"on", BackfillConfig{Enabled: &on, MaxHeadAge: confval.Duration{D: time.Second}}, true, time.Second},
		{"off", BackfillConfig{Enabled: &off}, false, DefaultMaxHeadAge},
		{"no age limit", BackfillConfig{MaxHeadAge: confval.Duration{D: -1}}, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := resolve(Config{GPUs: []GPUConfig{{Name: "g", Capacity: 1}}, Queues: []QueueConfig{{GPUs: []string{"g"}}}, Backfill: tt.cfg})
			if err != nil {
				t.Fatal(err)
			}
			if s.backfill != tt.enabled || s.maxHeadAge != tt.maxAge || tt.cfg.IsEnabled() != tt.enabled {
				t.Fatalf("backfill %v, max head age %v; want %v, %v", s.backfill, s.maxHeadAge, tt.enabled, tt.maxAge)
			}
		})
	}
}

func TestDefaultClass(t *testing.T) {
	tests := []struct {
		classes []string
		want    string
	}{
		{nil, "standard"},
		{[]string{"a", "b", "standard"}, "standard"},
		{[]string{"a", "b", "c"}, "b"},
		{[]string{"a", "b"}, "b"},
		{[]string{"a"}, "a"},
	}
	for _, tt := range tests {
		var classes []ClassConfig
		for _, n := range tt.classes {
			classes = append(classes, ClassConfig{Name: n})
		}
		if got := DefaultClass(classes); got != tt.want {
			t.Errorf("DefaultClass(%v) = %q, want %q", tt.classes, got, tt.want)
		}
	}
}
