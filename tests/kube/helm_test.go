// Package kube checks gpumem's Kubernetes deployment: the Helm chart at
// deploy/helm/gpumem and the manifests rendered from it. Every rendered
// object is decoded strictly (an unknown or duplicate field is an error)
// into the k8s.io/api types, then checked for what the DaemonSet must and
// must not be granted; then installed into a real API server, with the
// image's daemon run against it (install_test.go). helm, kube-apiserver
// and etcd come from tools.sh, which builds each from its Go module into
// a cache dir.
package kube

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/gpumem/gpumem/internal/testenv"
)

const chart = "../../deploy/helm/gpumem"

// helmPath finds the helm that check.sh builds (tools.sh); without it the
// test fails under CI and skips elsewhere.
func helmPath(t *testing.T) string {
	t.Helper()
	if path := os.Getenv("GPUMEM_HELM"); path != "" {
		return path
	}
	version, err := os.ReadFile("helm-version")
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(cachedTool(t, "helm", strings.TrimSpace(string(version)), "bash tests/kube/check.sh"), "helm")
}

// cachedTool is the dir where tools.sh put tool name at version; without
// it the test fails under CI and skips elsewhere, saying that build makes
// it.
func cachedTool(t *testing.T, name, version, build string) string {
	t.Helper()
	cache := os.Getenv("GPUMEM_TOOLS_CACHE")
	if cache == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			t.Fatal(err)
		}
		cache = filepath.Join(base, "gpumem")
	}
	dir := filepath.Join(cache, name+"-"+version)
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err != nil {
		testenv.Missing(t, fmt.Sprintf("%s %s not found in %s: run %s first (it builds it)", name, version, dir, build))
	}
	return dir
}

