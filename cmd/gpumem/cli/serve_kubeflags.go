package cli

import (
	"flag"
	"time"
)

// kubeFlags are serve's Kubernetes flags: with --kubernetes every process
// is attributed to its pod (cgroup → pod UID → the API's pod of this node).
//
// client-go grows the binary by 60 % (17 → 28 MB), so only a build
// with -tags kubernetes (the container image's) links it (serve_kube.go);
// other builds keep the flags and refuse --kubernetes with a clear error
// (serve_nokube.go).
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
		userLabels:   fs.String("user-labels", "hub.jupyter.org/username", "comma-separated pod labels naming the pod's user, tried in order"),
		serverLabels: fs.String("server-labels", "hub.jupyter.org/servername", "comma-separated pod labels naming the JupyterHub named server"),
		syncTimeout:  fs.Duration("kubernetes-sync-timeout", 30*time.Second, "how long to wait for the first list of pods before serving without pod names"),
	}
}
