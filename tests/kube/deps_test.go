package kube

import (
	"os/exec"
	"strings"
	"testing"
)

// client-go grows gpumem's binary by 60 %: only a build with -tags
// kubernetes may link it, and only through sidecar/kube.
func TestClientGoOnlyWithTag(t *testing.T) {
	deps := func(tags ...string) map[string]bool {
		args := append([]string{"list", "-deps"}, tags...)
		out, err := exec.Command("go", append(args, "../../cmd/gpumem")...).CombinedOutput()
		if err != nil {
			t.Fatalf("go list: %v\n%s", err, out)
		}
		m := map[string]bool{}
		for _, p := range strings.Fields(string(out)) {
			m[p] = true
		}
		return m
	}
	plain := deps()
	for p := range plain {
		if strings.HasPrefix(p, "k8s.io/") {
			t.Errorf("gpumem without -tags kubernetes links %s", p)
		}
	}
	tagged := deps("-tags", "kubernetes")
	if !tagged["k8s.io/client-go/tools/cache"] || !tagged["github.com/gpumem/gpumem/sidecar/kube"] {
		t.Error("gpumem with -tags kubernetes does not link sidecar/kube and client-go")
	}
	// Pods are all it reads: the core group's types, not the typed
	// clientset's 56 API groups (16 MB of binary).
	for p := range tagged {
		if strings.HasPrefix(p, "k8s.io/api/") && p != "k8s.io/api/core/v1" {
			t.Errorf("gpumem with -tags kubernetes links %s", p)
		}
	}
	// Which of our packages import client-go directly: sidecar/kube only.
	out, err := exec.Command("go", "list", "-tags", "kubernetes", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "github.com/gpumem/gpumem/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, " ")
		if strings.Contains(" "+imports, " k8s.io/client-go") && pkg != "github.com/gpumem/gpumem/sidecar/kube" {
			t.Errorf("%s imports client-go; only sidecar/kube may", pkg)
		}
	}
}
