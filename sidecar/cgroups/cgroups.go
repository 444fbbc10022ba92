// Package cgroups owns the mapping from a process's control groups to the
// Kubernetes pod and container it runs in: it parses the content of
// /proc/<pid>/cgroup into a pod UID, a container id, the container runtime
// and the pod's QoS class. It is pure: the caller reads the file (procs.FS
// does, under its configurable root) and hands the bytes in. It knows
// nothing of pod names or users; those come from the Kubernetes API.
//
// The layouts it understands are those the kubelet creates:
//
//   - cgroup v2 (one line "0::<path>") and v1 (one line per hierarchy,
//     "<id>:<controllers>:<path>"), and the hybrid of both;
//   - the systemd cgroup driver, where every level is a unit named after
//     its parent ("kubepods.slice/kubepods-burstable.slice/
//     kubepods-burstable-pod<uid>.slice/<runtime>-<id>.scope") and the
//     pod UID's dashes become underscores because '-' separates slice
//     levels in systemd unit names;
//   - the cgroupfs driver, with plain directories
//     ("/kubepods/burstable/pod<uid>/<id>");
//   - QoS classes: guaranteed pods sit directly under kubepods, burstable
//     and besteffort pods one level lower;
//   - containerd ("cri-containerd-<id>.scope"), CRI-O ("crio-<id>.scope",
//     "crio-<id>" with cgroupfs, and "crio-conmon-<id>.scope" for its
//     monitor process) and Docker ("docker-<id>.scope", or a bare id with
//     cgroupfs);
//   - paths seen from a container with a private cgroup namespace, which
//     start with "/.." components: only the components matter, not where
//     the path is rooted;
//   - kubepods nested under another slice (the kubelet of a kind or
//     minikube node runs in a container: "/kubelet.slice/kubelet-kubepods.slice/…").
//
// A process outside any pod (the host, a plain Docker container) parses
// without error and with an empty PodUID; a plain Docker container still
// gets its ContainerID.
package cgroups

import (
	"bytes"
	"fmt"
	"strings"
)

// QoS classes as the kubelet names its cgroups.
const (
	QoSGuaranteed = "guaranteed"
	QoSBurstable  = "burstable"
	QoSBestEffort = "besteffort"
)

// Container runtimes as named by their cgroup scopes.
const (
	RuntimeContainerd = "containerd"
	RuntimeCRIO       = "cri-o"
	RuntimeDocker     = "docker"
)

// Drivers: which cgroup driver laid the path out.
const (
	DriverSystemd  = "systemd"
	DriverCgroupfs = "cgroupfs"
)

// Container is where a process runs, as its cgroup path tells.
type Container struct {
	// PodUID is the pod's metadata.uid in its canonical form (dashes, lower
	// case); "" when the process is in no pod.
	PodUID string
	// ContainerID is the runtime's container id (64 hex digits for the
	// runtimes above); "" when the process is in a pod but in no container
	// of it (a pod-level cgroup, CRI-O's conmon) or when the runtime's
	// naming is unknown.
	ContainerID string
	// Runtime is RuntimeContainerd, RuntimeCRIO or RuntimeDocker when the
	// scope's name says so; "" when it does not (cgroupfs names containers
	// by their bare id, whatever the runtime).
	Runtime string
	// QoS is the pod's QoS class, one of the QoS constants; "" outside a pod.
	QoS string
	// Driver is DriverSystemd or DriverCgroupfs; "" outside a pod.
	Driver string
	// Monitor is true for CRI-O's conmon, which watches a container from
	// the pod's cgroup but is not part of it.
	Monitor bool
	// Path is the cgroup path the answer came from.
	Path string
}

// InPod reports whether the process runs in a Kubernetes pod.
func (c Container) InPod() bool { return c.PodUID != "" }

