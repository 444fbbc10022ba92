package kube

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/gpumem/gpumem/internal/testenv"
)

const (
	node      = "gpu-1"
	otherNode = "gpu-2"
	// What the daemon sends as its user agent (sidecar/kube), which the
	// audit log is searched by.
	daemonAgent = "gpumem"
)

// TestChartOnAPIServer installs the chart as a cluster admin does, into a
// real API server (etcd and kube-apiserver, built from their modules),
// then runs the image's daemon with a token of the chart's own service
// account, and checks through the API server's own answers and audit log:
//
//   - every rendered object passes the API server's validation (helm
//     install --dry-run=server, then the real install, with no warning of
//     an unknown field), the ServiceMonitor against the prometheus-operator
//     release's CRD;
//   - the service account may list and watch pods, and is refused (403)
//     everything else: secrets, writes to pods, their logs and exec,
//     nodes, other kinds, minting tokens;
//   - the daemon asks only for this node's pods;
//   - pods created, relabelled and deleted through the API reach its
//     /metrics within seconds, their processes in cgroups named as
//     containerd's cgroupfs and systemd drivers name them; a pod of another
//     node whose process is here is never named;
//   - the API server restarted under it with etcd compacted meanwhile (its
//     watch expired: 410 Gone): it lists again and serves the last list
//     meanwhile, no scrape ever missing a pod;
//   - its token revoked (its service account deleted) and its connection
//     broken: it says so in one log line and keeps naming pods from the
//     last list.
//
// The daemon reaches the API server through a stand-in for the kubernetes
// Service (serviceProxy), which routes to a restarted API server once it
// is ready, as the Service's endpoints do.
func TestChartOnAPIServer(t *testing.T) {
	if testenv.CurrentStack() != testenv.Debian12 {
		t.Skip("needs no Jupyter stack: runs once, in the debian12 stack's pass")
	}
	testenv.RequireRoot(t, "unshare, chroot and creating cgroups need root")
	tools := findControlPlaneTools(t)
	helm := helmPath(t)
	start := time.Now()
	rootfs := imageRootfs(t)
	t.Logf("the image's rootfs built in %v", time.Since(start).Round(time.Millisecond))
	start = time.Now()
	cp := startControlPlane(t, tools)
	t.Logf("etcd and kube-apiserver %s ready in %v", tools.kubeVersion, time.Since(start).Round(time.Millisecond))

	// The ServiceMonitor's CRD, as the operator's release ships it.
	crdYAML, err := os.ReadFile(tools.serviceMonitorCRD)
	if err != nil {
		t.Fatal(err)
	}
	cp.must(http.MethodPost, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", yamlToJSON(t, crdYAML), nil)
	testenv.Poll(t, 30*time.Second, "the ServiceMonitor CRD served", func() bool {
		var res metav1.APIResourceList
		code, _ := cp.do("", http.MethodGet, "/apis/monitoring.coreos.com/v1", nil, &res)
		for _, r := range res.APIResources {
			if code == http.StatusOK && r.Name == "servicemonitors" {
				return true
			}
		}
		return false
	})
	// What the admin (and, for jhub, Zero to JupyterHub) creates first. No
	// controller manager runs to make a namespace's default service account.
	for _, ns := range []string{"gpumem", "gpumem-nb", "jhub"} {
		cp.must(http.MethodPost, "/api/v1/namespaces", &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, nil)
	}
	cp.must(http.MethodPost, "/api/v1/namespaces/jhub/serviceaccounts", &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, nil)

	runHelm := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		home := t.TempDir()
		cmd := exec.CommandContext(ctx, helm, append(args, "--kubeconfig", cp.Kubeconfig)...)
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
			"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
		}
		// The API server warns of a field it does not know (and drops it).
		if s := stderr.String(); strings.Contains(s, "unknown field") || strings.Contains(s, "Warning") {
			t.Errorf("helm %s: the API server warns:\n%s", strings.Join(args, " "), s)
		}
		return stdout.String()
	}
	// Every object both modes render, validated by the API server as it
	// would create it (a dry run), strictly: a field it does not know is
	// an error, not a warning.
	start = time.Now()
	for _, mode := range [][]string{{"--set", "serviceMonitor.enabled=true"}, {"--set", "mode=notebooks"}} {
		for _, obj := range renderedObjects(t, render(t, mode...)) {
			if code, body := cp.do("", http.MethodPost, obj.collection+"?dryRun=All&fieldValidation=Strict", obj.json, nil); code != http.StatusCreated {
				t.Errorf("%v: %s %s: the API server answers %d %s", mode, obj.kind, obj.name, code, body)
			}
		}
	}
	// The API server, not helm, refuses what its validation refuses.
	for _, obj := range renderedObjects(t, render(t, "--set", "metrics.port=70000")) {
		if obj.kind != "DaemonSet" {
			continue
		}
		if code, body := cp.do("", http.MethodPost, obj.collection+"?dryRun=All&fieldValidation=Strict", obj.json, nil); code != http.StatusUnprocessableEntity ||
			!strings.Contains(string(body), "must be between 1 and 65535") {
			t.Errorf("a DaemonSet with metrics.port=70000: the API server answers %d %s, want 422 naming the port's range", code, body)
		}
	}
	runHelm("install", "gpumem", chart, "--namespace", "gpumem", "--set", "serviceMonitor.enabled=true")
	t.Logf("every object of both modes validated (dry run) and helm install in %v", time.Since(start).Round(time.Millisecond))

	// Every object of the release is in the API server, as rendered.
	manifest := runHelm("get", "manifest", "gpumem", "--namespace", "gpumem")
	kinds := map[string]bool{}
	for _, obj := range renderedObjects(t, []byte(manifest)) {
		kinds[obj.kind] = true
		var got metav1.PartialObjectMetadata
		cp.must(http.MethodGet, obj.collection+"/"+obj.name, nil, &got)
		if got.Labels["app.kubernetes.io/managed-by"] != "Helm" {
			t.Errorf("%s %s in the API server: labels %v", obj.kind, obj.name, got.Labels)
		}
	}
	if len(kinds) != len(collections) {
		t.Errorf("the release holds %v, want every one of %d kinds", kinds, len(collections))
	}

	// The chart's service account, as the kubelet would give it to the
	// DaemonSet's pod: a bound token from the TokenRequest API.
	ds := collect(t, decodeAll(t, render(t))).ds
	sa := ds.Spec.Template.Spec.ServiceAccountName
	saUser := "system:serviceaccount:gpumem:" + sa
	var tr struct {
		Status struct {
			Token string `json:"token"`
		} `json:"status"`
	}
	cp.must(http.MethodPost, "/api/v1/namespaces/gpumem/serviceaccounts/"+sa+"/token",
		map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": map[string]any{"expirationSeconds": 3600}}, &tr)
	token := tr.Status.Token

	checkRBAC(t, cp, token, saUser)

	// The daemon, before any pod: three GPU processes, each to be put in a
	// pod's cgroup once the API server has given the pod its UID.
	sleepers := make([]*exec.Cmd, 3)
	for i := range sleepers {
		sleepers[i] = exec.Command("sleep", "3600")
		if err := sleepers[i].Start(); err != nil {
			t.Fatal(err)
		}
		s := sleepers[i]
		t.Cleanup(func() { _ = s.Process.Kill(); _ = s.Wait() })
	}
	gpu := testenv.SimGPU{Name: "Simulated H200", UUID: "GPU-1", MemoryTotalBytes: 141 << 30}
	d := startImageDaemon(t, rootfs, cp.Service.URL(), cp.CA, token, node, gpu)
	scrape := metricsScraper(d.metricsPort)
	d.poll(t, 60*time.Second, "the daemon's first list of pods", func() bool {
		return countLogs(d.logs.String(), "watching this node's pods") == 1
	})

	// Pods as KubeSpawner makes them, bound to nodes as the scheduler
	// binds them, their status as the kubelet reports it.
	type played struct {
		name, uid, container string
		pid                  int
		used                 uint64
	}
	var procs []testenv.FakeProc
	createPod := func(name, nodeName, user, server string, sleeper *exec.Cmd, used uint64, systemd bool) played {
		t.Helper()
		var pod corev1.Pod
		cp.must(http.MethodPost, "/api/v1/namespaces/jhub/pods", &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
				"hub.jupyter.org/username": user, "hub.jupyter.org/servername": server, "component": "singleuser-server"},
				Annotations: map[string]string{"hub.jupyter.org/username": user}},
			Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "notebook", Image: "quay.io/jupyter/base-notebook"}}},
		}, &pod)
		p := played{name: name, uid: string(pod.UID), container: randomHex(t, 32), pid: sleeper.Process.Pid, used: used}
		// The cgroup the kubelet makes for a besteffort pod's container,
		// named as each cgroup driver names it.
		rel := filepath.Join("/kubepods", "besteffort", "pod"+p.uid, p.container)
		if systemd {
			rel = filepath.Join("/kubepods.slice", "kubepods-besteffort.slice",
				"kubepods-besteffort-pod"+strings.ReplaceAll(p.uid, "-", "_")+".slice", "cri-containerd-"+p.container+".scope")
		}
		moveToCgroup(t, testCgroup(t, rel), p.pid)
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "notebook", ContainerID: "containerd://" + p.container, Ready: true,
			Image: "quay.io/jupyter/base-notebook", ImageID: "quay.io/jupyter/base-notebook@sha256:" + randomHex(t, 32)}}}
		cp.must(http.MethodPut, "/api/v1/namespaces/jhub/pods/"+name+"/status", &pod, nil)
		procs = append(procs, testenv.FakeProc{PID: p.pid, UsedBytes: used})
		gpu.Processes = procs
		d.setGPUs(t, gpu)
		return p
	}
	series := func(p played, user string) string {
		return fmt.Sprintf(`gpumem_pod_gpu_memory_bytes{container="notebook",gpu="0",kernel_id="",namespace="jhub",notebook="",pod=%q,user=%q} %g`,
			p.name, user, float64(p.used))
	}
	// within waits (10 s) for /metrics to show (or, with absent, to lack)
	// line, and returns how long that took.
	within := func(what, line string, absent bool) time.Duration {
		t.Helper()
		start := time.Now()
		var body string
		if !testenv.Eventually(10*time.Second, func() bool {
			body, _ = scrape()
			return strings.Contains(body, line) != absent
		}) {
			t.Fatalf("%s: after 10s /metrics (present %v) lacks\n%s\n/metrics:\n%s\ndaemon log:\n%s", what, !absent, line, body, d.logs.String())
		}
		took := time.Since(start)
		t.Logf("%s: in the daemon's /metrics after %v", what, took.Round(time.Millisecond))
		return took
	}

	alice := createPod("jupyter-alice", node, "alice", "", sleepers[0], 3<<30, false)
	within("a pod created (cgroupfs driver)", series(alice, "alice"), false)
	bob := createPod("jupyter-bob--big", node, "bob", "big", sleepers[1], 7<<30, true)
	within("a pod created (systemd driver)", series(bob, "bob"), false)
	// A pod of another node whose process this node's GPU lists: only
	// this node's pods are the daemon's to name.
	eve := createPod("jupyter-eve", otherNode, "eve", "", sleepers[2], 1<<30, false)

	cp.must(http.MethodPatch, "/api/v1/namespaces/jhub/pods/"+alice.name,
		map[string]any{"metadata": map[string]any{"labels": map[string]string{"hub.jupyter.org/username": "alice-renamed"}}}, nil)
	within("a pod relabelled", series(alice, "alice-renamed"), false)
	// At once, as the kubelet confirms a graceful deletion: none runs here.
	cp.must(http.MethodDelete, "/api/v1/namespaces/jhub/pods/"+alice.name+"?gracePeriodSeconds=0", nil, nil)
	within("a pod deleted", `pod="jupyter-alice"`, true)
	// Eve's process is in the daemon's report by now, and in no pod.
	d.poll(t, 10*time.Second, "eve's process in gpumem ls --json", func() bool {
		for _, o := range d.ls(t, rootfs).Other {
			if o.PID == eve.pid {
				if o.Pod != nil {
					t.Fatalf("the daemon names %+v, a pod of node %s", *o.Pod, otherNode)
				}
				return true
			}
		}
		return false
	})
	if body, _ := scrape(); strings.Contains(body, `pod="`+eve.name+`"`) {
		t.Errorf("the daemon names %s, a pod of node %s:\n%s", eve.name, otherNode, body)
	}

	// From here on, every scrape must name bob's pod: through the API
	// server's restart and the expired watch, then the revoked token.
	watchCtx, stopWatching := context.WithCancel(context.Background())
	var scrapes, missed int
	var missedBody string
	var wg sync.WaitGroup
	wg.Go(func() {
		for watchCtx.Err() == nil {
			if body, err := scrape(); err == nil {
				scrapes++
				if !strings.Contains(body, series(bob, "bob")) {
					missed++
					missedBody = body
				}
			}
			select {
			case <-watchCtx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	stopScraping := func() {
		stopWatching()
		wg.Wait()
		if missed > 0 || scrapes == 0 {
			t.Errorf("%d of %d scrapes lack bob's pod; the last one:\n%s", missed, scrapes, missedBody)
		}
		t.Logf("%d scrapes, each naming bob's pod", scrapes)
	}
	defer func() { stopWatching(); wg.Wait() }()

	// The API server restarted, etcd compacted while it was down: the
	// daemon's watch cannot resume (410 Gone) and it lists again.
	start = time.Now()
	cp.restartAPIServer(func() { cp.compactEtcd() })
	restarted := time.Now()
	const expiredMsg = "the watch of this node's pods expired (410 Gone): listed them again; the last list served meanwhile"
	d.poll(t, 60*time.Second, "the daemon's new list after its watch expired", func() bool {
		return countLogs(d.logs.String(), expiredMsg) == 1
	})
	t.Logf("API server restarted in %v; the daemon listed again %v after", restarted.Sub(start).Round(time.Millisecond), time.Since(restarted).Round(time.Millisecond))
	cp.must(http.MethodPatch, "/api/v1/namespaces/jhub/pods/"+bob.name,
		map[string]any{"metadata": map[string]any{"labels": map[string]string{"hub.jupyter.org/servername": "bigger"}}}, nil)
	// The watch resumed: a change made after the restart arrives.
	d.poll(t, 10*time.Second, "the relabelled server name in gpumem ls --json", func() bool {
		return lsPodServer(t, d, rootfs, bob.uid) == "bigger"
	})

	// The token revoked: its service account deleted. The open watch
	// outlives it; once its connection breaks (here through the Service),
	// the daemon asks again, and is refused.
	start = time.Now()
	cp.must(http.MethodDelete, "/api/v1/namespaces/gpumem/serviceaccounts/"+sa, nil, nil)
	// The authenticator learns of it through its cache of service accounts.
	testenv.Poll(t, 10*time.Second, "the revoked token refused", func() bool {
		code, _ := cp.do(token, http.MethodGet, "/api/v1/pods?fieldSelector="+url.QueryEscape("spec.nodeName="+node), nil, nil)
		return code == http.StatusUnauthorized
	})
	cp.Service.down()
	cp.Service.up()
	const refusedMsg = "the API server refuses this daemon's service account token (401 Unauthorized: expired or revoked): the pods of its last list stay named until it is accepted again"
	// Its watch, then its list: each refused, each retried after a
	// back-off that its earlier retries (the restart's) have grown.
	d.poll(t, 2*time.Minute, "the daemon's refused requests", func() bool {
		refused := 0
		for _, e := range cp.auditOf(daemonAgent) {
			if e.ResponseStatus.Code == http.StatusUnauthorized {
				refused++
			}
		}
		return refused >= 2
	})
	t.Logf("the revoked token refused twice %v after the service account's deletion", time.Since(start).Round(time.Millisecond))
	stopScraping()
	logs := d.logs.String()
	if n := countLogs(logs, refusedMsg); n != 1 {
		t.Errorf("the daemon said %d times that its token is refused, want once:\n%s", n, logs)
	}
	unauthorized := 0
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "Unauthorized") {
			unauthorized++
		}
	}
	if unauthorized != 1 {
		t.Errorf("%d lines of the daemon's log name Unauthorized, want one:\n%s", unauthorized, logs)
	}

	// What the daemon asked, from the API server's audit log: lists and
	// watches of this node's pods, nothing else.
	var lists, watches int
	for _, e := range cp.auditOf(daemonAgent) {
		u, err := url.Parse(e.RequestURI)
		if err != nil {
			t.Fatal(err)
		}
		if u.Path != "/api/v1/pods" || u.Query().Get("fieldSelector") != "spec.nodeName="+node || (e.Verb != "list" && e.Verb != "watch") {
			t.Errorf("the daemon asked %s %s", e.Verb, e.RequestURI)
		}
		if e.ResponseStatus.Code == http.StatusUnauthorized {
			continue
		}
		if e.User.Username != saUser {
			t.Errorf("the daemon's %s %s: as %q, want %s", e.Verb, e.RequestURI, e.User.Username, saUser)
		}
		switch e.Verb {
		case "list":
			lists++
		case "watch":
			watches++
		}
	}
	if lists < 2 || watches < 2 {
		t.Errorf("the daemon listed %d times and watched %d times, want a list and a watch before the restart and after", lists, watches)
	}
}

// checkRBAC asserts, from the API server's answers to the service
// account's token, what the chart grants it (to get, list and watch pods)
// and that it is forbidden the rest. RBAC cannot restrict a list by field
// selector: the grant covers every node's pods, and the daemon's own
// restriction to its node is checked from its requests.
func checkRBAC(t *testing.T, cp *controlPlane, token, user string) {
	t.Helper()
	sel := "?fieldSelector=" + url.QueryEscape("spec.nodeName="+node)
	pod := map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "x"},
		"spec": map[string]any{"containers": []any{map[string]any{"name": "c", "image": "i"}}}}
	for _, c := range []struct {
		what, method, path string
		body               any
		want               int
	}{
		{"list this node's pods", http.MethodGet, "/api/v1/pods" + sel, nil, http.StatusOK},
		{"watch this node's pods", http.MethodGet, "/api/v1/pods" + sel + "&watch=true&timeoutSeconds=1", nil, http.StatusOK},
		{"list every pod (RBAC has no field selectors)", http.MethodGet, "/api/v1/pods", nil, http.StatusOK},
		{"get a pod (none by that name)", http.MethodGet, "/api/v1/namespaces/jhub/pods/x", nil, http.StatusNotFound},
		{"list secrets", http.MethodGet, "/api/v1/secrets", nil, http.StatusForbidden},
		{"list its own namespace's secrets", http.MethodGet, "/api/v1/namespaces/gpumem/secrets", nil, http.StatusForbidden},
		{"get a secret", http.MethodGet, "/api/v1/namespaces/jhub/secrets/hub", nil, http.StatusForbidden},
		{"list configmaps", http.MethodGet, "/api/v1/configmaps", nil, http.StatusForbidden},
		{"list nodes", http.MethodGet, "/api/v1/nodes", nil, http.StatusForbidden},
		{"create a pod", http.MethodPost, "/api/v1/namespaces/jhub/pods", pod, http.StatusForbidden},
		{"relabel a pod", http.MethodPatch, "/api/v1/namespaces/jhub/pods/x", map[string]any{"metadata": map[string]any{"labels": map[string]string{"a": "b"}}}, http.StatusForbidden},
		{"delete a pod", http.MethodDelete, "/api/v1/namespaces/jhub/pods/x", nil, http.StatusForbidden},
		{"delete every pod", http.MethodDelete, "/api/v1/namespaces/jhub/pods", nil, http.StatusForbidden},
		{"write a pod's status", http.MethodPut, "/api/v1/namespaces/jhub/pods/x/status", pod, http.StatusForbidden},
		{"evict a pod", http.MethodPost, "/api/v1/namespaces/jhub/pods/x/eviction", map[string]any{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": map[string]any{"name": "x"}}, http.StatusForbidden},
		{"read a pod's log", http.MethodGet, "/api/v1/namespaces/jhub/pods/x/log", nil, http.StatusForbidden},
		{"exec in a pod", http.MethodPost, "/api/v1/namespaces/jhub/pods/x/exec?command=sh&stdout=true", nil, http.StatusForbidden},
		{"list daemonsets", http.MethodGet, "/apis/apps/v1/daemonsets", nil, http.StatusForbidden},
		{"list servicemonitors", http.MethodGet, "/apis/monitoring.coreos.com/v1/servicemonitors", nil, http.StatusForbidden},
		{"mint a token of its own account", http.MethodPost, "/api/v1/namespaces/gpumem/serviceaccounts/gpumem/token", map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": map[string]any{}}, http.StatusForbidden},
		{"bind itself a role", http.MethodPost, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": map[string]any{"name": "x"}, "roleRef": map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"}, "subjects": []any{map[string]any{"kind": "User", "name": user}}}, http.StatusForbidden},
	} {
		code, body := cp.do(token, c.method, c.path, c.body, nil)
		if code != c.want {
			t.Errorf("%s (%s %s) as %s: %d, want %d\n%s", c.what, c.method, c.path, user, code, c.want, body)
			continue
		}
		if c.want == http.StatusForbidden {
			var status metav1.Status
			if err := json.Unmarshal(body, &status); err != nil || status.Reason != metav1.StatusReasonForbidden || !strings.Contains(status.Message, `User "`+user+`"`) {
				t.Errorf("%s: the 403 does not name %s: %s", c.what, user, body)
			}
		}
	}
}

