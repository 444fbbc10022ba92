package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// apiServer answers what NodePods asks of an API server, in the API's
// JSON: the list of pods, then a watch stream fed by the test. Any request
// but a get, list or watch of pods restricted to node gpu-1, with the
// token, is an error the test reports. (client-go's fake clientset would
// do instead, but links every API group's types and fakes into the test:
// minutes of compiling on a 2-core CI machine.)
type apiServer struct {
	t      *testing.T
	srv    *httptest.Server
	events chan []byte

	mu       sync.Mutex
	pods     []corev1.Pod
	requests []string // "list" / "watch", in order; "refused" for each refused
	refuse   int      // while not 0, every request is answered with this status
	endWatch chan struct{}
}

const apiToken = "test-token"

func newAPIServer(t *testing.T, pods ...*corev1.Pod) *apiServer {
	a := &apiServer{t: t, events: make(chan []byte), endWatch: make(chan struct{})}
	for _, p := range pods {
		a.pods = append(a.pods, *p)
	}
	a.srv = httptest.NewServer(a)
	t.Cleanup(func() { a.srv.CloseClientConnections(); a.srv.Close() })
	return a
}

func (a *apiServer) client(t *testing.T) PodsClient {
	pods, err := NewRESTPods(&rest.Config{Host: a.srv.URL, BearerToken: apiToken})
	if err != nil {
		t.Fatal(err)
	}
	return pods
}

func (a *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if r.Method != http.MethodGet || r.URL.Path != "/api/v1/pods" || q.Get("fieldSelector") != "spec.nodeName=gpu-1" {
		a.t.Errorf("request outside get/list/watch of this node's pods: %s %s", r.Method, r.URL)
		http.Error(w, "unexpected", http.StatusBadRequest)
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+apiToken {
		a.t.Errorf("request without the token: %q", r.Header.Get("Authorization"))
	}
	w.Header().Set("Content-Type", "application/json")
	a.mu.Lock()
	refuse := a.refuse
	if refuse != 0 {
		a.requests = append(a.requests, "refused")
	}
	a.mu.Unlock()
	if refuse != 0 {
		w.WriteHeader(refuse)
		_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status: metav1.StatusFailure, Code: int32(refuse), Reason: metav1.StatusReasonUnauthorized, Message: "Unauthorized"})
		return
	}
	if q.Get("watch") != "true" {
		a.mu.Lock()
		a.requests = append(a.requests, "list")
		list := corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"},
			ListMeta: metav1.ListMeta{ResourceVersion: "10"}, Items: a.pods}
		a.mu.Unlock()
		if err := json.NewEncoder(w).Encode(list); err != nil {
			a.t.Error(err)
		}
		return
	}
	a.mu.Lock()
	a.requests = append(a.requests, "watch")
	a.mu.Unlock()
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	for {
		select {
		case ev := <-a.events:
			if _, err := w.Write(append(ev, '\n')); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		case <-a.endWatch:
			return
		case <-r.Context().Done():
			return
		}
	}
}

// sendRaw streams one watch event, as JSON.
func (a *apiServer) sendRaw(t *testing.T, ev string) {
	t.Helper()
	select {
	case a.events <- []byte(ev):
	case <-time.After(30 * time.Second):
		t.Fatal("the informer did not watch within 30s")
	}
}

// setRefuse makes the server answer every request with code (0: serve).
func (a *apiServer) setRefuse(code int) {
	a.mu.Lock()
	a.refuse = code
	a.mu.Unlock()
}

// count is how many requests of kind ("list", "watch", "refused") came.
func (a *apiServer) count(kind string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, r := range a.requests {
		if r == kind {
			n++
		}
	}
	return n
}

// send streams one watch event ("ADDED", "MODIFIED", "DELETED") to the
// informer's watch.
func (a *apiServer) send(t *testing.T, typ string, pod *corev1.Pod, resourceVersion int) {
	t.Helper()
	p := pod.DeepCopy()
	p.TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
	p.ResourceVersion = fmt.Sprint(resourceVersion)
	ev, err := json.Marshal(map[string]any{"type": typ, "object": p})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case a.events <- ev:
	case <-time.After(30 * time.Second):
		t.Fatal("the informer did not watch within 30s")
	}
}

// start runs NodePods against a new apiServer listing pods, and waits for
// its first list.
func start(t *testing.T, cfg Config, pods ...*corev1.Pod) (*NodePods, *apiServer) {
	t.Helper()
	api := newAPIServer(t, pods...)
	np, err := NewNodePods(api.client(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = np.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	syncCtx, syncCancel := context.WithTimeout(ctx, 30*time.Second)
	defer syncCancel()
	if !np.WaitForSync(syncCtx) {
		t.Fatal("informer did not sync within 30s")
	}
	return np, api
}
