package deploy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
)

const chartDir = "helm/kvgate"

// kvgateBin is the kvgate binary, built once for the tests that run it.
var kvgateBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvgate-deploy-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	kvgateBin = filepath.Join(dir, "kvgate")
	// Built in kvgate's own module (the parent directory), as users build it.
	build := exec.Command("go", "build", "-C", "..", "-o", kvgateBin, "./cmd/kvgate")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building kvgate:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// object is one rendered manifest, decoded into its API type.
type object struct {
	file       string
	kind, name string
	obj        any
}

// render renders the chart with Helm's engine (strict: a template that
// reads a value that does not exist fails) for the values in valuesFile
// ("" = the defaults) plus overrides.
func render(t *testing.T, valuesFile string, overrides map[string]any) (map[string]string, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	vals := map[string]any{}
	if valuesFile != "" {
		b, err := os.ReadFile(valuesFile)
		if err != nil {
			t.Fatal(err)
		}
		if vals, err = loader.LoadValues(bytes.NewReader(b)); err != nil {
			t.Fatalf("%s: %v", valuesFile, err)
		}
	}
	vals = loader.MergeMaps(vals, overrides)
	rv, err := util.ToRenderValues(ch, vals, common.ReleaseOptions{Name: "kvgate", Namespace: "inference", IsInstall: true}, nil)
	if err != nil {
		return nil, err
	}
	return engine.Engine{Strict: true}.Render(ch, rv)
}

