package charttest

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

const chartDir = "../cubicle"

// flagsFile lists every `cubicle` flag the chart's containers pass, one
// "<command path> --<flag>" a line. cmd/cubicle's TestDeployFlagsExist
// checks each against the real cobra commands, so a chart that names a
// flag the binary lacks fails in the main module.
const (
	flagsFile = "testdata/cli-flags.txt"
	// The volume plugin lists the chart renders with volumes.s3.enabled.
	volumeControlFile = "testdata/volume-control.yaml"
	volumeNodeFile    = "testdata/volume-node.toml"
)

var update = flag.Bool("update", false, "rewrite "+flagsFile+" and the volume plugin lists from the rendered chart")

// cases are the values files rendered; each must render and decode.
var cases = []string{"default", "bundled-postgres", "runsc-gpu", "external-tls"}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	return ch
}

// render renders the chart as `helm install` would: values.yaml coalesced
// with vals, checked against values.schema.json, then Helm's engine in
// strict mode (a template naming a value that does not exist fails).
func render(t *testing.T, ch *chart.Chart, vals map[string]any) (map[string]string, error) {
	t.Helper()
	top, err := chartutil.ToRenderValuesWithSchemaValidation(ch, vals,
		common.ReleaseOptions{Name: "cubicle", Namespace: "sandbox", IsInstall: true, Revision: 1}, nil, false)
	if err != nil {
		return nil, err
	}
	return engine.Engine{Strict: true}.RenderWithContext(t.Context(), ch, top)
}

