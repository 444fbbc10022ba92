// Package kube owns gpumem's view of the Kubernetes API: the pods of this
// node, kept by one informer that lists and watches only pods whose
// spec.nodeName is this node (RBAC: get, list and watch on pods, nothing
// else), and the answer to "which pod, container and JupyterHub user does
// this process belong to", from the process's cgroup (package cgroups)
// and the pod's metadata.
//
// What the API server's answers change it says in one log line each: the
// token or RBAC refused (the last list keeps serving), accepted again, a
// watch expired and the pods listed again.
//
// It is the only package that imports client-go. Callers take its answers
// through attribution.Pods, so the daemon, attribution, the API and the
// metrics stay free of Kubernetes types. It never writes to the API server
// and never reads anything but pods.
package kube

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/cgroups"
)

// Labels KubeSpawner (Zero to JupyterHub) puts on a user's pod.
const (
	LabelHubUsername   = "hub.jupyter.org/username"
	LabelHubServerName = "hub.jupyter.org/servername"
)

// Config says which pods to watch and where users come from.
type Config struct {
	// NodeName is this node's name (the DaemonSet passes spec.nodeName
	// through the downward API). Required: without it the informer would
	// cache every pod of the cluster.
	NodeName string
	// UserLabels are the pod labels that name the pod's user, tried in
	// order; empty means LabelHubUsername.
	UserLabels []string
	// ServerLabels name the JupyterHub named server; empty means
	// LabelHubServerName.
	ServerLabels []string
	// Resync is the informer's resync period; 0 means none (the watch
	// keeps the cache current).
	Resync time.Duration
	// Log gets one line for each change in what the API server answers;
	// the zero Logger logs nothing.
	Log zerolog.Logger
}

// NodePods keeps this node's pods, indexed by UID.
type NodePods struct {
	cfg      Config
	informer cache.SharedIndexInformer
	api      apiState
}

// apiState is what the API server last answered the informer, so that
// each change is logged once: a refused token is retried every few seconds
// for as long as it stays refused, and must not log every time.
type apiState struct {
	mu      sync.Mutex
	lists   int    // lists answered
	refused string // why the last list or watch was refused; "" if it was not
	expired bool   // the last watch expired (410 Gone): the next list says so
}

const uidIndex = "uid"

// PodsClient lists and watches pods: InCluster's REST client, or
// client-go's typed PodInterface (a fake clientset's CoreV1().Pods("") in
// tests). NewNodePods asks for pods of all namespaces, restricted to the
// node by a field selector.
//
// A PodsClient that cannot stream a list as watch events (client-go's fake
// clientset cannot) says so with IsWatchListSemanticsUnSupported() bool,
// as client-go's own clients do.
type PodsClient interface {
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// NewNodePods prepares an informer on the pods of cfg.NodeName; Run starts
// it.
func NewNodePods(pods PodsClient, cfg Config) (*NodePods, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("kubernetes: no node name: set NODE_NAME from the downward API (spec.nodeName) or pass --node-name")
	}
	if len(cfg.UserLabels) == 0 {
		cfg.UserLabels = []string{LabelHubUsername}
	}
	if len(cfg.ServerLabels) == 0 {
		cfg.ServerLabels = []string{LabelHubServerName}
	}
	selector := fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
	n := &NodePods{cfg: cfg}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = selector
			list, err := pods.List(ctx, opts)
			if err == nil {
				n.listed(len(list.Items))
			}
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = selector
			w, err := pods.Watch(ctx, opts)
			if err != nil {
				return nil, err
			}
			return newNotedWatch(w, n.watchEvent), nil
		},
	}
	// The wrapper lets a client that cannot stream a list as watch events
	// say so, as client-go's generated informers do.
	inf := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, pods), &corev1.Pod{}, cache.SharedIndexInformerOptions{
		ResyncPeriod:      cfg.Resync,
		ObjectDescription: "pods on node " + cfg.NodeName,
		Indexers: cache.Indexers{uidIndex: func(obj any) ([]string, error) {
			pod, ok := obj.(*corev1.Pod)
			if !ok {
				return nil, nil
			}
			return []string{string(pod.UID)}, nil
		}},
	})
	// Keep only what gpumem reads: a node's pods carry specs, managed
	// fields and annotations that would otherwise sit in memory.
	if err := inf.SetTransform(slim); err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	if err := inf.SetWatchErrorHandlerWithContext(n.watchError); err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	n.informer = inf
	return n, nil
}