// decode splits the rendered files into documents and decodes each strictly
// into its Kubernetes type: an unknown or duplicate field is an error.
func decode(t *testing.T, files map[string]string) []object {
	t.Helper()
	var names []string
	for f := range files {
		names = append(names, f)
	}
	sort.Strings(names)
	var out []object
	for _, f := range names {
		if strings.HasSuffix(f, "NOTES.txt") || strings.HasSuffix(f, ".tpl") {
			continue
		}
		for _, doc := range strings.Split(files[f], "\n---") {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			js, err := yaml.YAMLToJSON([]byte(doc))
			if err != nil {
				t.Fatalf("%s: not YAML: %v\n%s", f, err, doc)
			}
			var meta struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := json.Unmarshal(js, &meta); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			var obj any
			switch meta.APIVersion + " " + meta.Kind {
			case "apps/v1 Deployment":
				obj = &appsv1.Deployment{}
			case "v1 Service":
				obj = &corev1.Service{}
			case "v1 ConfigMap":
				obj = &corev1.ConfigMap{}
			case "v1 ServiceAccount":
				obj = &corev1.ServiceAccount{}
			case "v1 Pod":
				obj = &corev1.Pod{}
			case "policy/v1 PodDisruptionBudget":
				obj = &policyv1.PodDisruptionBudget{}
			case "monitoring.coreos.com/v1 ServiceMonitor":
				obj = &monitoringv1.ServiceMonitor{}
			default:
				t.Fatalf("%s: %s %s: no API type known to this test", f, meta.APIVersion, meta.Kind)
			}
			strict, err := sigsjson.UnmarshalStrict(js, obj, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
			if err != nil {
				t.Fatalf("%s: %s: %v", f, meta.Kind, err)
			}
			for _, e := range strict {
				t.Errorf("%s: %s %s: %v", f, meta.Kind, meta.Metadata.Name, e)
			}
			out = append(out, object{file: f, kind: meta.Kind, name: meta.Metadata.Name, obj: obj})
		}
	}
	return out
}

func find[T any](t *testing.T, objs []object, kind, name string) *T {
	t.Helper()
	for _, o := range objs {
		if o.kind == kind && o.name == name {
			return o.obj.(*T)
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return nil
}

func count(objs []object, kind string) int {
	n := 0
	for _, o := range objs {
		if o.kind == kind {
			n++
		}
	}
	return n
}

// checkConfig runs kvgate serve --check-config on the rendered kvgate.yaml
// with the environment the Deployment gives the container (Secret-backed
// variables get a stand-in value, as they would have one in the cluster).
func checkConfig(t *testing.T, cfg string, env []corev1.EnvVar) string {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "kvgate.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(cfgPath string) (string, error) {
		cmd := exec.Command(kvgateBin, "serve", "--check-config", "--config", cfgPath)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		for _, e := range env {
			v := e.Value
			if e.ValueFrom != nil {
				v = "stand-in-for-" + e.Name
			}
			cmd.Env = append(cmd.Env, e.Name+"="+v)
		}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run(path)
	if err != nil {
		t.Fatalf("kvgate serve --check-config refused the rendered config: %v\n%s\n%s", err, out, cfg)
	}
	return out
}

func TestChartLints(t *testing.T) {
	for _, vf := range valuesFiles(t) {
		vals := map[string]any{}
		if vf != "" {
			b, _ := os.ReadFile(vf)
			vals, _ = loader.LoadValues(bytes.NewReader(b))
		}
		res := lint.RunAll(chartDir, vals, "inference")
		for _, m := range res.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("helm lint (%s): %s", orDefault(vf), m)
			}
		}
	}
}

func orDefault(vf string) string {
	if vf == "" {
		return "default values"
	}
	return vf
}

// valuesFiles are the default values ("") and every file in the chart's ci/.
func valuesFiles(t *testing.T) []string {
	t.Helper()
	ci, err := filepath.Glob(filepath.Join(chartDir, "ci", "*.yaml"))
	if err != nil || len(ci) == 0 {
		t.Fatalf("no values files in %s/ci: %v", chartDir, err)
	}
	return append([]string{""}, ci...)
}

// For the default values and every ci/ values file: the chart renders,
// every object decodes strictly into its API type, the Deployment probes
// /healthz and /readyz on the port the config listens on, rolls on a config
// change, runs as non-root, and its config passes --check-config.
func TestChartRendersAndValidates(t *testing.T) {
	for _, vf := range valuesFiles(t) {
		t.Run(orDefault(vf), func(t *testing.T) {
			files, err := render(t, vf, nil)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			objs := decode(t, files)
			dep := find[appsv1.Deployment](t, objs, "Deployment", "kvgate")
			cm := find[corev1.ConfigMap](t, objs, "ConfigMap", "kvgate")
			svc := find[corev1.Service](t, objs, "Service", "kvgate")
			find[policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget", "kvgate")
			find[corev1.Pod](t, objs, "Pod", "kvgate-test-health")

			c := dep.Spec.Template.Spec.Containers[0]
			if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
				t.Errorf("liveness probe %+v: want GET /healthz", c.LivenessProbe)
			}
			if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
				t.Errorf("readiness probe %+v: want GET /readyz", c.ReadinessProbe)
			}
			if len(c.Ports) != 1 || c.Ports[0].Name != "http" || c.LivenessProbe.HTTPGet.Port.StrVal != "http" {
				t.Errorf("ports %+v, liveness port %v", c.Ports, c.LivenessProbe.HTTPGet.Port)
			}
			if svc.Spec.Ports[0].TargetPort.StrVal != "http" {
				t.Errorf("service targets %v", svc.Spec.Ports[0].TargetPort)
			}
			cfg := cm.Data["kvgate.yaml"]
			if !strings.Contains(cfg, fmt.Sprintf("listen: 0.0.0.0:%d\n", c.Ports[0].ContainerPort)) {
				t.Errorf("the config does not listen on the container port %d:\n%s", c.Ports[0].ContainerPort, cfg)
			}
			sum := sha256.Sum256([]byte(files["kvgate/templates/configmap.yaml"]))
			if got := dep.Spec.Template.Annotations["checksum/config"]; got != hex.EncodeToString(sum[:]) {
				t.Errorf("checksum/config %q is not the ConfigMap's sha256", got)
			}
			ps := dep.Spec.Template.Spec.SecurityContext
			if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || c.SecurityContext == nil || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
				t.Errorf("security context: pod %+v, container %+v", ps, c.SecurityContext)
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Errorf("resources %+v", c.Resources)
			}
			out := checkConfig(t, cfg, c.Env)
			if !strings.Contains(out, "is valid") {
				t.Errorf("check-config: %s", out)
			}
		})
	}
}

