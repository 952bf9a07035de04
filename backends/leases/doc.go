// Package leases shares one GPU's KV budget among gateway replicas.
package leases
