package gateway

import "github.com/kvgate/kvgate/admission/fleet"

// fleetGPUs is rt's GPUs as the shared budget (package fleet) leases them:
// each by its name, the key of its budget in Redis, with its admission pool
// and its derived budget, min(configured, the backends' reported pool).
func (rt *runtime) fleetGPUs() []fleet.GPU {
	gpus := make([]fleet.GPU, 0, len(rt.groups))
	for _, g := range rt.groups {
		gpus = append(gpus, fleet.GPU{Name: g.name, Pool: g.pool, Nominal: g.nominal, Budget: g.capacity(rt.count)})
	}
	return gpus
}