// The shared-budget values: three replicas, the chart's Redis behind the
// config's shared_budget, a ServiceMonitor that selects the gateway's
// Service.
func TestChartSharedBudget(t *testing.T) {
	files, err := render(t, filepath.Join(chartDir, "ci", "shared-budget-values.yaml"), nil)
	if err != nil {
		t.Fatal(err)
	}
	objs := decode(t, files)
	dep := find[appsv1.Deployment](t, objs, "Deployment", "kvgate")
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 3 {
		t.Errorf("replicas %v", dep.Spec.Replicas)
	}
	redis := find[appsv1.Deployment](t, objs, "Deployment", "kvgate-redis")
	if *redis.Spec.Replicas != 1 || redis.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("redis: %d replicas, strategy %s: want one at a time", *redis.Spec.Replicas, redis.Spec.Strategy.Type)
	}
	rsvc := find[corev1.Service](t, objs, "Service", "kvgate-redis")
	var cfg struct {
		SharedBudget struct {
			Redis    string `json:"redis"`
			Replicas int    `json:"replicas"`
		} `json:"shared_budget"`
	}
	cm := find[corev1.ConfigMap](t, objs, "ConfigMap", "kvgate")
	if err := yaml.Unmarshal([]byte(cm.Data["kvgate.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("redis://%s:%d/0", rsvc.Name, rsvc.Spec.Ports[0].Port); cfg.SharedBudget.Redis != want || cfg.SharedBudget.Replicas != 3 {
		t.Errorf("shared_budget %+v, want redis %s and 3 replicas", cfg.SharedBudget, want)
	}
	if !selects(rsvc.Spec.Selector, redis.Spec.Template.Labels) {
		t.Errorf("the Redis Service selects %v, the pods are %v", rsvc.Spec.Selector, redis.Spec.Template.Labels)
	}
	svc := find[corev1.Service](t, objs, "Service", "kvgate")
	if selects(svc.Spec.Selector, redis.Spec.Template.Labels) {
		t.Error("the gateway's Service would also send traffic to Redis")
	}
	sm := find[monitoringv1.ServiceMonitor](t, objs, "ServiceMonitor", "kvgate")
	if !selects(sm.Spec.Selector.MatchLabels, svc.Labels) || sm.Spec.Endpoints[0].Port != "http" || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor %+v does not scrape the gateway's Service (labels %v)", sm.Spec, svc.Labels)
	}
	if sm.Labels["release"] != "prometheus" {
		t.Errorf("ServiceMonitor labels %v", sm.Labels)
	}
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// Values that would overflow a GPU or break the config are refused at
// render time with a message saying why; a config change changes the
// checksum that rolls the pods.
func TestChartRefusesAndRolls(t *testing.T) {
	for _, tc := range []struct {
		name string
		vals map[string]any
		want string
	}{
		{"replicas without a shared budget", map[string]any{"replicaCount": 2}, "replicaCount 2 needs sharedBudget.enabled"},
		{"shared budget without Redis", map[string]any{"sharedBudget": map[string]any{"enabled": true}}, "needs a Redis"},
		{"listen in config", map[string]any{"config": map[string]any{"listen": "0.0.0.0:1"}}, "config.listen is set from containerPort"},
		{"drain_delay in config", map[string]any{"config": map[string]any{"server": map[string]any{"drain_delay": "1s"}}}, "config.server.drain_delay is rendered from drainDelaySeconds"},
		{"grace shorter than the shutdown", map[string]any{"shutdownTimeoutSeconds": 60}, "terminationGracePeriodSeconds 45 is too short"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := render(t, "", tc.vals)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render: %v, want %q", err, tc.want)
			}
		})
	}
	checksum := func(vals map[string]any) string {
		files, err := render(t, "", vals)
		if err != nil {
			t.Fatal(err)
		}
		return find[appsv1.Deployment](t, decode(t, files), "Deployment", "kvgate").Spec.Template.Annotations["checksum/config"]
	}
	a := checksum(nil)
	b := checksum(map[string]any{"config": map[string]any{"admission": map[string]any{"ceiling": 0.7}}})
	if a == "" || a == b {
		t.Errorf("checksum %q before and %q after a config change", a, b)
	}
	if c := checksum(map[string]any{"resources": map[string]any{"requests": map[string]any{"cpu": "1"}}}); c != a {
		t.Errorf("a change outside the config changed the checksum")
	}
}