func readValues(t *testing.T, name string) map[string]any {
	t.Helper()
	v, err := common.ReadValuesFile(filepath.Join("testdata", name+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// objects is one render decoded: every manifest, by kind and name.
type objects struct {
	deployments  map[string]*appsv1.Deployment
	daemonSets   map[string]*appsv1.DaemonSet
	statefulSets map[string]*appsv1.StatefulSet
	services     map[string]*corev1.Service
	secrets      map[string]*corev1.Secret
	pdbs         map[string]*policyv1.PodDisruptionBudget
	configMaps   map[string]*corev1.ConfigMap
}

type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
}

// decodeStrict decodes every manifest into its k8s.io/api type, refusing
// unknown and duplicate fields, so a misspelt or misplaced key fails.
func decodeStrict(t *testing.T, files map[string]string) objects {
	t.Helper()
	o := objects{map[string]*appsv1.Deployment{}, map[string]*appsv1.DaemonSet{}, map[string]*appsv1.StatefulSet{},
		map[string]*corev1.Service{}, map[string]*corev1.Secret{}, map[string]*policyv1.PodDisruptionBudget{},
		map[string]*corev1.ConfigMap{}}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, file := range names {
		if !strings.HasSuffix(file, ".yaml") {
			continue
		}
		for i, doc := range splitDocs(files[file]) {
			var h header
			if err := yaml.Unmarshal([]byte(doc), &h); err != nil {
				t.Fatalf("%s #%d: %v", file, i, err)
			}
			where := fmt.Sprintf("%s #%d (%s %s)", file, i, h.Kind, h.Metadata.Name)
			if h.Metadata.Name == "" {
				t.Fatalf("%s: no metadata.name", where)
			}
			var target any
			switch gk := h.APIVersion + "/" + h.Kind; gk {
			case "apps/v1/Deployment":
				v := &appsv1.Deployment{}
				o.deployments[h.Metadata.Name], target = v, v
			case "apps/v1/DaemonSet":
				v := &appsv1.DaemonSet{}
				o.daemonSets[h.Metadata.Name], target = v, v
			case "apps/v1/StatefulSet":
				v := &appsv1.StatefulSet{}
				o.statefulSets[h.Metadata.Name], target = v, v
			case "v1/Service":
				v := &corev1.Service{}
				o.services[h.Metadata.Name], target = v, v
			case "v1/Secret":
				v := &corev1.Secret{}
				o.secrets[h.Metadata.Name], target = v, v
			case "v1/ConfigMap":
				v := &corev1.ConfigMap{}
				o.configMaps[h.Metadata.Name], target = v, v
			case "policy/v1/PodDisruptionBudget":
				v := &policyv1.PodDisruptionBudget{}
				o.pdbs[h.Metadata.Name], target = v, v
			default:
				t.Fatalf("%s: kind %q is not one this test decodes: add it", where, gk)
			}
			if err := yaml.UnmarshalStrict([]byte(doc), target); err != nil {
				t.Fatalf("%s: strict decode: %v\n%s", where, err, doc)
			}
		}
	}
	return o
}

func splitDocs(s string) []string {
	var out []string
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(s, -1) {
		if strings.TrimSpace(stripComments(d)) != "" {
			out = append(out, d)
		}
	}
	return out
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func TestChartRendersAndDecodesStrictly(t *testing.T) {
	ch := loadChart(t)
	for _, name := range cases {
		t.Run(name, func(t *testing.T) {
			files, err := render(t, ch, readValues(t, name))
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			o := decodeStrict(t, files)
			checkReferences(t, o)
			if strings.TrimSpace(files["cubicle/templates/NOTES.txt"]) == "" {
				t.Error("NOTES.txt rendered empty")
			}
		})
	}
}

// checkReferences: every Secret a pod names is one the chart made or one
// the values name, with the key the pod reads; every Service selects pods.
func checkReferences(t *testing.T, o objects) {
	t.Helper()
	external := map[string]bool{ // Secrets the values files name, made by the operator
		"cubicle-store": true, "cubicle-tls": true, "cubicle-secrets-key": true,
		"wildcard-cubicle-example-org": true, "managed-postgres": true, "cubicle-join-tokens": true,
		"snapshot-store-credentials": true, "volume-s3-credentials": true, "image-store-credentials": true,
	}
	checkSecret := func(where, name, key string) {
		s, ok := o.secrets[name]
		if !ok {
			if !external[name] {
				t.Errorf("%s: Secret %q is neither rendered nor named by the values", where, name)
			}
			return
		}
		if key == "" {
			return
		}
		if _, ok := s.Data[key]; !ok {
			if _, ok := s.StringData[key]; !ok {
				t.Errorf("%s: Secret %q has no key %q", where, name, key)
			}
		}
	}
	pods := map[string]corev1.PodTemplateSpec{}
	for n, d := range o.deployments {
		pods["Deployment "+n] = d.Spec.Template
	}
	for n, d := range o.daemonSets {
		pods["DaemonSet "+n] = d.Spec.Template
	}
	for n, s := range o.statefulSets {
		p := *s.Spec.Template.DeepCopy()
		for _, c := range s.Spec.VolumeClaimTemplates { // a claim is a volume of every pod
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: c.Name})
		}
		pods["StatefulSet "+n] = p
	}
	for where, p := range pods {
		for _, v := range p.Spec.Volumes {
			if v.ConfigMap != nil {
				if _, ok := o.configMaps[v.ConfigMap.Name]; !ok {
					t.Errorf("%s: ConfigMap %q is not rendered", where, v.ConfigMap.Name)
				}
			}
			if v.Secret != nil {
				key := ""
				if len(v.Secret.Items) > 0 {
					key = v.Secret.Items[0].Key
				}
				checkSecret(where, v.Secret.SecretName, key)
			}
		}
		for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
			for _, e := range c.EnvFrom {
				if e.SecretRef != nil {
					checkSecret(where+" "+c.Name, e.SecretRef.Name, "")
				}
			}
			for _, e := range c.Env {
				if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil && (r.SecretKeyRef.Optional == nil || !*r.SecretKeyRef.Optional) {
					checkSecret(where+" "+c.Name, r.SecretKeyRef.Name, r.SecretKeyRef.Key)
				}
			}
			mounts := map[string]bool{}
			for _, m := range c.VolumeMounts {
				mounts[m.Name] = true
			}
			for m := range mounts {
				if !slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == m }) {
					t.Errorf("%s %s mounts volume %q, which the pod lacks", where, c.Name, m)
				}
			}
		}
	}
	for n, s := range o.services {
		matched := false
		for _, p := range pods {
			if selects(s.Spec.Selector, p.Labels) {
				matched = true
			}
		}
		if !matched {
			t.Errorf("Service %s selects no pod", n)
		}
	}
}

