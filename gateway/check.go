package gateway

import (
	"sort"
)

// CheckReport is what a configuration turns into, for an operator about to
// start or reload with it: every budget and what shares it.
type CheckReport struct {
	Listen string       `json:"listen"`
	Models []string     `json:"models"`
	GPUs   []CheckedGPU `json:"gpus"`
	// Classes in priority order, highest first.
	Classes []string `json:"classes"`
	Tenants []string `json:"tenants"`
}

// CheckedGPU is one budget of a checked configuration.
type CheckedGPU struct {
	Name        string   `json:"name"`
	Backends    []string `json:"backends"`
	BudgetBytes int64    `json:"budget_bytes"`
	// MaxConcurrency is the request limit in admission mode count (where
	// there is no byte budget).
	MaxConcurrency int64 `json:"max_concurrency,omitempty"`
}

// Check builds everything cfg describes — models and their geometry, every
// GPU's budget (reading NVML where gpu_memory says nvml), admission classes
// and tenants, backends — exactly as New and Reload do, and reports it. It
// serves nothing, starts no probe and sends nothing to a backend, so it can
// vet a file before a start or a SIGHUP; the error names the bad field.
func Check(cfg *Config, opt Options) (*CheckReport, error) {
	// With no scheduler, buildRuntime validates the admission config and
	// leaves creating one to its commit, which Check never calls.
	rt, _, err := buildRuntime(cfg, nil, &opt, nil)
	if err != nil {
		return nil, err
	}
	r := &CheckReport{Listen: cfg.Listen, Models: rt.modelOrder, Classes: []string{}, Tenants: []string{}}
	for _, c := range cfg.Admission.Classes {
		r.Classes = append(r.Classes, c.Name)
	}
	for _, t := range cfg.Tenants {
		r.Tenants = append(r.Tenants, t.Name)
	}
	for name, g := range rt.gpus {
		cg := CheckedGPU{Name: name, BudgetBytes: g.nominal}
		if rt.count {
			cg.BudgetBytes, cg.MaxConcurrency = 0, g.nominal
		}
		for _, be := range g.backends {
			cg.Backends = append(cg.Backends, be.Name())
		}
		r.GPUs = append(r.GPUs, cg)
	}
	sort.Slice(r.GPUs, func(i, j int) bool { return r.GPUs[i].Name < r.GPUs[j].Name })
	return r, nil
}

// ReloadFrom reloads with the configuration load returns. A load that fails
// (a file that does not parse, a field out of range) is a failed reload as
// much as one Reload refuses: it is counted and logged the same way, and the
// running configuration stays.
func (s *Server) ReloadFrom(load func() (*Config, error)) error {
	cfg, err := load()
	if err != nil {
		s.m.reloaded(false, s.now())
		return err
	}
	return s.Reload(cfg)
}