// Parse reads the content of a /proc/<pid>/cgroup file. With cgroup v1 the
// hierarchies that name a pod must agree; the unified ("0::") line is
// preferred when it names one. An empty or malformed file is an error; a
// process outside every pod is not.
func Parse(content []byte) (Container, error) {
	var paths []string
	var unified string
	hasUnified := false
	for n, line := range bytes.Split(content, []byte{'\n'}) {
		line = bytes.TrimRight(line, "\r")
		if len(line) == 0 {
			continue
		}
		// "hierarchy-ID:controller-list:cgroup-path"; the path may itself
		// hold ':' characters, so split twice only.
		first := bytes.IndexByte(line, ':')
		if first < 0 {
			return Container{}, fmt.Errorf("cgroup line %d: %q: want hierarchy-id:controllers:path", n+1, line)
		}
		second := bytes.IndexByte(line[first+1:], ':')
		if second < 0 {
			return Container{}, fmt.Errorf("cgroup line %d: %q: want hierarchy-id:controllers:path", n+1, line)
		}
		id, controllers := line[:first], line[first+1:first+1+second]
		path := string(line[first+1+second+1:])
		if len(id) == 0 || !isDigits(id) {
			return Container{}, fmt.Errorf("cgroup line %d: %q: hierarchy id is not a number", n+1, line)
		}
		if !strings.HasPrefix(path, "/") {
			return Container{}, fmt.Errorf("cgroup line %d: %q: path is not absolute", n+1, line)
		}
		if string(id) == "0" && len(controllers) == 0 {
			unified, hasUnified = path, true
			continue
		}
		paths = append(paths, path)
	}
	if !hasUnified && len(paths) == 0 {
		return Container{}, fmt.Errorf("cgroup: no hierarchy listed")
	}
	if hasUnified {
		if c := ParsePath(unified); c.InPod() || c.ContainerID != "" {
			return c, nil
		}
	}
	var found Container
	for _, p := range paths {
		c := ParsePath(p)
		if !c.InPod() && c.ContainerID == "" {
			continue
		}
		if found.Path == "" {
			found = c
			continue
		}
		if c.PodUID != found.PodUID || c.ContainerID != found.ContainerID {
			return Container{}, fmt.Errorf("cgroup: hierarchies disagree: %q and %q name different containers", found.Path, c.Path)
		}
	}
	if found.Path != "" {
		return found, nil
	}
	if hasUnified {
		return Container{Path: unified}, nil
	}
	return Container{Path: paths[0]}, nil
}

// ParsePath maps one cgroup path to the pod and container it names. A path
// that names no pod and no Docker container gives a Container with only
// Path set.
func ParsePath(path string) Container {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i, part := range parts {
		uid, qos, driver, ok := podComponent(part, parentOf(parts, i))
		if !ok {
			continue
		}
		c := Container{PodUID: uid, QoS: qos, Driver: driver, Path: path}
		if i+1 < len(parts) {
			c.ContainerID, c.Runtime, c.Monitor = containerComponent(parts[i+1], driver)
		}
		return c
	}
	// Docker outside Kubernetes: "/docker/<id>" (cgroupfs) or
	// "/system.slice/docker-<id>.scope" (systemd).
	for i, part := range parts {
		if id, ok := strings.CutPrefix(part, "docker-"); ok {
			if id, ok = strings.CutSuffix(id, ".scope"); ok && isContainerID(id) {
				return Container{ContainerID: id, Runtime: RuntimeDocker, Path: path}
			}
		}
		if part == "docker" && i+1 < len(parts) && isContainerID(parts[i+1]) {
			return Container{ContainerID: parts[i+1], Runtime: RuntimeDocker, Path: path}
		}
	}
	return Container{Path: path}
}

func parentOf(parts []string, i int) string {
	if i == 0 {
		return ""
	}
	return parts[i-1]
}