func selects(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

func renderCase(t *testing.T, name string) objects {
	t.Helper()
	files, err := render(t, loadChart(t), readValues(t, name))
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return decodeStrict(t, files)
}

func container(t *testing.T, cs []corev1.Container, name string) corev1.Container {
	t.Helper()
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

func TestDefaultIsAPureControlPlane(t *testing.T) {
	o := renderCase(t, "default")
	if len(o.daemonSets) != 0 || len(o.statefulSets) != 0 {
		t.Errorf("default values render nodes or PostgreSQL: %d DaemonSets, %d StatefulSets", len(o.daemonSets), len(o.statefulSets))
	}
	d := o.deployments["cubicle"]
	if d == nil {
		t.Fatalf("no Deployment cubicle; have %v", keys(o.deployments))
	}
	if *d.Spec.Replicas != 2 {
		t.Errorf("replicas %d, want 2", *d.Spec.Replicas)
	}
	c := container(t, d.Spec.Template.Spec.Containers, "cubicle")
	for _, want := range []string{"serve", "--embedded-node=false", "--store=$(CUBICLE_STORE)", "--tls-cert=/etc/cubicle/tls/tls.crt",
		"--tls-key=/etc/cubicle/tls/tls.key", "--secrets-key=/etc/cubicle/secrets-key/secrets.key"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("control plane args %q lack %q", c.Args, want)
		}
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/health" ||
		c.ReadinessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS {
		t.Errorf("readiness probe %+v, want HTTPS GET /health", c.ReadinessProbe)
	}
	// The chart made the secrets key: 64 hex digits, kept on uninstall.
	s := o.secrets["cubicle-secrets-key"]
	if s == nil {
		t.Fatalf("no secrets-key Secret; have %v", keys(o.secrets))
	}
	if !regexp.MustCompile(`^[0-9a-f]{64}\n$`).Match(s.Data["secrets.key"]) {
		t.Errorf("secrets.key %q is not 64 hex digits", s.Data["secrets.key"])
	}
	if s.Annotations["helm.sh/resource-policy"] != "keep" {
		t.Error("the secrets key Secret is not kept on uninstall")
	}
	if o.pdbs["cubicle"] == nil {
		t.Error("two replicas and no PodDisruptionBudget")
	}
	if len(o.configMaps) != 0 || slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--volume-config") }) {
		t.Error("volume plugins configured without volumes.s3.enabled")
	}
}

// volumes.s3: one plugin list in a ConfigMap, the control plane's half to
// serve and the nodes' half to node run, and the plugin's settings from
// the values' Secret in both (the plugin reads its own environment).
func TestS3Volumes(t *testing.T) {
	o := renderCase(t, "external-tls")
	cm := o.configMaps["cubicle-volumes"]
	if cm == nil {
		t.Fatalf("no ConfigMap cubicle-volumes; have %v", keys(o.configMaps))
	}
	if !strings.Contains(cm.Data["control.yaml"], "binary_path: /usr/local/bin/cubicle-volume-s3") ||
		!strings.Contains(cm.Data["node.toml"], `binary_path = "/usr/local/bin/cubicle-volume-s3"`) ||
		!strings.Contains(cm.Data["node.toml"], `volume_plugin_base_dir = "/var/lib/cubicle-node/volume-plugins"`) {
		t.Errorf("plugin lists:\n%s\n%s", cm.Data["control.yaml"], cm.Data["node.toml"])
	}
	// cmd/cubicle's TestDeployVolumeConfigsParse reads these with serve's
	// and node run's own parsers.
	for key, file := range map[string]string{"control.yaml": volumeControlFile, "node.toml": volumeNodeFile} {
		if *update {
			if err := os.WriteFile(file, []byte(cm.Data[key]), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if old, err := os.ReadFile(file); err != nil || string(old) != cm.Data[key] {
			t.Errorf("%s is stale (run go test -run TestS3Volumes -update): %v", file, err)
		}
	}
	ds := o.daemonSets["cubicle-node"].Spec.Template.Spec
	for _, c := range []struct {
		c    corev1.Container
		flag string
	}{
		{container(t, o.deployments["cubicle"].Spec.Template.Spec.Containers, "cubicle"), "--volume-config=/etc/cubicle/volumes/control.yaml"},
		{container(t, ds.Containers, "node"), "--node-config=/etc/cubicle/volumes/node.toml"},
	} {
		if !slices.Contains(c.c.Args, c.flag) {
			t.Errorf("%s args %v lack %s", c.c.Name, c.c.Args, c.flag)
		}
		if len(c.c.EnvFrom) != 1 || c.c.EnvFrom[0].SecretRef == nil || c.c.EnvFrom[0].SecretRef.Name != "volume-s3-credentials" {
			t.Errorf("%s envFrom %+v, want the values' Secret", c.c.Name, c.c.EnvFrom)
		}
		if !slices.ContainsFunc(c.c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/etc/cubicle/volumes" }) {
			t.Errorf("%s does not mount the plugin lists", c.c.Name)
		}
	}
}

func TestBundledPostgres(t *testing.T) {
	o := renderCase(t, "bundled-postgres")
	ss := o.statefulSets["cubicle-postgresql"]
	if ss == nil {
		t.Fatalf("no StatefulSet cubicle-postgresql; have %v", keys(o.statefulSets))
	}
	if img := ss.Spec.Template.Spec.Containers[0].Image; img != "registry.example.com/library/postgres:16.4" {
		t.Errorf("postgres image %q, want the value's", img)
	}
	if q := ss.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests.Storage().String(); q != "5Gi" {
		t.Errorf("storage %s, want 5Gi", q)
	}
	st := o.secrets["cubicle-store"]
	if st == nil {
		t.Fatalf("no store Secret; have %v", keys(o.secrets))
	}
	if got, want := string(st.Data["dsn"]), "postgres://cubicle@cubicle-postgresql:5432/cubicle?sslmode=disable"; got != want {
		t.Errorf("dsn %q, want %q (no password in it)", got, want)
	}
	if len(st.Data["password"]) < 32 {
		t.Errorf("password %d bytes, want 32", len(st.Data["password"]))
	}
	if o.services["cubicle-postgresql"] == nil {
		t.Error("no Service for PostgreSQL")
	}
	c := container(t, o.deployments["cubicle"].Spec.Template.Spec.Containers, "cubicle")
	for _, want := range []string{"--tls-self-signed", "--domain=sandbox.example.com", "--warm-pool=base=2"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("control plane args %q lack %q", c.Args, want)
		}
	}
	if len(o.pdbs) != 0 {
		t.Error("one replica and a PodDisruptionBudget: it would block every drain")
	}
}

func TestRunscGPUNode(t *testing.T) {
	o := renderCase(t, "runsc-gpu")
	ds := o.daemonSets["cubicle-node"]
	if ds == nil {
		t.Fatalf("no DaemonSet cubicle-node; have %v", keys(o.daemonSets))
	}
	p := ds.Spec.Template.Spec
	if !p.HostNetwork || !p.HostPID || p.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("hostNetwork %v hostPID %v dnsPolicy %s, want true true ClusterFirstWithHostNet", p.HostNetwork, p.HostPID, p.DNSPolicy)
	}
	c := container(t, p.Containers, "node")
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("node container not privileged")
	}
	for _, want := range []string{"node", "run", "--runtime=runsc", "--accel-backend=passthrough", "--accel-dev=/dev",
		"--images-dir=/srv/cubicle/images", "--egress-proxy-allow=10.50.0.0/16", "--advertise=$(HOST_IP)",
		"--dns=1.1.1.1,8.8.8.8", "--sandbox-max-flows=4096"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("node args %q lack %q", c.Args, want)
		}
	}
	hostPaths := map[string]string{}
	for _, v := range p.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	for name, path := range map[string]string{"data": "/var/lib/cubicle-node", "run": "/run/cubicle", "cgroup": "/sys/fs/cgroup", "dev": "/dev"} {
		if hostPaths[name] != path {
			t.Errorf("host path %s = %q, want %q", name, hostPaths[name], path)
		}
	}
	for _, m := range c.VolumeMounts {
		if (m.Name == "data" || m.Name == "run") && (m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional) {
			t.Errorf("mount %s is not Bidirectional: sandbox mounts would die with the pod", m.Name)
		}
	}
	if p.NodeSelector["nvidia.com/gpu.present"] != "true" || len(p.Tolerations) != 1 {
		t.Errorf("nodeSelector %v tolerations %v, want the values'", p.NodeSelector, p.Tolerations)
	}
	join := container(t, p.InitContainers, "join")
	script := strings.Join(join.Command, " ")
	for _, want := range []string{"cubicle node join", "--ca-pin", "CUBICLE_JOIN_TOKEN", "node.crt"} {
		if !strings.Contains(script, want) {
			t.Errorf("join init container %q lacks %q", script, want)
		}
	}
	if slices.ContainsFunc(join.Env, func(e corev1.EnvVar) bool { return strings.Contains(e.Value, ".00112233") }) {
		t.Error("a join token is in the pod spec")
	}
	js := o.secrets["cubicle-join"]
	if js == nil || js.StringData["gpu-1.example.com"] != "0123456789ab.00112233445566778899aabbccddeeff" || len(js.StringData) != 2 {
		t.Errorf("join Secret %+v, want one token per node name", js)
	}
	if _, ok := o.secrets["cubicle-secrets-key"]; ok {
		t.Error("a secrets key was made although secretsKey.existingSecret is set")
	}
}

