// Package helm holds Ferry's Helm chart (ferry/) and its test, which
// renders it with Helm's Go SDK and decodes every document strictly into
// the Kubernetes API types.
package helm

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// serviceMonitor is the part of the Prometheus Operator's ServiceMonitor
// the chart writes (its Go types are not in k8s.io/api): decoded strictly
// like the others, so a field the operator does not have fails.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// rendered is a chart's output, decoded.
type rendered struct {
	deployment *appsv1.Deployment
	configMap  *corev1.ConfigMap
	secrets    []*corev1.Secret
	services   []*corev1.Service
	pdb        *policyv1.PodDisruptionBudget
	monitor    *serviceMonitor
	// config is the ConfigMap's ferry.yaml.
	config map[string]any
}

// render renders the chart with vals over its defaults, as `helm
// template orders ./ferry -n apps` does, and decodes every document
// strictly (an unknown field, a duplicate key or a wrong type fails).
func render(t *testing.T, vals map[string]any) (*rendered, error) {
	t.Helper()
	ch, err := loader.Load("ferry")
	require.NoError(t, err)
	top, err := util.ToRenderValues(ch, vals, common.ReleaseOptions{Name: "orders", Namespace: "apps", IsInstall: true}, nil)
	require.NoError(t, err)
	files, err := engine.Render(ch, top)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	r := &rendered{}
	for _, name := range names {
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		for i, doc := range strings.Split(files[name], "\n---\n") {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			var tm metav1.TypeMeta
			require.NoError(t, yaml.Unmarshal([]byte(doc), &tm), "%s #%d", name, i)
			var obj any
			switch tm.APIVersion + " " + tm.Kind {
			case "apps/v1 Deployment":
				require.Nil(t, r.deployment, "one Deployment")
				r.deployment = &appsv1.Deployment{}
				obj = r.deployment
			case "v1 ConfigMap":
				r.configMap = &corev1.ConfigMap{}
				obj = r.configMap
			case "v1 Secret":
				s := &corev1.Secret{}
				r.secrets = append(r.secrets, s)
				obj = s
			case "v1 Service":
				s := &corev1.Service{}
				r.services = append(r.services, s)
				obj = s
			case "policy/v1 PodDisruptionBudget":
				r.pdb = &policyv1.PodDisruptionBudget{}
				obj = r.pdb
			case "monitoring.coreos.com/v1 ServiceMonitor":
				r.monitor = &serviceMonitor{}
				obj = r.monitor
			default:
				t.Fatalf("%s #%d: unexpected %s %s", name, i, tm.APIVersion, tm.Kind)
			}
			require.NoError(t, yaml.UnmarshalStrict([]byte(doc), obj), "%s #%d decodes strictly:\n%s", name, i, doc)
		}
	}
	require.NotNil(t, r.deployment)
	require.NotNil(t, r.configMap)
	require.NoError(t, yaml.UnmarshalStrict([]byte(r.configMap.Data["ferry.yaml"]), &r.config), "ferry.yaml:\n%s", r.configMap.Data["ferry.yaml"])
	return r, nil
}

func stripComments(doc string) string {
	var out []string
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// keys returns the key paths of a decoded YAML mapping ("relay.lease_ttl").
func keys(m map[string]any, prefix string) []string {
	var out []string
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok {
			out = append(out, keys(sub, prefix+k+".")...)
			continue
		}
		out = append(out, prefix+k)
	}
	sort.Strings(out)
	return out
}

func section(t *testing.T, m map[string]any, path string) any {
	t.Helper()
	var v any = m
	for _, p := range strings.Split(path, ".") {
		mm, ok := v.(map[string]any)
		require.True(t, ok, "%s: %v", path, m)
		v = mm[p]
	}
	return v
}

