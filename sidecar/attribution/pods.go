package attribution

import "github.com/gpumem/gpumem/sidecar/procs"

// Pod is the Kubernetes pod a process runs in, as gpumem reports it.
type Pod struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	UID       string `json:"uid"`
	// Container is the container's name in the pod ("" when the runtime's
	// id is not (yet) in the pod's status).
	Container string `json:"container,omitempty"`
	// User is the JupyterHub user the pod belongs to, from its labels; ""
	// when the pod has none of the configured labels.
	User string `json:"user,omitempty"`
	// Server is the JupyterHub named server ("" for the default server).
	Server string `json:"server,omitempty"`
}

// Pods tells which pod a process runs in. It is declared here, where it is
// used, so that attribution and its callers never import a Kubernetes
// client: kube.Resolver is the implementation, a nil Pods means "not on
// Kubernetes".
type Pods interface {
	// PodOf answers for the process (pid, startTime) of the table's /proc.
	PodOf(pid int, startTime uint64) (Pod, bool)
}

// AddPods fills the Pod of each notebook (from its kernel's process) and of
// each other GPU process. table is the one the report was attributed from.
func AddPods(r *Report, table *procs.Table, pods Pods) {
	if pods == nil || table == nil {
		return
	}
	podOf := func(pid int) *Pod {
		p, ok := table.Resolve(pid)
		if !ok {
			return nil
		}
		if pod, ok := pods.PodOf(p.PID, p.StartTime); ok {
			return &pod
		}
		return nil
	}
	for i := range r.Notebooks {
		if len(r.Notebooks[i].PIDs) > 0 {
			r.Notebooks[i].Pod = podOf(r.Notebooks[i].PIDs[0])
		}
	}
	for i := range r.Other {
		r.Other[i].Pod = podOf(r.Other[i].PID)
	}
}
