// Package metricdoc holds kvgate's metric documentation to what the
// programs really export. It reads the tables of docs/METRICS.md (name,
// type, labels, meaning), scrapes a /metrics page, and reports every
// difference between the two, and every break of the naming rules a
// dashboard relies on (Lint): counters and only counters end in _total, no
// colons outside names kept for compatibility (vLLM's), state as 0/1 series
// with exactly one 1, and promlint's checks of units and case.
//
// It is used by tests only: the gateway's and the simulator's compare
// their /metrics with their table, and the deploy module's check that the
// dashboard and the alert rules name only series that exist.
package metricdoc