// watchError is told why a list or watch failed. A refusal (401: the token
// is expired or revoked; 403: RBAC) is logged when it starts, not at each
// retry; the cache keeps the last list meanwhile, so processes are still
// named from their cgroups' pods. Anything else goes to client-go's own
// handler.
func (n *NodePods) watchError(ctx context.Context, r *cache.Reflector, err error) {
	var why string
	switch {
	case apierrors.IsUnauthorized(err):
		why = "the API server refuses this daemon's service account token (401 Unauthorized: expired or revoked)"
	case apierrors.IsForbidden(err):
		why = "RBAC forbids this daemon's service account to list and watch pods (403 Forbidden)"
	case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
		n.api.mu.Lock()
		n.api.expired = true
		n.api.mu.Unlock()
		return
	default:
		cache.DefaultWatchErrorHandler(ctx, r, err)
		return
	}
	n.api.mu.Lock()
	first := n.api.refused == ""
	n.api.refused = why
	n.api.mu.Unlock()
	if first {
		n.cfg.Log.Error().Err(err).Str("node", n.cfg.NodeName).
			Msg(why + ": the pods of its last list stay named until it is accepted again")
	}
}

// watchEvent notes a watch that the API server ended as expired (410
// Gone: etcd compacted past it, or a restarted API server no longer holds
// it), which the informer answers with a new list.
func (n *NodePods) watchEvent(e watch.Event) {
	if e.Type != watch.Error {
		return
	}
	if status, ok := e.Object.(*metav1.Status); ok && status.Code == 410 {
		n.api.mu.Lock()
		n.api.expired = true
		n.api.mu.Unlock()
	}
}

// listed is told of each list the API server answered.
func (n *NodePods) listed(pods int) {
	n.api.mu.Lock()
	n.api.lists++
	lists, refused, expired := n.api.lists, n.api.refused, n.api.expired
	n.api.refused, n.api.expired = "", false
	n.api.mu.Unlock()
	switch {
	case refused != "":
		n.cfg.Log.Info().Str("node", n.cfg.NodeName).Int("pods", pods).
			Msg("the API server accepts this daemon's service account again: this node's pods listed")
	case expired && lists > 1:
		n.cfg.Log.Info().Str("node", n.cfg.NodeName).Int("pods", pods).
			Msg("the watch of this node's pods expired (410 Gone): listed them again; the last list served meanwhile")
	}
}

// notedWatch passes a watch's events on, showing each to note first. Its
// goroutine ends when the watch does or when the informer stops it, even
// if nothing reads its events any more.
type notedWatch struct {
	in   watch.Interface
	out  chan watch.Event
	done chan struct{}
	once sync.Once
}

func newNotedWatch(in watch.Interface, note func(watch.Event)) *notedWatch {
	w := &notedWatch{in: in, out: make(chan watch.Event), done: make(chan struct{})}
	go func() {
		defer close(w.out)
		for e := range in.ResultChan() {
			note(e)
			select {
			case w.out <- e:
			case <-w.done:
				return
			}
		}
	}()
	return w
}

func (w *notedWatch) ResultChan() <-chan watch.Event { return w.out }

func (w *notedWatch) Stop() {
	w.once.Do(func() { close(w.done) })
	w.in.Stop()
}

// slim keeps a pod's identity, labels and container statuses.
func slim(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone: the informer handles it
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID,
			Labels: pod.Labels, ResourceVersion: pod.ResourceVersion,
		},
		Spec: corev1.PodSpec{NodeName: pod.Spec.NodeName},
		Status: corev1.PodStatus{
			ContainerStatuses:          pod.Status.ContainerStatuses,
			InitContainerStatuses:      pod.Status.InitContainerStatuses,
			EphemeralContainerStatuses: pod.Status.EphemeralContainerStatuses,
		},
	}, nil
}

// Run lists and watches pods until ctx ends, and returns once the
// informer's goroutines have.
func (n *NodePods) Run(ctx context.Context) error {
	n.informer.RunWithContext(ctx)
	return nil
}

// WaitForSync waits until the first list is in the cache; false when ctx
// ended first (an API server that cannot be reached, RBAC that forbids
// listing pods: the informer logs why).
func (n *NodePods) WaitForSync(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), n.informer.HasSynced)
}

// Pod is the pod with this UID, as attribution reports it, and the
// container whose runtime id is containerID ("" for none).
func (n *NodePods) Pod(uid, containerID string) (attribution.Pod, bool) {
	objs, err := n.informer.GetIndexer().ByIndex(uidIndex, uid)
	if err != nil || len(objs) == 0 {
		return attribution.Pod{}, false
	}
	pod, ok := objs[0].(*corev1.Pod)
	if !ok {
		return attribution.Pod{}, false
	}
	return describe(pod, containerID, n.cfg), true
}

