package gpumem

import (
	"os"
	"regexp"
	"testing"
)

func TestParseVersion(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"package.json", `{"name": "jupyterlab-gpumem", "version": "0.1.0"}`, "0.1.0"},
		{"prerelease", `{"version": "1.2.0-rc.1"}`, "1.2.0-rc.1"},
		{"no version", `{"name": "x"}`, "unknown"},
		{"empty version", `{"version": ""}`, "unknown"},
		{"not JSON", `version: 1`, "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseVersion([]byte(tc.in)); got != tc.want {
				t.Errorf("parseVersion(%s) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestCommitOf(t *testing.T) {
	full := "163dce7a1b2c3d4e5f60718293a4b5c6d7e8f901"
	for _, tc := range []struct {
		name     string
		given    string
		settings map[string]string
		want     string
	}{
		{"given wins", "abc123", map[string]string{"vcs.revision": full}, "abc123"},
		{"vcs stamp, short", "", map[string]string{"vcs.revision": full, "vcs.modified": "false"}, "163dce7a1b2c"},
		{"vcs stamp, dirty tree", "", map[string]string{"vcs.revision": full, "vcs.modified": "true"}, "163dce7a1b2c-dirty"},
		{"short revision kept", "", map[string]string{"vcs.revision": "163dce7"}, "163dce7"},
		{"no stamp", "", map[string]string{}, "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := commitOf(tc.given, tc.settings); got != tc.want {
				t.Errorf("commitOf(%q, %v) = %q, want %q", tc.given, tc.settings, got, tc.want)
			}
		})
	}
}

// The embedded file is the one the wheel's version comes from: the binary
// and the wheel cannot disagree.
func TestCurrentIsPackageJSONs(t *testing.T) {
	b, err := os.ReadFile("labextension/package.json")
	if err != nil {
		t.Fatal(err)
	}
	want := parseVersion(b)
	if !regexp.MustCompile(`^\d+\.\d+\.\d+`).MatchString(want) {
		t.Fatalf("labextension/package.json's version %q is not semver", want)
	}
	if got := Current().Version; got != want {
		t.Errorf("Current().Version = %q, want package.json's %q", got, want)
	}
	if s := Current().String(); !regexp.MustCompile(`^gpumem \S+ \(commit \S+\)$`).MatchString(s) {
		t.Errorf("Current().String() = %q, want \"gpumem X (commit Y)\"", s)
	}
}

// A release is described before it is made: CHANGELOG.md has a section for
// the version in package.json.
func TestChangelogNamesTheVersion(t *testing.T) {
	b, err := os.ReadFile("CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	v := regexp.QuoteMeta(Current().Version)
	if !regexp.MustCompile(`(?m)^## ` + v + `\b`).Match(b) {
		t.Errorf("CHANGELOG.md has no \"## %s\" section: describe this version there", Current().Version)
	}
}

// The Helm chart's appVersion names the image of this version.
func TestChartAppVersion(t *testing.T) {
	b, err := os.ReadFile("deploy/helm/gpumem/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^appVersion:\s*"?([^"\s]+)"?`).FindSubmatch(b)
	if m == nil {
		t.Fatal("deploy/helm/gpumem/Chart.yaml has no appVersion")
	}
	if string(m[1]) != Current().Version {
		t.Errorf("the chart's appVersion is %s, package.json's version %s: bump the chart with the version", m[1], Current().Version)
	}
}