func env(c *corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// checkCommon asserts what every rendering must hold: the config is
// ferry.yaml as `ferry run` reads it, the database URL comes from a
// Secret, the probes, the grace period, the security context.
func checkCommon(t *testing.T, r *rendered) {
	t.Helper()
	// Every key of ferry.yaml is one `ferry run` knows: its documented
	// example has them all (ferry refuses unknown keys).
	raw, err := os.ReadFile(filepath.Join("..", "..", "cmd", "ferry", "ferry.example.yaml"))
	require.NoError(t, err)
	var example map[string]any
	require.NoError(t, yaml.Unmarshal(raw, &example))
	known := keys(example, "")
	for _, k := range keys(r.config, "") {
		require.Contains(t, known, k, "ferry.yaml key %s is not one ferry run knows", k)
	}
	_, hasURL := section(t, r.config, "database").(map[string]any)["url"]
	require.False(t, hasURL, "the database URL is not in the ConfigMap")

	d := r.deployment
	pod := d.Spec.Template.Spec
	require.Len(t, pod.Containers, 1)
	c := &pod.Containers[0]
	require.Equal(t, []string{"run", "--config", "/etc/ferry/ferry.yaml"}, c.Args)
	mounted := false
	for _, m := range c.VolumeMounts {
		if m.MountPath == "/etc/ferry" && m.Name == "config" {
			mounted = true
		}
	}
	require.True(t, mounted, "the ConfigMap is mounted at /etc/ferry")
	cmName := ""
	for _, v := range pod.Volumes {
		if v.Name == "config" {
			cmName = v.ConfigMap.Name
		}
	}
	require.Equal(t, r.configMap.Name, cmName)

	dbURL := env(c, "FERRY_DATABASE_URL")
	require.NotNil(t, dbURL, "the database URL comes from the environment")
	require.NotNil(t, dbURL.ValueFrom)
	require.NotNil(t, dbURL.ValueFrom.SecretKeyRef, "from a Secret")
	require.NotNil(t, env(c, "FERRY_HOLDER").ValueFrom.FieldRef, "the holder is the pod's name")

	// Probes: /livez for liveness and startup, /readyz for readiness, on
	// the port of metrics.addr.
	port := -1
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			port = int(p.ContainerPort)
		}
	}
	require.Equal(t, fmt.Sprintf("0.0.0.0:%d", port), section(t, r.config, "metrics.addr"))
	require.Equal(t, "/livez", c.LivenessProbe.HTTPGet.Path)
	require.Equal(t, "metrics", c.LivenessProbe.HTTPGet.Port.String())
	require.Equal(t, "/livez", c.StartupProbe.HTTPGet.Path)
	require.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
	require.Equal(t, "metrics", c.ReadinessProbe.HTTPGet.Port.String())

	// The grace period outlasts the relay's shutdown timeout (plus the
	// second it takes to close its connections).
	shutdown, err := time.ParseDuration(section(t, r.config, "relay.shutdown_timeout").(string))
	require.NoError(t, err)
	require.NotNil(t, pod.TerminationGracePeriodSeconds)
	require.Greater(t, time.Duration(*pod.TerminationGracePeriodSeconds)*time.Second, shutdown+time.Second)

	// Resources and a restrictive security context.
	require.False(t, c.Resources.Requests.Cpu().IsZero())
	require.False(t, c.Resources.Requests.Memory().IsZero())
	require.False(t, c.Resources.Limits.Memory().IsZero())
	require.True(t, *pod.SecurityContext.RunAsNonRoot)
	require.EqualValues(t, 65532, *pod.SecurityContext.RunAsUser, "the image's user")
	require.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, pod.SecurityContext.SeccompProfile.Type)
	sc := c.SecurityContext
	require.False(t, *sc.AllowPrivilegeEscalation)
	require.True(t, *sc.ReadOnlyRootFilesystem)
	require.False(t, *sc.Privileged)
	require.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
	require.False(t, *pod.AutomountServiceAccountToken)

	// Rolling updates add a replica before removing one.
	require.Equal(t, "0", d.Spec.Strategy.RollingUpdate.MaxUnavailable.String())

	// Every Service selects the Deployment's pods, inside the cluster only.
	podLabels := d.Spec.Template.Labels
	for k, v := range d.Spec.Selector.MatchLabels {
		require.Equal(t, v, podLabels[k])
	}
	for _, s := range r.services {
		require.Equal(t, corev1.ServiceTypeClusterIP, s.Spec.Type, "service %s", s.Name)
		for k, v := range s.Spec.Selector {
			require.Equal(t, v, podLabels[k], "service %s selects the pods", s.Name)
		}
	}
}