// podComponent recognises the cgroup of a pod:
//
//	systemd:  kubepods-pod<uid>.slice, kubepods-<qos>-pod<uid>.slice (with
//	          any prefix of parent slices, e.g. kubelet-kubepods-…)
//	cgroupfs: pod<uid>, under "kubepods" (guaranteed) or under
//	          "burstable"/"besteffort"
func podComponent(part, parent string) (uid, qos, driver string, ok bool) {
	if name, isSlice := strings.CutSuffix(part, ".slice"); isSlice {
		at := strings.LastIndex(name, "-pod")
		if at < 0 {
			return "", "", "", false
		}
		uid, ok = canonicalUID(name[at+len("-pod"):])
		if !ok {
			return "", "", "", false
		}
		prefix := name[:at]
		switch {
		case strings.HasSuffix(prefix, "kubepods-"+QoSBurstable):
			qos = QoSBurstable
		case strings.HasSuffix(prefix, "kubepods-"+QoSBestEffort):
			qos = QoSBestEffort
		case strings.HasSuffix(prefix, "kubepods"):
			qos = QoSGuaranteed
		default:
			return "", "", "", false
		}
		return uid, qos, DriverSystemd, true
	}
	rest, isPod := strings.CutPrefix(part, "pod")
	if !isPod {
		return "", "", "", false
	}
	uid, ok = canonicalUID(rest)
	if !ok {
		return "", "", "", false
	}
	switch parent {
	case QoSBurstable, QoSBestEffort:
		qos = parent
	case "kubepods":
		qos = QoSGuaranteed
	default:
		return "", "", "", false
	}
	return uid, qos, DriverCgroupfs, true
}

// containerComponent recognises a container's cgroup inside a pod's.
func containerComponent(part, driver string) (id, runtime string, monitor bool) {
	if driver == DriverSystemd {
		name, ok := strings.CutSuffix(part, ".scope")
		if !ok {
			return "", "", false
		}
		part = name
	}
	for _, r := range []struct{ prefix, runtime string }{
		{"cri-containerd-", RuntimeContainerd},
		{"crio-conmon-", RuntimeCRIO},
		{"crio-", RuntimeCRIO},
		{"docker-", RuntimeDocker},
	} {
		if id, ok := strings.CutPrefix(part, r.prefix); ok && isContainerID(id) {
			return id, r.runtime, r.prefix == "crio-conmon-"
		}
	}
	if driver == DriverCgroupfs && isContainerID(part) {
		return part, "", false
	}
	return "", "", false
}

// canonicalUID accepts a pod UID as the kubelet writes it into cgroup
// names: an RFC 4122 UUID with '-' or (systemd) '_' separators, or the 32
// hex digits of a static pod's UID (a hash of its manifest). It returns
// the form the API server shows.
func canonicalUID(s string) (string, bool) {
	s = strings.ToLower(s)
	if len(s) == 32 && isHex(s) {
		return s, true
	}
	if len(s) != 36 {
		return "", false
	}
	var b strings.Builder
	b.Grow(36)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' && c != '_' {
				return "", false
			}
			b.WriteByte('-')
		default:
			if !isHexByte(c) {
				return "", false
			}
			b.WriteByte(c)
		}
	}
	return b.String(), true
}

// isContainerID accepts the 64 hex digits containerd, CRI-O and Docker use.
func isContainerID(s string) bool { return len(s) == 64 && isHex(s) }

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isHexByte(s[i]) {
			return false
		}
	}
	return true
}

func isHexByte(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' }

func isDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// Reader reads a process's /proc/<pid>/cgroup; procs.FS is one.
type Reader interface {
	Cgroup(pid int, startTime uint64) ([]byte, error)
}

// ForProcess reads and parses the cgroup of the process (pid, startTime).
func ForProcess(r Reader, pid int, startTime uint64) (Container, error) {
	data, err := r.Cgroup(pid, startTime)
	if err != nil {
		return Container{}, err
	}
	c, err := Parse(data)
	if err != nil {
		return Container{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	return c, nil
}
