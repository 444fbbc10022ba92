//go:build !kubernetes

package cli

import (
	"context"
	"errors"

	"github.com/rs/zerolog"

	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/cgroups"
)

// start refuses --kubernetes: this build does not link client-go.
func (k *kubeFlags) start(context.Context, cgroups.Reader, zerolog.Logger) (attribution.Pods, func(), error) {
	if !*k.enabled {
		return nil, func() {}, nil
	}
	return nil, nil, errors.New("--kubernetes: this gpumem was built without Kubernetes support; use the container image (deploy/container/build.sh) or go build -tags kubernetes ./cmd/gpumem")
}
