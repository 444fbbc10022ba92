package kube

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

// apiServer serves what an API server answers to NewRESTPods: a list of
// pods, then a watch stream, both only for the field selector of node
// gpu-1; anything else is an error the test reports.
type apiServer struct {
	t      *testing.T
	events chan []byte // watch events to stream
	mu     sync.Mutex
	seen   []string // "list" / "watch", in order
}

func (a *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if r.Method != http.MethodGet || r.URL.Path != "/api/v1/pods" || q.Get("fieldSelector") != "spec.nodeName=gpu-1" {
		a.t.Errorf("unexpected request %s %s", r.Method, r.URL)
		http.Error(w, "unexpected", http.StatusBadRequest)
		return
	}
	if r.Header.Get("Authorization") != "Bearer test-token" {
		a.t.Errorf("request without the service account's token: %q", r.Header.Get("Authorization"))
	}
	w.Header().Set("Content-Type", "application/json")
	if q.Get("watch") != "true" {
		a.record("list")
		list := corev1.PodList{
			TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"},
			ListMeta: metav1.ListMeta{ResourceVersion: "10"},
			Items: []corev1.Pod{*pod("jupyter-alice", "jhub", aliceUID, "gpu-1",
				map[string]string{LabelHubUsername: "alice"},
				corev1.ContainerStatus{Name: "notebook", ContainerID: "cri-o://" + aliceCtr})},
		}
		if err := json.NewEncoder(w).Encode(list); err != nil {
			a.t.Error(err)
		}
		return
	}
	a.record("watch")
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	for {
		select {
		case ev := <-a.events:
			if _, err := w.Write(append(ev, '\n')); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		case <-r.Context().Done():
			return
		}
	}
}

func (a *apiServer) record(s string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seen = append(a.seen, s)
}

// TestRESTPods runs NodePods over NewRESTPods against an HTTP server
// speaking the API's JSON: the list fills the cache, a watch event
// updates it.
func TestRESTPods(t *testing.T) {
	api := &apiServer{t: t, events: make(chan []byte)}
	srv := httptest.NewServer(api)
	defer srv.Close()
	defer srv.CloseClientConnections()

	pods, err := NewRESTPods(&rest.Config{Host: srv.URL, BearerToken: "test-token"})
	if err != nil {
		t.Fatal(err)
	}
	np, err := NewNodePods(pods, Config{NodeName: "gpu-1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = np.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	syncCtx, syncCancel := context.WithTimeout(ctx, 30*time.Second)
	defer syncCancel()
	if !np.WaitForSync(syncCtx) {
		t.Fatal("no sync within 30s")
	}
	got, ok := np.Pod(aliceUID, aliceCtr)
	if want := (attribution.Pod{Name: "jupyter-alice", Namespace: "jhub", UID: aliceUID, Container: "notebook", User: "alice"}); !ok || got != want {
		t.Errorf("Pod = %+v, %v; want %+v", got, ok, want)
	}

	bob := pod("jupyter-bob", "jhub", bobUID, "gpu-1", map[string]string{LabelHubUsername: "bob"})
	bob.TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
	bob.ResourceVersion = "11"
	ev, err := json.Marshal(map[string]any{"type": "ADDED", "object": bob})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case api.events <- ev:
	case <-time.After(30 * time.Second):
		t.Fatal("the informer did not watch within 30s")
	}
	eventually(t, "watched pod in the cache", func() bool { p, _ := np.Pod(bobUID, ""); return p.User == "bob" })
	api.mu.Lock()
	defer api.mu.Unlock()
	if len(api.seen) < 2 || api.seen[0] != "list" || api.seen[1] != "watch" {
		t.Errorf("requests %v, want a list then a watch", api.seen)
	}
}