func describe(pod *corev1.Pod, containerID string, cfg Config) attribution.Pod {
	out := attribution.Pod{
		Name:      pod.Name,
		Namespace: pod.Namespace,
		UID:       string(pod.UID),
		User:      firstLabel(pod.Labels, cfg.UserLabels),
		Server:    firstLabel(pod.Labels, cfg.ServerLabels),
	}
	if containerID == "" {
		return out
	}
	for _, list := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses, pod.Status.EphemeralContainerStatuses} {
		for _, cs := range list {
			if runtimeID(cs.ContainerID) == containerID {
				out.Container = cs.Name
				return out
			}
		}
	}
	return out
}

// runtimeID strips the runtime's scheme from a status's containerID
// ("containerd://<id>", "cri-o://<id>", "docker://<id>").
func runtimeID(s string) string {
	if _, id, ok := strings.Cut(s, "://"); ok {
		return id
	}
	return s
}

func firstLabel(labels map[string]string, keys []string) string {
	for _, k := range keys {
		if v := labels[k]; v != "" {
			return v
		}
	}
	return ""
}

// PodLookup gives a pod by UID; NodePods is one.
type PodLookup interface {
	Pod(uid, containerID string) (attribution.Pod, bool)
}

// Resolver answers attribution.Pods: it reads a process's cgroup (through
// cgroups.Reader, i.e. procs.FS under its /proc root) and looks its pod
// up. The cgroup of a process never changes once its container started,
// so answers are cached by (pid, start time); the cache is dropped when
// it grows past maxCached, which bounds it without tracking exits (it
// holds only the kernels and GPU processes asked about).
type Resolver struct {
	cgroups cgroups.Reader
	pods    PodLookup

	mu    sync.Mutex
	cache map[procKey]cgroups.Container
}

const maxCached = 4096

type procKey struct {
	pid   int
	start uint64
}

// NewResolver combines a cgroup reader and a pod lookup.
func NewResolver(r cgroups.Reader, pods PodLookup) *Resolver {
	return &Resolver{cgroups: r, pods: pods, cache: map[procKey]cgroups.Container{}}
}

// PodOf implements attribution.Pods. A process outside any pod, or in a
// pod the informer does not (yet) know, has none.
func (r *Resolver) PodOf(pid int, startTime uint64) (attribution.Pod, bool) {
	key := procKey{pid, startTime}
	r.mu.Lock()
	c, ok := r.cache[key]
	r.mu.Unlock()
	if !ok {
		var err error
		c, err = cgroups.ForProcess(r.cgroups, pid, startTime)
		if err != nil {
			// Gone, or unreadable: ask again next time rather than cache
			// a wrong answer.
			return attribution.Pod{}, false
		}
		r.mu.Lock()
		if len(r.cache) >= maxCached {
			clear(r.cache)
		}
		r.cache[key] = c
		r.mu.Unlock()
	}
	if !c.InPod() {
		return attribution.Pod{}, false
	}
	return r.pods.Pod(c.PodUID, c.ContainerID)
}

// InCluster builds a client of pods from the pod's service account (the
// token and CA the kubelet mounts).
func InCluster() (PodsClient, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes: not in a cluster, or no service account mounted: %w", err)
	}
	return NewRESTPods(cfg)
}

// NewRESTPods is a client of pods over the API server's REST interface
// (client-go's rest package), knowing only the core group's types. The
// typed clientset would do the same but links every API group's types
// and clients: 56 packages of k8s.io/api and some 15 MB of binary.
func NewRESTPods(cfg *rest.Config) (PodsClient, error) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.GroupVersion = &corev1.SchemeGroupVersion
	cfg.APIPath = "/api"
	cfg.ContentType = runtime.ContentTypeJSON
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if cfg.UserAgent == "" {
		cfg.UserAgent = "gpumem"
	}
	client, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	return restPods{client}, nil
}

type restPods struct{ c rest.Interface }

// IsWatchListSemanticsUnSupported keeps the informer to a plain list then
// watch, which every API server version serves: streaming the initial list
// as watch events saves memory on the server for large lists, and one
// node's pods are a few dozen.
func (restPods) IsWatchListSemanticsUnSupported() bool { return true }

func (p restPods) List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	list := &corev1.PodList{}
	err := p.c.Get().Resource("pods").VersionedParams(&opts, metav1.ParameterCodec).Do(ctx).Into(list)
	return list, err
}

func (p restPods) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return p.c.Get().Resource("pods").VersionedParams(&opts, metav1.ParameterCodec).Watch(ctx)
}
