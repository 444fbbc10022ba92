//go:build kubernetes

package cli

import (
	"context"
	"fmt"
	"sync"

	"github.com/rs/zerolog"

	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/cgroups"
	"github.com/gpumem/gpumem/sidecar/kube"
)

// start connects to the API and starts the informer. It returns the pod
// resolver (nil without --kubernetes) and a stop function that ends the
// informer and waits for it.
func (k *kubeFlags) start(ctx context.Context, proc cgroups.Reader, log zerolog.Logger) (attribution.Pods, func(), error) {
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
		Log:          log,
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
	return kube.NewResolver(proc, nodePods), stop, nil
}
