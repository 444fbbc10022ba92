package cgroups

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	uid        = "5b7e3c1a-2f4d-4e6b-9a8c-0d1e2f3a4b5c"
	staticUID  = "6c2f0e9d8b7a41c3a5e4d3c2b1a09f8e"
	containerd = "4f0d2e8a9b1c3d5e7f60718293a4b5c6d7e8f90123456789abcdef0123456789"
	crio       = "9a8b7c6d5e4f30211203a4b5c6d7e8f9a0b1c2d3e4f5061728394a5b6c7d8e9f"
)

// TestParseFixtures runs Parse on /proc/<pid>/cgroup files in the layouts
// the kubelet and the runtimes create (see testdata/).
func TestParseFixtures(t *testing.T) {
	tests := []struct {
		file string
		want Container // Path is not compared
	}{
		{"v2-systemd-containerd-burstable", Container{PodUID: uid, ContainerID: containerd, Runtime: RuntimeContainerd, QoS: QoSBurstable, Driver: DriverSystemd}},
		{"v2-systemd-containerd-guaranteed", Container{PodUID: uid, ContainerID: containerd, Runtime: RuntimeContainerd, QoS: QoSGuaranteed, Driver: DriverSystemd}},
		{"v2-systemd-crio-besteffort", Container{PodUID: uid, ContainerID: crio, Runtime: RuntimeCRIO, QoS: QoSBestEffort, Driver: DriverSystemd}},
		{"v2-systemd-crio-conmon", Container{PodUID: uid, ContainerID: crio, Runtime: RuntimeCRIO, QoS: QoSBurstable, Driver: DriverSystemd, Monitor: true}},
		{"v2-systemd-containerd-nested", Container{PodUID: uid, ContainerID: containerd, Runtime: RuntimeContainerd, QoS: QoSBurstable, Driver: DriverSystemd}},
		{"v2-cgroupfs-containerd-besteffort", Container{PodUID: uid, ContainerID: containerd, QoS: QoSBestEffort, Driver: DriverCgroupfs}},
		{"v2-cgroupfs-guaranteed", Container{PodUID: uid, ContainerID: containerd, QoS: QoSGuaranteed, Driver: DriverCgroupfs}},
		{"v2-cgroupfs-crio-burstable", Container{PodUID: uid, ContainerID: crio, Runtime: RuntimeCRIO, QoS: QoSBurstable, Driver: DriverCgroupfs}},
		{"v2-cgroupns-relative", Container{PodUID: uid, ContainerID: containerd, Runtime: RuntimeContainerd, QoS: QoSBestEffort, Driver: DriverSystemd}},
		{"v2-kind-nested", Container{PodUID: uid, ContainerID: containerd, Runtime: RuntimeContainerd, QoS: QoSBurstable, Driver: DriverSystemd}},
		{"v2-static-pod", Container{PodUID: staticUID, ContainerID: containerd, Runtime: RuntimeContainerd, QoS: QoSBurstable, Driver: DriverSystemd}},
		{"v2-pod-level", Container{PodUID: uid, QoS: QoSBurstable, Driver: DriverSystemd}},
		{"v2-host-user", Container{}},
		{"v2-host-init", Container{}},
		{"v2-root", Container{}},
		{"v2-docker-systemd-plain", Container{ContainerID: containerd, Runtime: RuntimeDocker}},
		{"v1-cgroupfs-docker-burstable", Container{PodUID: uid, ContainerID: containerd, QoS: QoSBurstable, Driver: DriverCgroupfs}},
		{"v1-systemd-docker-guaranteed-hybrid", Container{PodUID: uid, ContainerID: containerd, Runtime: RuntimeDocker, QoS: QoSGuaranteed, Driver: DriverSystemd}},
		{"v1-systemd-containerd-besteffort-hybrid", Container{PodUID: uid, ContainerID: containerd, Runtime: RuntimeContainerd, QoS: QoSBestEffort, Driver: DriverSystemd}},
		{"v1-host", Container{}},
		{"v1-docker-cgroupfs-plain", Container{ContainerID: crio, Runtime: RuntimeDocker}},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		seen[tt.file] = true
		t.Run(tt.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			got, err := Parse(data)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got.Path == "" || !strings.Contains(string(data), got.Path) {
				t.Errorf("Path = %q, not a path of the file", got.Path)
			}
			got.Path = ""
			if got != tt.want {
				t.Errorf("Parse =\n %+v\nwant\n %+v", got, tt.want)
			}
			if got.InPod() != (tt.want.PodUID != "") {
				t.Errorf("InPod = %v", got.InPod())
			}
		})
	}
	// Every good fixture is in the table, so none is silently unchecked.
	entries, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "bad-") && !seen[e.Name()] && !e.IsDir() {
			t.Errorf("testdata/%s has no case in the table", e.Name())
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		file, want string
	}{
		{"bad-empty", "no hierarchy"},
		{"bad-garbage", "want hierarchy-id:controllers:path"},
		{"bad-id", "hierarchy id is not a number"},
		{"bad-relative", "path is not absolute"},
		{"bad-disagree", "hierarchies disagree"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			got, err := Parse(data)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Parse = %+v, %v; want an error containing %q", got, err, tt.want)
			}
		})
	}
}

