package api

import (
	"net/http"
	"strings"
)

// route is one endpoint: its method and path, who may call it (see
// access), and its handler.
type route struct {
	method, path string
	access       access
	serve        func(*Server, http.ResponseWriter, *http.Request, caller)
}

// routes is the whole API, one table: doc.go lists each endpoint (a test
// checks it), and the paths answer 405 to other methods.
var routes = []route{
	{"GET", "/healthz", accessAnyone, (*Server).serveHealthz},
	{"GET", "/api/v1/gpus", accessUser, (*Server).serveGPUs},
	{"GET", "/api/v1/users", accessUser, (*Server).serveUsers},
	{"GET", "/api/v1/notebooks", accessUser, (*Server).serveNotebooks},
	{"GET", "/api/v1/history", accessUser, (*Server).serveHistory},
	{"GET", "/api/v1/kernels", accessUser, (*Server).serveKernels},
	{"GET", "/api/v1/kernels/{id}", accessOwnKernel, (*Server).serveKernel},
	{"POST", "/api/v1/kernels/{id}/free", accessOwnKernel, (*Server).serveFree},
	{"GET", "/api/v1/kernels/{id}/vars", accessOwnKernel, (*Server).serveKernelVars},
	{"GET", "/api/v1/kernels/{id}/summary", accessOwnKernel, (*Server).serveKernelSummary},
	{"GET", "/api/v1/kernels/{id}/why", accessOwnKernel, (*Server).serveWhy},
	{"POST", "/api/v1/kernels/{id}/why", accessOwnKernel, (*Server).serveWhyJoin},
	{"POST", "/api/v1/kernels/{id}/children/before", accessOwnKernel, (*Server).serveChildrenBefore},
	{"POST", "/api/v1/kernels/{id}/children/free", accessOwnKernel, (*Server).serveFreeChildren},
	{"POST", "/api/v1/kernels/{id}/orphans/end", accessOwnOrphans, (*Server).serveEndOrphans},
	{"POST", "/api/v1/kernels/{id}/keep", accessOwnKernel, (*Server).serveKeep},
	// Out-of-memory errors: a kernel reports its own; the events the caller may see.
	{"POST", "/api/v1/oom", accessAnyone, (*Server).serveRecordOOM},
	{"GET", "/api/v1/oom", accessUser, (*Server).serveOOMEvents},
	// Memory snapshots.
	{"POST", "/api/v1/snapshots", accessAnyone, (*Server).serveAddSnapshot},
	{"GET", "/api/v1/kernels/{id}/snapshots", accessOwnKernel, (*Server).serveSnapshots},
	{"GET", "/api/v1/kernels/{id}/snapshots/{sid}", accessOwnKernel, (*Server).serveSnapshot},
	{"GET", "/api/v1/kernels/{id}/snapshots/{sid}/raw", accessOwnKernel, (*Server).serveSnapshotFile},
}

// allowed is each path's Allow header: its methods, HEAD with GET.
func allowed() map[string]string {
	methods := map[string][]string{}
	for _, rt := range routes {
		methods[rt.path] = append(methods[rt.path], rt.method)
	}
	allows := map[string]string{}
	for path, ms := range methods {
		var allow []string
		for _, m := range []string{"GET", "HEAD", "POST"} {
			for _, have := range ms {
				if have == m || (m == "HEAD" && have == "GET") {
					allow = append(allow, m)
					break
				}
			}
		}
		allows[path] = strings.Join(allow, ", ")
	}
	return allows
}