func render(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(helmPath(t), append([]string{"template", "gpumem", chart, "--namespace", "gpumem"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", args, err, stderr.String())
	}
	return out
}

// serviceMonitor is the part of monitoring.coreos.com/v1 ServiceMonitor
// the chart writes; decoding into it strictly catches a misspelt field.
// (The operator's Go types would add a module for one object.)
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
			Relabelings   []struct {
				SourceLabels []string `json:"sourceLabels"`
				TargetLabel  string   `json:"targetLabel"`
			} `json:"relabelings"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// kubeScheme knows the groups the chart may render, and no other: an
// object of another kind fails to decode.
var kubeScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, rbacv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

// decodeAll splits a multi-document YAML stream and decodes each object
// strictly: k8s.io/api objects through a scheme's strict
// decoder, ServiceMonitors into serviceMonitor with unknown fields refused.
func decodeAll(t *testing.T, data []byte) []runtime.Object {
	t.Helper()
	strict := serializer.NewCodecFactory(kubeScheme, serializer.EnableStrict).UniversalDeserializer()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []runtime.Object
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		if meta.Kind == "ServiceMonitor" {
			js, err := yaml.YAMLToJSONStrict(doc)
			if err != nil {
				t.Fatalf("ServiceMonitor: %v", err)
			}
			dec := json.NewDecoder(bytes.NewReader(js))
			dec.DisallowUnknownFields()
			var sm serviceMonitor
			if err := dec.Decode(&sm); err != nil {
				t.Fatalf("ServiceMonitor: %v\n%s", err, doc)
			}
			objs = append(objs, &smObject{sm})
			continue
		}
		obj, _, err := strict.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", meta.APIVersion, meta.Kind, err, doc)
		}
		objs = append(objs, obj)
	}
	return objs
}

// smObject lets a ServiceMonitor travel with the typed objects.
type smObject struct{ serviceMonitor }

func (s *smObject) DeepCopyObject() runtime.Object { c := *s; return &c }

func stripComments(doc []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			out = append(out, line...)
			out = append(out, '\n')
		}
	}
	return out
}

// TestStrictDecodeRejects: the decoder really refuses unknown and
// duplicate fields, so the tests below can trust it.
func TestStrictDecodeRejects(t *testing.T) {
	strict := serializer.NewCodecFactory(kubeScheme, serializer.EnableStrict).UniversalDeserializer()
	for name, doc := range map[string]string{
		"unknown field":   "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {clusterIp: None}\n",
		"duplicate field": "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {clusterIP: None, clusterIP: None}\n",
		"nested unknown":  "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec: {template: {spec: {hostPid: true}}}\n",
	} {
		if _, _, err := strict.Decode([]byte(doc), nil, nil); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}

type objects struct {
	ds   *appsv1.DaemonSet
	sa   *corev1.ServiceAccount
	svc  *corev1.Service
	role *rbacv1.ClusterRole
	bind *rbacv1.ClusterRoleBinding
	sm   *smObject
}

func collect(t *testing.T, objs []runtime.Object) objects {
	t.Helper()
	var o objects
	for _, obj := range objs {
		switch v := obj.(type) {
		case *appsv1.DaemonSet:
			o.ds = v
		case *corev1.ServiceAccount:
			o.sa = v
		case *corev1.Service:
			o.svc = v
		case *rbacv1.ClusterRole:
			o.role = v
		case *rbacv1.ClusterRoleBinding:
			o.bind = v
		case *smObject:
			o.sm = v
		default:
			t.Errorf("unexpected object %T", obj)
		}
	}
	if o.ds == nil || o.sa == nil || o.svc == nil || o.role == nil || o.bind == nil {
		t.Fatalf("missing objects: %+v", o)
	}
	return o
}

func TestChartDefaults(t *testing.T) {
	o := collect(t, decodeAll(t, render(t)))
	pod := o.ds.Spec.Template.Spec
	if !pod.HostPID {
		t.Error("hostPID is off: NVML's host pids would not resolve")
	}
	if pod.HostNetwork || pod.HostIPC {
		t.Error("hostNetwork or hostIPC is on: not needed")
	}
	if pod.RuntimeClassName == nil || *pod.RuntimeClassName != "nvidia" {
		t.Errorf("runtimeClassName = %v, want nvidia", pod.RuntimeClassName)
	}
	if pod.NodeSelector["nvidia.com/gpu.present"] != "true" {
		t.Errorf("nodeSelector = %v, want the GPU-node label", pod.NodeSelector)
	}
	if !slices.ContainsFunc(pod.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Key == "nvidia.com/gpu" && tol.Operator == corev1.TolerationOpExists
	}) {
		t.Errorf("tolerations = %+v: GPU nodes' taint not tolerated", pod.Tolerations)
	}
	if pod.ServiceAccountName != o.sa.Name {
		t.Errorf("serviceAccountName %q, ServiceAccount %q", pod.ServiceAccountName, o.sa.Name)
	}
	if psc := pod.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("pod securityContext %+v: metrics mode runs as a non-root user", psc)
	}
	if len(pod.Volumes) == 0 || slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.HostPath != nil }) {
		t.Errorf("volumes %+v: want emptyDirs only, no hostPath", pod.Volumes)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
		if e.Name == "NODE_NAME" && (e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName") {
			t.Error("NODE_NAME does not come from spec.nodeName")
		}
	}
	if env["NVIDIA_DRIVER_CAPABILITIES"] != "utility" || env["NVIDIA_VISIBLE_DEVICES"] != "all" {
		t.Errorf("NVIDIA env = %v, want utility and all", env)
	}
	for name := range c.Resources.Limits {
		if strings.Contains(string(name), "gpu") {
			t.Errorf("the daemon requests a GPU (%s)", name)
		}
	}
	for name := range c.Resources.Requests {
		if strings.Contains(string(name), "gpu") {
			t.Errorf("the daemon requests a GPU (%s)", name)
		}
	}
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("root filesystem is writable")
	}
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Privileged == nil || *sc.Privileged {
		t.Error("privilege escalation or privileged mode not explicitly off")
	}
	if sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("capabilities %+v: want drop ALL, add none", sc.Capabilities)
	}
	checkArgs(t, c.Args)

	// RBAC: read-only on pods, bound to the DaemonSet's account.
	if len(o.role.Rules) != 1 {
		t.Fatalf("ClusterRole rules %+v", o.role.Rules)
	}
	rule := o.role.Rules[0]
	if !slices.Equal(rule.APIGroups, []string{""}) || !slices.Equal(rule.Resources, []string{"pods"}) ||
		!slices.Equal(rule.Verbs, []string{"get", "list", "watch"}) || len(rule.ResourceNames) != 0 {
		t.Errorf("ClusterRole rule %+v: want get, list, watch on pods only", rule)
	}
	if o.bind.RoleRef.Kind != "ClusterRole" || o.bind.RoleRef.Name != o.role.Name || len(o.bind.Subjects) != 1 ||
		o.bind.Subjects[0].Kind != "ServiceAccount" || o.bind.Subjects[0].Name != o.sa.Name || o.bind.Subjects[0].Namespace != o.sa.Namespace {
		t.Errorf("ClusterRoleBinding %+v does not bind the role to the DaemonSet's account", o.bind)
	}

	// The Service selects the DaemonSet's pods and names the metrics port.
	for k, v := range o.svc.Spec.Selector {
		if o.ds.Spec.Template.Labels[k] != v {
			t.Errorf("Service selector %s=%s does not match the pods' labels", k, v)
		}
	}
	sel, err := metav1.LabelSelectorAsSelector(o.ds.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labelSet(o.ds.Spec.Template.Labels)) {
		t.Error("the DaemonSet's selector does not match its own pods")
	}
	if len(o.svc.Spec.Ports) != 1 || o.svc.Spec.Ports[0].Name != "metrics" ||
		len(c.Ports) != 1 || o.svc.Spec.Ports[0].Port != c.Ports[0].ContainerPort || c.Ports[0].Name != "metrics" {
		t.Errorf("Service ports %+v vs container ports %+v", o.svc.Spec.Ports, c.Ports)
	}
	if o.sm != nil {
		t.Error("ServiceMonitor rendered by default: it needs the operator's CRDs")
	}
}

type labelSet map[string]string

func (l labelSet) Has(k string) bool              { _, ok := l[k]; return ok }
func (l labelSet) Get(k string) string            { return l[k] }
func (l labelSet) Lookup(k string) (string, bool) { v, ok := l[k]; return v, ok }

func TestChartServiceMonitor(t *testing.T) {
	o := collect(t, decodeAll(t, render(t, "--set", "serviceMonitor.enabled=true")))
	if o.sm == nil {
		t.Fatal("no ServiceMonitor")
	}
	if o.sm.APIVersion != "monitoring.coreos.com/v1" {
		t.Errorf("ServiceMonitor apiVersion %q", o.sm.APIVersion)
	}
	for k, v := range o.sm.Spec.Selector.MatchLabels {
		if o.svc.Labels[k] != v {
			t.Errorf("ServiceMonitor selects %s=%s, the Service is labelled %v", k, v, o.svc.Labels)
		}
	}
	if len(o.sm.Spec.Endpoints) != 1 || o.sm.Spec.Endpoints[0].Port != o.svc.Spec.Ports[0].Name || o.sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor endpoints %+v", o.sm.Spec.Endpoints)
	}
	if !slices.Equal(o.sm.Spec.NamespaceSelector.MatchNames, []string{o.svc.Namespace}) {
		t.Errorf("ServiceMonitor namespaces %v", o.sm.Spec.NamespaceSelector.MatchNames)
	}
}

// Notebooks mode grants exactly what finding, attaching to and reclaiming
// for kernels inside pods needs, and runs as root only to hold it; every
// other setting stays as in metrics mode.
func TestChartNotebooksMode(t *testing.T) {
	metrics := collect(t, decodeAll(t, render(t)))
	o := collect(t, decodeAll(t, render(t, "--set", "mode=notebooks")))
	pod := o.ds.Spec.Template.Spec
	if !pod.HostPID || pod.HostNetwork || pod.HostIPC {
		t.Errorf("hostPID %v, hostNetwork %v, hostIPC %v: want the host's pids only", pod.HostPID, pod.HostNetwork, pod.HostIPC)
	}
	if psc := pod.SecurityContext; psc == nil || psc.RunAsUser == nil || *psc.RunAsUser != 0 || psc.RunAsNonRoot == nil || *psc.RunAsNonRoot {
		t.Errorf("pod securityContext %+v: notebooks mode runs as root (capabilities reach no other user)", psc)
	}
	c := pod.Containers[0]
	sc := c.SecurityContext
	want := []corev1.Capability{"SYS_ADMIN", "SYS_PTRACE", "DAC_READ_SEARCH", "KILL"}
	if sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		!slices.Equal(sc.Capabilities.Add, want) {
		t.Errorf("capabilities %+v: want drop ALL, add exactly %v", sc.Capabilities, want)
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Privileged == nil || *sc.Privileged {
		t.Errorf("securityContext %+v: read-only root, no escalation, not privileged, as in metrics mode", sc)
	}
	for _, flag := range []string{"--pod-kernels", "--reclaim-all-users"} {
		if !slices.Contains(c.Args, flag) {
			t.Errorf("args %v lack %s", c.Args, flag)
		}
	}
	for _, flag := range []string{"--no-inject", "--reclaim=false"} {
		if slices.Contains(c.Args, flag) {
			t.Errorf("args %v keep metrics mode's %s", c.Args, flag)
		}
	}
	checkArgs(t, c.Args)
	if len(pod.Volumes) != len(metrics.ds.Spec.Template.Spec.Volumes) ||
		slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.HostPath != nil }) {
		t.Errorf("volumes %+v: want metrics mode's emptyDirs, no hostPath (pods' files are read through /proc)", pod.Volumes)
	}
	if len(o.role.Rules) != 1 || !slices.Equal(o.role.Rules[0].Verbs, []string{"get", "list", "watch"}) {
		t.Errorf("ClusterRole rules %+v: notebooks mode needs no more of the API", o.role.Rules)
	}
	// Metrics mode is the default and grants nothing.
	if add := metrics.ds.Spec.Template.Spec.Containers[0].SecurityContext.Capabilities.Add; len(add) != 0 {
		t.Errorf("metrics mode adds capabilities %v", add)
	}
}

// The chart refuses a mode it does not know rather than guess.
func TestChartRefusesUnknownMode(t *testing.T) {
	cmd := exec.Command(helmPath(t), "template", "gpumem", chart, "--set", "mode=everything")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), `want "metrics"`) {
		t.Errorf("helm template with mode=everything: %v\n%s", err, out)
	}
}

// The checked-in manifests are the chart's rendering (check.sh keeps them
// so); decode them too, as users apply them without helm.
func TestPlainManifests(t *testing.T) {
	for _, f := range []string{"gpumem.yaml", "servicemonitor.yaml", "gpumem-notebooks.yaml"} {
		data, err := os.ReadFile(filepath.Join("../../deploy/kubernetes", f))
		if err != nil {
			t.Fatal(err)
		}
		if len(decodeAll(t, data)) == 0 {
			t.Errorf("%s holds no object", f)
		}
	}
	want := render(t)
	got, err := os.ReadFile("../../deploy/kubernetes/gpumem.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(got, want) {
		t.Error("deploy/kubernetes/gpumem.yaml is not the chart's rendering: run bash tests/kube/check.sh --update")
	}
	got, err = os.ReadFile("../../deploy/kubernetes/gpumem-notebooks.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(got, render(t, "--set", "mode=notebooks")) {
		t.Error("deploy/kubernetes/gpumem-notebooks.yaml is not the chart's notebooks rendering: run bash tests/kube/check.sh --update")
	}
}

// checkArgs: every flag the DaemonSet passes is one `gpumem serve` defines.
func checkArgs(t *testing.T, args []string) {
	t.Helper()
	if len(args) == 0 || args[0] != "serve" {
		t.Fatalf("args %v: want serve first", args)
	}
	// The image's binary: the one the DaemonSet runs.
	bin := filepath.Join(imageRootfs(t), "usr", "local", "bin", "gpumem")
	help, _ := exec.Command(bin, "serve", "--help").CombinedOutput()
	defined := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-(-?[a-z][a-z0-9-]*)`).FindAllStringSubmatch(string(help), -1) {
		defined[strings.TrimPrefix(m[1], "-")] = true
	}
	if !defined["kubernetes"] {
		t.Fatalf("gpumem serve --help lists no --kubernetes flag:\n%s", help)
	}
	for _, a := range args[1:] {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !defined[name] {
			t.Errorf("the DaemonSet passes %s, which gpumem serve does not define", a)
		}
	}
}