// collections is where the API serves each kind the chart renders (in
// namespace gpumem for the namespaced ones).
var collections = map[string]string{
	"ServiceAccount":     "/api/v1/namespaces/gpumem/serviceaccounts",
	"Service":            "/api/v1/namespaces/gpumem/services",
	"DaemonSet":          "/apis/apps/v1/namespaces/gpumem/daemonsets",
	"ClusterRole":        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
	"ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
	"ServiceMonitor":     "/apis/monitoring.coreos.com/v1/namespaces/gpumem/servicemonitors",
}

// renderedObject is one object of a rendered chart, as JSON, and the
// collection the API serves it in.
type renderedObject struct {
	kind, name, collection string
	json                   json.RawMessage
}

func renderedObjects(t *testing.T, manifest []byte) []renderedObject {
	t.Helper()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	var objs []renderedObject
	for {
		doc, err := reader.Read()
		if err == io.EOF {
			return objs
		}
		if err != nil {
			t.Fatal(err)
		}
		data := yamlToJSON(t, doc)
		var obj metav1.PartialObjectMetadata
		if err := json.Unmarshal(data, &obj); err != nil {
			t.Fatal(err)
		}
		if obj.Kind == "" {
			continue // a document of comments only
		}
		collection, ok := collections[obj.Kind]
		if !ok {
			t.Fatalf("the chart renders a %s: the test does not know where the API serves it", obj.Kind)
		}
		objs = append(objs, renderedObject{kind: obj.Kind, name: obj.Name, collection: collection, json: data})
	}
}

// metricsScraper returns a function that reads the daemon's /metrics.
func metricsScraper(port int) func() (string, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	return func() (string, error) {
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
}

// lsPodServer is the JupyterHub server name `gpumem ls --json`, run in the
// daemon's container, gives the pod with uid ("" for none).
func lsPodServer(t *testing.T, d *imageDaemon, rootfs, uid string) string {
	t.Helper()
	rep := d.ls(t, rootfs)
	for _, o := range rep.Other {
		if o.Pod != nil && o.Pod.UID == uid {
			return o.Pod.Server
		}
	}
	return ""
}

// poll is testenv.Poll, with the daemon's log when it times out.
func (d *imageDaemon) poll(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !testenv.Eventually(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s; the daemon's log:\n%s", timeout, what, d.logs.String())
	}
}

// countLogs counts the daemon's JSON log lines whose message is msg.
func countLogs(logs, msg string) int {
	n := 0
	for _, line := range strings.Split(logs, "\n") {
		if logContains(line, msg) {
			n++
		}
	}
	return n
}
