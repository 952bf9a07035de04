package sim

import (
	"errors"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/kvbudget"
)

func TestConfigDefaults(t *testing.T) {
	s := testSettings(t, Config{})
	// Llama-3-8B on 24 GiB at 0.9 with 1 GiB reserve, as kvbudget computes:
	// 23,192,823,398 − 16,060,522,496 − 1,073,741,824 bytes at 2 MiB a block.
	if s.numBlocks != 2888 || s.watermark != 28 || s.blockSize != 16 || s.weights != 16060522496 || s.kvBytes != 6058559078 {
		t.Fatalf("pool %d blocks (watermark %d, block %d, weights %d, kv %d)", s.numBlocks, s.watermark, s.blockSize, s.weights, s.kvBytes)
	}
	if s.model != "llama-3-8b" || s.maxModelLen != 8192 || s.maxNumSeqs != 256 || s.oom || s.pace.timeScale != 0 {
		t.Fatalf("defaults %+v", s)
	}
	if s.pace.stepBase != DefaultStepBase || s.pace.stepPerSeq != DefaultStepPerSeq || s.pace.prefillPer != DefaultPrefillPerToken || s.pace.oomRestart != DefaultOOMRestart {
		t.Fatal("timing defaults not applied")
	}
	if d := DefaultConfig(); d.TimeScale != 1 {
		t.Fatalf("DefaultConfig().TimeScale = %g, want real time", d.TimeScale)
	}
	// Negative durations and reserve mean none.
	s = testSettings(t, Config{StepBase: -1, StepPerSeq: -1, PrefillPerToken: -1, OOMRestart: -1, Reserve: -1})
	if s.pace.stepBase != 0 || s.pace.stepPerSeq != 0 || s.pace.prefillPer != 0 || s.pace.oomRestart != 0 || s.reserve != 0 {
		t.Fatal("negative values did not mean none")
	}
}

func TestConfigMaxModelLenFollowsTheModel(t *testing.T) {
	data, err := os.ReadFile("../../kvbudget/testdata/gpt2.json")
	if err != nil {
		t.Fatal(err)
	}
	m, err := kvbudget.ParseModelConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	if s := testSettings(t, Config{Geometry: m}); s.maxModelLen != 1024 {
		t.Fatalf("GPT-2's default max_model_len = %d, want its 1024 positions", s.maxModelLen)
	}
	if _, err := (Config{Geometry: m, MaxModelLen: 2048}).resolve(); err == nil || !strings.Contains(err.Error(), "max_position_embeddings 1024") {
		t.Fatalf("max_model_len beyond the positions: %v", err)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	tests := []struct {
		c     Config
		field string
		want  string
	}{
		{Config{GPUMemory: -1}, "GPUMemory", "> 0"},
		{Config{GPUMemory: 10 << 30}, "GPUMemory", "weights do not fit"},
		{Config{GPUMemoryUtilization: 1.01}, "GPUMemoryUtilization", "(0, 1]"},
		{Config{GPUMemoryUtilization: math.NaN()}, "GPUMemoryUtilization", "(0, 1]"},
		{Config{WeightsBytes: -5}, "WeightsBytes", ">= 0"},
		{Config{BlockSize: -16}, "BlockSize", ">= 1"},
		{Config{MaxModelLen: 1}, "MaxModelLen", ">= 2"},
		{Config{GPUMemory: 18 << 30}, "MaxModelLen", "needs 512 KV blocks, but the cache holds 124"},
		{Config{MaxNumSeqs: -1}, "MaxNumSeqs", ">= 1"},
		{Config{OnOverflow: "swap"}, "OnOverflow", `"swap"`},
		{Config{TimeScale: -0.5}, "TimeScale", "[0, 1e6]"},
		{Config{TimeScale: math.Inf(1)}, "TimeScale", "[0, 1e6]"},
		{Config{OutputLen: "fixed:x"}, "OutputLen", "invalid length distribution"},
		{Config{OutputLenWhen: []string{"essay"}}, "OutputLenWhen", "is not TEXT=DIST"},
		{Config{OutputLenWhen: []string{"=fixed:3"}}, "OutputLenWhen", "is not TEXT=DIST"},
		{Config{OutputLenWhen: []string{"essay=fixed:x"}}, "OutputLenWhen", "invalid length distribution"},
	}
	for _, tc := range tests {
		_, err := New(tc.c)
		ce, ok := errors.AsType[*ConfigError](err)
		if !ok || ce.Field != tc.field || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v; want a ConfigError on %s containing %q", tc.c, err, tc.field, tc.want)
		}
	}
	if _, err := New(Config{GPUMemory: 10 << 30}); !errors.Is(err, kvbudget.ErrWeightsDoNotFit) {
		t.Errorf("weights that do not fit: %v does not wrap kvbudget.ErrWeightsDoNotFit", err)
	}
}

func TestServerWithoutServe(t *testing.T) {
	// New starts the engine; Shutdown must stop it even if Serve never ran.
	s, err := New(Config{TimeScale: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(t.Context()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown hangs without Serve")
	}
}