func TestExternalTLS(t *testing.T) {
	o := renderCase(t, "external-tls")
	d := o.deployments["cubicle"]
	if *d.Spec.Replicas != 3 {
		t.Errorf("replicas %d, want 3", *d.Spec.Replicas)
	}
	var tlsSecret string
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == "tls" && v.Secret != nil {
			tlsSecret = v.Secret.SecretName
		}
	}
	if tlsSecret != "wildcard-cubicle-example-org" {
		t.Errorf("TLS volume from %q, want the values' Secret", tlsSecret)
	}
	svc := o.services["cubicle"]
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer || svc.Spec.Ports[0].Port != 443 || len(svc.Spec.Ports) != 1 {
		t.Errorf("Service %+v, want one LoadBalancer port 443 (metrics stay internal)", svc.Spec)
	}
	if m := o.services["cubicle-metrics"]; m == nil || m.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Error("metrics Service missing or not ClusterIP")
	}
	join := container(t, o.daemonSets["cubicle-node"].Spec.Template.Spec.InitContainers, "join")
	if envValue(join.Env, "CONTROL_PLANE") != "https://api.cubicle.example.org" {
		t.Errorf("CONTROL_PLANE %q, want the values' URL", envValue(join.Env, "CONTROL_PLANE"))
	}
	if _, ok := o.secrets["cubicle-join"]; ok {
		t.Error("a join Secret was rendered although join.existingSecret is set")
	}
	// The snapshot and image stores: the flags and their credentials on
	// the control plane only; the nodes never get them.
	cp := container(t, d.Spec.Template.Spec.Containers, "cubicle")
	for _, st := range []struct{ flag, env, secret string }{
		{"--snapshot-store=s3://cubicle-snapshots?endpoint=https://s3.eu-west-1.amazonaws.com&region=eu-west-1", "CUBICLE_SNAPSHOT_S3_", "snapshot-store-credentials"},
		{"--image-store=s3://cubicle-images?endpoint=https://s3.eu-west-1.amazonaws.com&region=eu-west-1", "CUBICLE_IMAGE_S3_", "image-store-credentials"},
	} {
		if !slices.Contains(cp.Args, st.flag) {
			t.Errorf("control plane args %v lack %s", cp.Args, st.flag)
		}
		for _, name := range []string{st.env + "ACCESS_KEY", st.env + "SECRET_KEY"} {
			found := false
			for _, e := range cp.Env {
				if e.Name == name && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == st.secret {
					found = true
				}
			}
			if !found {
				t.Errorf("control plane env lacks %s from the values' Secret", name)
			}
		}
		ns := o.daemonSets["cubicle-node"].Spec.Template.Spec
		for _, c := range slices.Concat(ns.InitContainers, ns.Containers) {
			for _, e := range c.Env {
				if strings.HasPrefix(e.Name, st.env) {
					t.Errorf("node container %s gets %s", c.Name, e.Name)
				}
			}
		}
	}
}