// TestChartDefaults: the chart as installed with only the database URL.
func TestChartDefaults(t *testing.T) {
	r, err := render(t, map[string]any{"database": map[string]any{"url": "postgres://ferry@db:5432/app"}})
	require.NoError(t, err)
	checkCommon(t, r)
	d := r.deployment
	c := d.Spec.Template.Spec.Containers[0]
	require.EqualValues(t, 2, *d.Spec.Replicas, "a standby by default")
	require.Equal(t, "ferry:v0.1.0", c.Image, "the chart's appVersion")

	// The chart creates the Secret, and the Deployment reads the URL
	// from it.
	require.Len(t, r.secrets, 1)
	s := r.secrets[0]
	require.Equal(t, "postgres://ferry@db:5432/app", s.StringData["url"])
	ref := env(&c, "FERRY_DATABASE_URL").ValueFrom.SecretKeyRef
	require.Equal(t, s.Name, ref.Name)
	require.Equal(t, "url", ref.Key)
	require.EqualValues(t, 0, section(t, r.config, "nats.shares"), "no shares unless asked")
	require.NotContains(t, r.configMap.Data["ferry.yaml"], "postgres://")

	require.EqualValues(t, 20, *d.Spec.Template.Spec.TerminationGracePeriodSeconds)
	require.Equal(t, "10s", section(t, r.config, "relay.shutdown_timeout"))
	require.Equal(t, "1m", section(t, r.config, "metrics.health_stall_after"))
	require.Equal(t, "nats://nats:4222", section(t, r.config, "nats.url"))

	// A PodDisruptionBudget over the same pods.
	require.NotNil(t, r.pdb)
	require.Equal(t, "1", r.pdb.Spec.MaxUnavailable.String())
	require.Equal(t, d.Spec.Selector.MatchLabels, r.pdb.Spec.Selector.MatchLabels)

	// No ServiceMonitor, no console, unless asked.
	require.Nil(t, r.monitor)
	require.Len(t, r.services, 1)
	require.Equal(t, "off", section(t, r.config, "ui.addr"))
	require.Nil(t, env(&c, "FERRY_UI_TOKEN"))
	for _, p := range c.Ports {
		require.NotEqual(t, "console", p.Name)
	}
}

// TestChartOptions: an existing Secret, a ServiceMonitor, the console with
// its token from a Secret, more replicas, a longer shutdown, another sink,
// no PodDisruptionBudget.
func TestChartOptions(t *testing.T) {
	r, err := render(t, map[string]any{
		"replicaCount":        5,
		"image":               map[string]any{"repository": "registry.internal/ferry", "tag": "v0.2.0"},
		"database":            map[string]any{"existingSecret": "orders-db", "secretKey": "dsn", "partitions": 8},
		"sink":                map[string]any{"url": "kafka://kafka:9092"},
		"relay":               map[string]any{"shutdownTimeoutSeconds": 30},
		"serviceMonitor":      map[string]any{"enabled": true, "labels": map[string]any{"release": "prom"}},
		"console":             map[string]any{"enabled": true, "tokenSecret": "ferry-console", "readOnly": true},
		"podDisruptionBudget": map[string]any{"enabled": false},
	})
	require.NoError(t, err)
	checkCommon(t, r)
	d := r.deployment
	c := d.Spec.Template.Spec.Containers[0]
	require.EqualValues(t, 5, *d.Spec.Replicas)
	require.Equal(t, "registry.internal/ferry:v0.2.0", c.Image)

	require.Empty(t, r.secrets, "an existing Secret is used, none created")
	ref := env(&c, "FERRY_DATABASE_URL").ValueFrom.SecretKeyRef
	require.Equal(t, "orders-db", ref.Name)
	require.Equal(t, "dsn", ref.Key)
	require.EqualValues(t, 8, section(t, r.config, "database.partitions"))

	require.Equal(t, "kafka://kafka:9092", section(t, r.config, "sink.url"))
	require.Nil(t, r.config["nats"], "no NATS section with another sink")

	require.Equal(t, "30s", section(t, r.config, "relay.shutdown_timeout"))
	require.EqualValues(t, 40, *d.Spec.Template.Spec.TerminationGracePeriodSeconds)

	require.NotNil(t, r.monitor)
	require.Equal(t, "prom", r.monitor.Labels["release"])
	require.Len(t, r.monitor.Spec.Endpoints, 1)
	require.Equal(t, "metrics", r.monitor.Spec.Endpoints[0].Port)
	require.Equal(t, "/metrics", r.monitor.Spec.Endpoints[0].Path)
	require.Equal(t, d.Spec.Selector.MatchLabels, r.monitor.Spec.Selector.MatchLabels)

	token := env(&c, "FERRY_UI_TOKEN")
	require.NotNil(t, token)
	require.Equal(t, "ferry-console", token.ValueFrom.SecretKeyRef.Name)
	require.Equal(t, "token", token.ValueFrom.SecretKeyRef.Key)
	require.Equal(t, "0.0.0.0:9470", section(t, r.config, "ui.addr"))
	require.Equal(t, true, section(t, r.config, "ui.read_only"))
	require.Len(t, r.services, 2)
	names := []string{r.services[0].Name, r.services[1].Name}
	require.True(t, slices.Contains(names, "orders-ferry-console"), "%v", names)

	require.Nil(t, r.pdb)
}

// TestChartRefusesWhatItCannotRun: no database URL, a console without a
// token Secret.
func TestChartRefusesWhatItCannotRun(t *testing.T) {
	_, err := render(t, nil)
	require.ErrorContains(t, err, "database.url or database.existingSecret")
	_, err = render(t, map[string]any{"database": map[string]any{"url": "postgres://x"}, "console": map[string]any{"enabled": true}})
	require.ErrorContains(t, err, "console.tokenSecret")
}
