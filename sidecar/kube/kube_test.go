package kube

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpumem/gpumem/internal/syncutil"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/cgroups"
	"github.com/gpumem/gpumem/sidecar/procs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	aliceUID  = "5b7e3c1a-2f4d-4e6b-9a8c-0d1e2f3a4b5c"
	bobUID    = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
	otherUID  = "11111111-2222-4333-8444-555555555555"
	aliceCtr  = "4f0d2e8a9b1c3d5e7f60718293a4b5c6d7e8f90123456789abcdef0123456789"
	sidecarID = "9a8b7c6d5e4f30211203a4b5c6d7e8f9a0b1c2d3e4f5061728394a5b6c7d8e9f"
)

func pod(name, ns, uid, node string, labels map[string]string, containers ...corev1.ContainerStatus) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID(uid), Labels: labels,
			Annotations:   map[string]string{"big": strings.Repeat("x", 1000)},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "notebook", Image: "jupyter/scipy"}}},
		Status: corev1.PodStatus{ContainerStatuses: containers},
	}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 30s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestNodePods(t *testing.T) {
	alice := pod("jupyter-alice", "jhub", aliceUID, "gpu-1",
		map[string]string{LabelHubUsername: "alice", LabelHubServerName: "big", "component": "singleuser-server"},
		corev1.ContainerStatus{Name: "notebook", ContainerID: "containerd://" + aliceCtr},
		corev1.ContainerStatus{Name: "sidecar", ContainerID: "containerd://" + sidecarID})
	bob := pod("jupyter-bob", "jhub", bobUID, "gpu-1", map[string]string{"team/owner": "bob"})
	// Pods of other nodes are left out by the API server, from the field
	// selector, which apiServer checks on every request.
	np, api := start(t, Config{NodeName: "gpu-1", UserLabels: []string{LabelHubUsername, "team/owner"}}, alice, bob)

	tests := []struct {
		name, uid, container string
		want                 attribution.Pod
		ok                   bool
	}{
		{"hub user, named server, container", aliceUID, aliceCtr,
			attribution.Pod{Name: "jupyter-alice", Namespace: "jhub", UID: aliceUID, Container: "notebook", User: "alice", Server: "big"}, true},
		{"second container", aliceUID, sidecarID,
			attribution.Pod{Name: "jupyter-alice", Namespace: "jhub", UID: aliceUID, Container: "sidecar", User: "alice", Server: "big"}, true},
		{"container not in status yet", aliceUID, strings.Repeat("a", 64),
			attribution.Pod{Name: "jupyter-alice", Namespace: "jhub", UID: aliceUID, User: "alice", Server: "big"}, true},
		{"user from the second configured label", bobUID, "",
			attribution.Pod{Name: "jupyter-bob", Namespace: "jhub", UID: bobUID, User: "bob"}, true},
		{"unknown pod", "ffffffff-ffff-4fff-8fff-ffffffffffff", "", attribution.Pod{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := np.Pod(tt.uid, tt.container)
			if ok != tt.ok || got != tt.want {
				t.Errorf("Pod(%s, %.8s) = %+v, %v; want %+v, %v", tt.uid, tt.container, got, ok, tt.want, tt.ok)
			}
		})
	}

	// The cache keeps only what gpumem reads.
	objs, err := np.informer.GetIndexer().ByIndex(uidIndex, aliceUID)
	if err != nil || len(objs) != 1 {
		t.Fatalf("index: %v, %d objects", err, len(objs))
	}
	if p := objs[0].(*corev1.Pod); len(p.Annotations) != 0 || len(p.ManagedFields) != 0 || len(p.Spec.Containers) != 0 {
		t.Errorf("cached pod not slimmed: %d annotations, %d managed fields, %d containers", len(p.Annotations), len(p.ManagedFields), len(p.Spec.Containers))
	}

	// Watch: a relabelled pod and a deleted pod are seen.
	bob.Labels = map[string]string{LabelHubUsername: "robert"}
	api.send(t, "MODIFIED", bob, 11)
	eventually(t, "relabelled pod seen", func() bool { p, _ := np.Pod(bobUID, ""); return p.User == "robert" })
	api.send(t, "DELETED", alice, 12)
	eventually(t, "deleted pod gone", func() bool { _, ok := np.Pod(aliceUID, ""); return !ok })
	carol := pod("jupyter-carol", "jhub", otherUID, "gpu-1", map[string]string{LabelHubUsername: "carol"})
	api.send(t, "ADDED", carol, 13)
	eventually(t, "added pod seen", func() bool { p, _ := np.Pod(otherUID, ""); return p.User == "carol" })

	api.mu.Lock()
	defer api.mu.Unlock()
	if len(api.requests) < 2 || api.requests[0] != "list" || api.requests[1] != "watch" {
		t.Errorf("requests %v, want a list then a watch", api.requests)
	}
}