func TestDefaultJoinURLIsTheService(t *testing.T) {
	o := renderCase(t, "runsc-gpu")
	join := container(t, o.daemonSets["cubicle-node"].Spec.Template.Spec.InitContainers, "join")
	if got := envValue(join.Env, "CONTROL_PLANE"); got != "https://cubicle.sandbox.svc:443" {
		t.Errorf("CONTROL_PLANE %q, want the chart's Service", got)
	}
}

func envValue(env []corev1.EnvVar, name string) string {
	for _, e := range env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// TestSchemaRefusesBadValues: Helm's own schema validation (what helm
// install runs) refuses each of these, naming the offending value.
func TestSchemaRefusesBadValues(t *testing.T) {
	ch := loadChart(t)
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"values.yaml alone: no store", "{}", "existingSecret"},
		{"wrong runtime", "nodes: {runtime: crun}", "runtime"},
		{"negative replicas", "controlPlane: {replicas: -1}", "replicas"},
		{"zero replicas", "controlPlane: {replicas: 0}", "replicas"},
		{"unknown top-level key", "replica: 2", "replica"},
		{"unknown nested key", "controlPlane: {replica: 2}", "replica"},
		{"misspelt node key", "nodes: {runtme: runsc}", "runtme"},
		{"tls secret mode without a Secret", "tls: {secretName: ''}", "secretName"},
		{"tls mode unknown", "tls: {mode: acme}", "mode"},
		{"nodes without a CA pin", "nodes: {enabled: true}\njoin: {tokens: {n1: 0123456789ab.00112233445566778899aabbccddeeff}}", "caPin"},
		{"nodes without tokens", "nodes: {enabled: true}\njoin: {caPin: sha256:0f3c2a9d8e7b6a5f4e3d2c1b0a99887766554433221100ffeeddccbbaa998877}", "tokens"},
		{"malformed token", "join: {tokens: {n1: not-a-token}}", "n1"},
		{"malformed pin", "join: {caPin: sha256:xyz}", "caPin"},
		{"bundled and external at once", "store: {bundled: {enabled: true}}", "existingSecret"},
		{"warm pool without a size", "controlPlane: {warmPools: [base]}", "warmPools"},
		{"extra arg that is not a flag", "nodes: {extraArgs: ['rm -rf /']}", "extraArgs"},
		{"port out of range", "nodes: {grpcPort: 70000}", "grpcPort"},
		{"snapshot store not s3", "snapshotStore: {url: 'https://bucket', existingSecret: creds}", "url"},
		{"s3 volumes without credentials", "volumes: {s3: {enabled: true}}", "existingSecret"},
		{"snapshot store without credentials", "snapshotStore: {url: 's3://snaps?region=eu-west-1'}", "existingSecret"},
		{"image store not s3", "imageStore: {url: 'https://bucket', existingSecret: creds}", "url"},
		{"image store without credentials", "imageStore: {url: 's3://images?region=eu-west-1'}", "existingSecret"},
		{"accelerator backend unknown", "nodes: {accelerators: {enabled: true, backend: cuda}}", "backend"},
		{"builtins enabled not a boolean", "builtins: {enabled: 'yes'}", "enabled"},
		{"builtins image without a repository", "builtins: {image: {repository: ''}}", "repository"},
		{"builtins pull policy unknown", "builtins: {image: {pullPolicy: Sometimes}}", "pullPolicy"},
		{"builtins unknown key", "builtins: {images: [base]}", "images"},
		{"builtins image unknown key", "builtins: {image: {digest: 'sha256:00'}}", "digest"},
		{"images volume size not a quantity", "controlPlane: {imagesVolume: {sizeLimit: lots}}", "sizeLimit"},
		{"images volume unknown key", "controlPlane: {imagesVolume: {claimName: images}}", "claimName"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := readValues(t, "default")
			if tc.name == "values.yaml alone: no store" {
				vals = map[string]any{"tls": map[string]any{"secretName": "cubicle-tls"}}
			}
			over, err := common.ReadValues([]byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			vals = chartutil.CoalesceTables(over.AsMap(), vals)
			_, err = render(t, ch, vals)
			if err == nil {
				t.Fatalf("values %s accepted", tc.yaml)
			}
			if !strings.Contains(err.Error(), "schema") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error does not come from the schema or does not name %q:\n%v", tc.want, err)
			}
		})
	}
}