// Toggles render only what they enable.
func TestChartToggles(t *testing.T) {
	files, err := render(t, "", map[string]any{
		"serviceAccount":      map[string]any{"create": false},
		"podDisruptionBudget": map[string]any{"enabled": false},
	})
	if err != nil {
		t.Fatal(err)
	}
	objs := decode(t, files)
	for _, kind := range []string{"ServiceAccount", "PodDisruptionBudget", "ServiceMonitor"} {
		if n := count(objs, kind); n != 0 {
			t.Errorf("%d %s rendered while disabled", n, kind)
		}
	}
	if n := count(objs, "Deployment"); n != 1 {
		t.Errorf("%d Deployments without Redis, want 1", n)
	}
	if dep := find[appsv1.Deployment](t, objs, "Deployment", "kvgate"); dep.Spec.Template.Spec.ServiceAccountName != "default" {
		t.Errorf("service account %q", dep.Spec.Template.Spec.ServiceAccountName)
	}
}

// The pod's shutdown timings agree: the config's drain_delay and
// shutdown_timeout are the values', the preStop sleep is rendered when
// asked for, and terminationGracePeriodSeconds outlasts preStop +
// drain_delay + shutdown_timeout, so the kubelet never kills a pod whose
// streams are still finishing.
func TestChartShutdownTimings(t *testing.T) {
	for _, tc := range []struct {
		name                        string
		vals                        map[string]any
		preStop, drain, stop, grace int64
		serverKept                  string // another server key that must survive the rendering
	}{
		{"defaults", nil, 0, 5, 30, 45, ""},
		{"a preStop sleep", map[string]any{"preStopSleepSeconds": 5, "terminationGracePeriodSeconds": 50}, 5, 5, 30, 50, ""},
		{"long streams", map[string]any{"shutdownTimeoutSeconds": 600, "drainDelaySeconds": 10, "terminationGracePeriodSeconds": 620,
			"config": map[string]any{"server": map[string]any{"request_timeout": "10m"}}}, 0, 10, 600, 620, "request_timeout: 10m"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files, err := render(t, "", tc.vals)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			objs := decode(t, files)
			spec := find[appsv1.Deployment](t, objs, "Deployment", "kvgate").Spec.Template.Spec
			cfg := find[corev1.ConfigMap](t, objs, "ConfigMap", "kvgate").Data["kvgate.yaml"]
			var parsed struct {
				Server map[string]string `json:"server"`
			}
			if err := yaml.Unmarshal([]byte(cfg), &parsed); err != nil {
				t.Fatal(err)
			}
			if got, want := parsed.Server["drain_delay"], fmt.Sprintf("%ds", tc.drain); got != want {
				t.Errorf("server.drain_delay %q, want %q", got, want)
			}
			if got, want := parsed.Server["shutdown_timeout"], fmt.Sprintf("%ds", tc.stop); got != want {
				t.Errorf("server.shutdown_timeout %q, want %q", got, want)
			}
			if tc.serverKept != "" && !strings.Contains(cfg, tc.serverKept) {
				t.Errorf("the config lost %q:\n%s", tc.serverKept, cfg)
			}
			c := spec.Containers[0]
			var preStop int64
			if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
				if c.Lifecycle.PreStop.Sleep == nil {
					t.Fatalf("preStop %+v is not a sleep", c.Lifecycle.PreStop)
				}
				preStop = c.Lifecycle.PreStop.Sleep.Seconds
			}
			if preStop != tc.preStop {
				t.Errorf("preStop sleep %ds, want %ds", preStop, tc.preStop)
			}
			grace := spec.TerminationGracePeriodSeconds
			if grace == nil || *grace != tc.grace || *grace < preStop+tc.drain+tc.stop+5 {
				t.Errorf("terminationGracePeriodSeconds %v: want %d, and at least preStop %d + drain_delay %d + shutdown_timeout %d + 5",
					grace, tc.grace, preStop, tc.drain, tc.stop)
			}
			if out := checkConfig(t, cfg, c.Env); !strings.Contains(out, "is valid") {
				t.Errorf("check-config: %s", out)
			}
		})
	}
}
