// Package deploy checks kvgate's deployment artifacts: the Helm chart
// (deploy/helm/kvgate), the Grafana dashboard (deploy/grafana) and the
// Prometheus alert rules (deploy/prometheus). It is a module of its own so
// that Helm, the Kubernetes API types and Prometheus's rule parser stay out
// of kvgate's own build; it has no code beyond its tests.
//
// What the tests hold: the chart renders with Helm's own engine for its
// default values and for every file in helm/kvgate/ci; every rendered
// object decodes strictly (unknown fields fail) into its Kubernetes API
// type; the kvgate configuration it renders passes kvgate serve
// --check-config with the environment the Deployment gives it. The alert
// rules pass Prometheus's rule parser, and every metric name the rules and
// the dashboard's queries use is served on /metrics by a gateway and a
// vLLM-named backend under load.
package deploy