// TestFlagsListed: every flag the chart's containers pass to `cubicle` is
// in testdata/cli-flags.txt, and nothing else is, so the main module's
// check of that list against the binary covers the chart exactly.
func TestFlagsListed(t *testing.T) {
	ch := loadChart(t)
	used := map[string]bool{}
	for _, name := range cases {
		files, err := render(t, ch, readValues(t, name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		o := decodeStrict(t, files)
		var pods []corev1.PodSpec
		for _, d := range o.deployments {
			pods = append(pods, d.Spec.Template.Spec)
		}
		for _, d := range o.daemonSets {
			pods = append(pods, d.Spec.Template.Spec)
		}
		for _, p := range pods {
			for _, c := range slices.Concat(p.InitContainers, p.Containers) {
				for _, f := range cubicleFlags(c) {
					used[f] = true
				}
			}
		}
	}
	var got []string
	for f := range used {
		got = append(got, f)
	}
	sort.Strings(got)
	text := "# Generated by `go test -run TestFlagsListed -update` in deploy/helm/charttest:\n" +
		"# every `cubicle` flag the Helm chart passes. cmd/cubicle's TestDeployFlagsExist checks them.\n" +
		strings.Join(got, "\n") + "\n"
	if *update {
		if err := os.WriteFile(flagsFile, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	old, err := os.ReadFile(flagsFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(old, []byte(text)) {
		t.Errorf("%s is stale (run go test -run TestFlagsListed -update); the chart passes:\n%s", flagsFile, text)
	}
}

var (
	scriptCall = regexp.MustCompile(`exec cubicle ([a-z ]+?) \\`)
	flagName   = regexp.MustCompile(`--[a-z0-9-]+`)
)

// cubicleFlags returns "<command path> --flag" for a container running
// cubicle directly (command cubicle, args sub-commands then flags) or
// through the join script (exec cubicle <path> \ then flags).
func cubicleFlags(c corev1.Container) []string {
	var out []string
	if slices.Equal(c.Command, []string{"cubicle"}) {
		var path []string
		for _, a := range c.Args {
			if !strings.HasPrefix(a, "--") {
				path = append(path, a)
				continue
			}
			out = append(out, strings.Join(path, " ")+" "+flagName.FindString(a))
		}
		return out
	}
	script := strings.Join(c.Command, "\n")
	if m := scriptCall.FindStringSubmatchIndex(script); m != nil {
		path := script[m[2]:m[3]]
		for _, f := range flagName.FindAllString(script[m[1]:], -1) {
			out = append(out, path+" "+f)
		}
	}
	return out
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