// The API server's answers, each change said once: a watch expired (410
// Gone) and the pods listed again; a token refused (401), retried with
// back-off but logged once, the last list still naming pods; the token
// accepted again.
func TestNodePodsLogsAPIChanges(t *testing.T) {
	var logs syncutil.Buffer
	alice := pod("jupyter-alice", "jhub", aliceUID, "gpu-1", map[string]string{LabelHubUsername: "alice"})
	np, api := start(t, Config{NodeName: "gpu-1", Log: zerolog.New(&logs)}, alice)
	count := func(msg string) int { return strings.Count(logs.String(), `"message":"`+msg) }
	const (
		expired  = "the watch of this node's pods expired (410 Gone)"
		refused  = "the API server refuses this daemon's service account token (401 Unauthorized"
		accepted = "the API server accepts this daemon's service account again"
	)

	api.sendRaw(t, `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","code":410,"reason":"Expired","message":"too old resource version: 10 (20)"}}`)
	eventually(t, "a list after the expired watch", func() bool { return api.count("list") == 2 })
	eventually(t, "the expired watch logged", func() bool { return count(expired) == 1 })

	eventually(t, "the informer watching again", func() bool { return api.count("watch") == 2 })
	api.setRefuse(http.StatusUnauthorized)
	api.endWatch <- struct{}{}
	eventually(t, "refused requests", func() bool { return api.count("refused") >= 2 })
	if n := count(refused); n != 1 {
		t.Errorf("the refused token logged %d times, want once:\n%s", n, logs.String())
	}
	if p, ok := np.Pod(aliceUID, ""); !ok || p.User != "alice" {
		t.Errorf("refused: Pod(alice) = %+v, %v; want the last list's pod", p, ok)
	}

	api.setRefuse(0)
	eventually(t, "the token accepted again, logged", func() bool { return count(accepted) == 1 })
	if n := count(expired) + count(refused); n != 2 {
		t.Errorf("logs:\n%s", logs.String())
	}
}

func TestNewNodePodsNeedsNode(t *testing.T) {
	_, err := NewNodePods(newAPIServer(t).client(t), Config{})
	if err == nil || !strings.Contains(err.Error(), "NODE_NAME") {
		t.Errorf("NewNodePods without a node: %v; want an error saying what to set", err)
	}
}

// cgroupFiles is a cgroups.Reader over fixed contents; calls counts reads.
type cgroupFiles struct {
	mu    sync.Mutex
	files map[int]string
	calls int
}

func (c *cgroupFiles) Cgroup(pid int, _ uint64) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	s, ok := c.files[pid]
	if !ok {
		return nil, context.Canceled // any error: the process is gone
	}
	return []byte(s), nil
}

func TestResolver(t *testing.T) {
	alice := pod("jupyter-alice", "jhub", aliceUID, "gpu-1", map[string]string{LabelHubUsername: "alice"},
		corev1.ContainerStatus{Name: "notebook", ContainerID: "containerd://" + aliceCtr})
	np, _ := start(t, Config{NodeName: "gpu-1"}, alice)
	files := &cgroupFiles{files: map[int]string{
		// The kernel of alice's notebook, as the host's /proc shows it.
		100: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(aliceUID, "-", "_") + ".slice/cri-containerd-" + aliceCtr + ".scope\n",
		200: "0::/system.slice/cron.service\n",
		300: "0::/kubepods/besteffort/pod" + otherUID + "/" + sidecarID + "\n",
	}}
	r := NewResolver(files, np)
	var _ attribution.Pods = r
	var _ cgroups.Reader = &procs.FS{}

	got, ok := r.PodOf(100, 5)
	if want := (attribution.Pod{Name: "jupyter-alice", Namespace: "jhub", UID: aliceUID, Container: "notebook", User: "alice"}); !ok || got != want {
		t.Errorf("PodOf(kernel) = %+v, %v; want %+v", got, ok, want)
	}
	if _, ok := r.PodOf(200, 5); ok {
		t.Error("a host process has a pod")
	}
	if _, ok := r.PodOf(300, 5); ok {
		t.Error("a pod the API does not list was reported")
	}
	if _, ok := r.PodOf(400, 5); ok {
		t.Error("a vanished process has a pod")
	}
	before := files.calls
	r.PodOf(100, 5)
	if files.calls != before {
		t.Error("cgroup read again for a known process")
	}
	r.PodOf(100, 6) // the pid reused by another process
	if files.calls != before+1 {
		t.Error("cgroup not read for a new process with a reused pid")
	}
	for pid := range maxCached {
		r.PodOf(1000+pid, 1)
	}
	if len(r.cache) > maxCached {
		t.Errorf("cache holds %d entries, more than %d", len(r.cache), maxCached)
	}

	// AddPods puts the pod on the notebook of that kernel and on other processes.
	table := procs.NewTable([]procs.Proc{{PID: 100, StartTime: 5}, {PID: 200, StartTime: 5}})
	rep := attribution.Report{
		Notebooks: []attribution.Notebook{{KernelID: "k", PIDs: []int{100}}},
		Other:     []attribution.OtherProcess{{PID: 200}},
	}
	attribution.AddPods(&rep, table, r)
	if rep.Notebooks[0].Pod == nil || rep.Notebooks[0].Pod.User != "alice" {
		t.Errorf("notebook pod = %+v", rep.Notebooks[0].Pod)
	}
	if rep.Other[0].Pod != nil {
		t.Errorf("host process pod = %+v", rep.Other[0].Pod)
	}
}