// TestParsePathNearMisses: names that look like a pod's cgroup but are not
// must not be taken for one.
func TestParsePathNearMisses(t *testing.T) {
	tests := []struct {
		name, path string
		wantUID    string
		wantID     string
	}{
		{"uid too short", "/kubepods/burstable/pod5b7e3c1a-2f4d-4e6b-9a8c-0d1e2f3a4b5/" + containerd, "", ""},
		{"uid not hex", "/kubepods/burstable/pod5b7e3c1a-2f4d-4e6b-9a8c-0d1e2f3a4bzz/" + containerd, "", ""},
		{"separator misplaced", "/kubepods/burstable/pod5b7e3c1a2-f4d-4e6b-9a8c-0d1e2f3a4b5c/" + containerd, "", ""},
		{"pod dir outside kubepods", "/user.slice/pod" + uid + "/" + containerd, "", ""},
		{"slice without kubepods", "/system.slice/myapp-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice", "", ""},
		{"upper-case uid", "/kubepods/besteffort/pod" + strings.ToUpper(uid) + "/" + containerd, uid, containerd},
		{"container id too short", "/kubepods/besteffort/pod" + uid + "/" + containerd[:63], uid, ""},
		{"unknown runtime scope", "/kubepods.slice/kubepods-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/other-" + containerd + ".scope", uid, ""},
		{"systemd scope without .scope", "/kubepods.slice/kubepods-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/cri-containerd-" + containerd, uid, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ParsePath(tt.path)
			if got.PodUID != tt.wantUID || got.ContainerID != tt.wantID {
				t.Errorf("ParsePath(%q) = pod %q container %q; want %q %q", tt.path, got.PodUID, got.ContainerID, tt.wantUID, tt.wantID)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	entries, err := os.ReadDir("testdata")
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		data, err := os.ReadFile(filepath.Join("testdata", e.Name()))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			return
		}
		if c.PodUID != "" && len(c.PodUID) != 36 && len(c.PodUID) != 32 {
			t.Errorf("PodUID %q has the wrong length", c.PodUID)
		}
		if c.ContainerID != "" && len(c.ContainerID) != 64 {
			t.Errorf("ContainerID %q has the wrong length", c.ContainerID)
		}
	})
}

type fakeReader map[int]string

func (f fakeReader) Cgroup(pid int, _ uint64) ([]byte, error) {
	s, ok := f[pid]
	if !ok {
		return nil, os.ErrNotExist
	}
	return []byte(s), nil
}

func TestForProcess(t *testing.T) {
	r := fakeReader{7: "0::/kubepods/pod" + uid + "/" + containerd + "\n", 8: "garbage\n"}
	c, err := ForProcess(r, 7, 1)
	if err != nil || c.PodUID != uid || c.ContainerID != containerd {
		t.Errorf("ForProcess(7) = %+v, %v", c, err)
	}
	if _, err := ForProcess(r, 8, 1); err == nil || !strings.Contains(err.Error(), "pid 8") {
		t.Errorf("ForProcess(8) error %v does not name the pid", err)
	}
	if _, err := ForProcess(r, 9, 1); err == nil {
		t.Error("ForProcess(9) of a missing process: no error")
	}
}
