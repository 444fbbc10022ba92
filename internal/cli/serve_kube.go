package cli

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/kube"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// kubeFlags are serve's Kubernetes flags: with --kubernetes every process
// is attributed to its pod (cgroup → pod UID → the API's pod of this node).
type kubeFlags struct {
	enabled      *bool
	nodeName     *string
	userLabels   *string
	serverLabels *string
	syncTimeout  *time.Duration
}

func addKubeFlags(fs *flag.FlagSet, env Env) *kubeFlags {
	return &kubeFlags{
		enabled:      fs.Bool("kubernetes", false, "attribute GPU memory to Kubernetes pods through the API (in a pod, with a service account that may get, list and watch pods)"),
		nodeName:     fs.String("node-name", env.getenv("NODE_NAME"), "this node's name, to watch only its pods (default $NODE_NAME)"),
		userLabels:   fs.String("user-labels", kube.LabelHubUsername, "comma-separated pod labels naming the pod's user, tried in order"),
		serverLabels: fs.String("server-labels", kube.LabelHubServerName, "comma-separated pod labels naming the JupyterHub named server"),
		syncTimeout:  fs.Duration("kubernetes-sync-timeout", 30*time.Second, "how long to wait for the first list of pods before serving without pod names"),
	}
}

// start connects to the API and starts the informer. It returns the pod
// resolver (nil without --kubernetes) and a stop function that ends the
// informer and waits for it.
func (k *kubeFlags) start(ctx context.Context, procRoot string, log zerolog.Logger) (attribution.Pods, func(), error) {
	if !*k.enabled {
		return nil, func() {}, nil
	}
	client, err := kube.InCluster()
	if err != nil {
		return nil, nil, fmt.Errorf("--kubernetes: %w", err)
	}
	nodePods, err := kube.NewNodePods(client, kube.Config{
		NodeName:     *k.nodeName,
		UserLabels:   splitList(*k.userLabels),
		ServerLabels: splitList(*k.serverLabels),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("--kubernetes: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = nodePods.Run(ctx) })
	stop := func() { cancel(); wg.Wait() }

	syncCtx, syncCancel := context.WithTimeout(ctx, *k.syncTimeout)
	defer syncCancel()
	if nodePods.WaitForSync(syncCtx) {
		log.Info().Str("node", *k.nodeName).Msg("watching this node's pods")
	} else {
		log.Warn().Str("node", *k.nodeName).Dur("waited", *k.syncTimeout).
			Msg("pods of this node not listed yet (API server unreachable, or RBAC forbids listing pods): figures carry no pod until they are")
	}
	return kube.NewResolver(&procs.FS{Root: procRoot}, nodePods), stop, nil
}

func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
