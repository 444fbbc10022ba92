package api

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDocListsEveryRoute: doc.go's endpoint list is the route table, no
// endpoint missing and none that is not served.
func TestDocListsEveryRoute(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	text := string(src)
	start, end := strings.Index(text, "// # Endpoints"), strings.Index(text, "// # Browser requests")
	if start < 0 || end < start {
		t.Fatal("doc.go has no # Endpoints section before # Browser requests")
	}
	line := regexp.MustCompile(`(?m)^//\t(GET|POST|PUT|DELETE|PATCH) +(\S+)`)
	var listed []string
	for _, m := range line.FindAllStringSubmatch(text[start:end], -1) {
		listed = append(listed, m[1]+" "+m[2])
	}
	var served []string
	for _, rt := range routes {
		served = append(served, rt.method+" "+rt.path)
	}
	for _, r := range served {
		if !slices.Contains(listed, r) {
			t.Errorf("doc.go's endpoint list lacks %s", r)
		}
	}
	for _, l := range listed {
		if !slices.Contains(served, l) {
			t.Errorf("doc.go lists %s, which no route serves", l)
		}
	}
	if len(listed) != len(served) {
		t.Errorf("doc.go lists %d endpoints, the routes are %d", len(listed), len(served))
	}
}
