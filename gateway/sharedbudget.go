package gateway

import "github.com/kvgate/kvgate/admission/sharedbudget"

// sharedGPUs is rt's GPUs as the shared budget (package sharedbudget) leases them:
// each by its name, the key of its budget in Redis, with its id in the
// scheduler and its derived budget, min(configured, the backends' reported pool).
func (rt *runtime) sharedGPUs() []sharedbudget.GPU {
	gpus := make([]sharedbudget.GPU, 0, len(rt.gpus))
	for _, g := range rt.gpus {
		gpus = append(gpus, sharedbudget.GPU{Name: g.name, ID: g.id, Nominal: g.nominal, Budget: g.capacity(rt.count)})
	}
	return gpus
}
