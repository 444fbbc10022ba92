package protocol

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const validConn = `{
  "shell_port": 50001, "iopub_port": 50002, "stdin_port": 50003,
  "control_port": 50004, "hb_port": 50005, "ip": "127.0.0.1",
  "key": "a0436f6c-1916-498b-8eb9-e81ab9368e84", "transport": "tcp",
  "signature_scheme": "hmac-sha256", "kernel_name": "python3"
}`

func TestParseConnectionInfo(t *testing.T) {
	want := ConnectionInfo{
		Transport: "tcp", IP: "127.0.0.1",
		ShellPort: 50001, IOPubPort: 50002, StdinPort: 50003, ControlPort: 50004, HBPort: 50005,
		Key: "a0436f6c-1916-498b-8eb9-e81ab9368e84", SignatureScheme: "hmac-sha256", KernelName: "python3",
	}
	got, err := ParseConnectionInfo([]byte(validConn))
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}

	ok := []struct {
		name  string
		in    string
		check func(ConnectionInfo) bool
	}{
		{"empty key is unsigned", `{"ip":"127.0.0.1","key":"","shell_port":1,"iopub_port":2,"control_port":3,"hb_port":4}`,
			func(ci ConnectionInfo) bool {
				return ci.Key == "" && ci.Transport == "tcp" && ci.SignatureScheme == "hmac-sha256"
			}},
		{"no stdin port", `{"ip":"127.0.0.1","shell_port":1,"iopub_port":2,"control_port":3,"hb_port":4}`,
			func(ci ConnectionInfo) bool { return ci.StdinPort == 0 }},
		{"wildcard ip connects to loopback", `{"ip":"0.0.0.0","shell_port":1,"iopub_port":2,"control_port":3,"hb_port":4}`,
			func(ci ConnectionInfo) bool { return ci.endpoint(ci.ShellPort) == "gpumem+tcp://127.0.0.1:1" }},
		{"ipv6", `{"ip":"::1","shell_port":1,"iopub_port":2,"control_port":3,"hb_port":4}`,
			func(ci ConnectionInfo) bool { return ci.endpoint(ci.HBPort) == "gpumem+tcp://[::1]:4" }},
		{"hostname", `{"ip":"localhost","shell_port":1,"iopub_port":2,"control_port":3,"hb_port":4}`,
			func(ci ConnectionInfo) bool { return ci.IP == "localhost" }},
		{"ipc", `{"transport":"ipc","ip":"/run/k/kernel-ipc","shell_port":1,"iopub_port":2,"control_port":3,"hb_port":4}`,
			func(ci ConnectionInfo) bool { return ci.endpoint(ci.IOPubPort) == "gpumem+ipc:///run/k/kernel-ipc-2" }},
		{"null key", `{"ip":"127.0.0.1","key":null,"shell_port":1,"iopub_port":2,"control_port":3,"hb_port":4}`,
			func(ci ConnectionInfo) bool { return ci.Key == "" }},
		{"unknown fields ignored", `{"ip":"127.0.0.1","jupyter_session":"x","shell_port":1,"iopub_port":2,"control_port":3,"hb_port":4}`,
			func(ci ConnectionInfo) bool { return ci.ShellPort == 1 }},
	}
	for _, tc := range ok {
		t.Run(tc.name, func(t *testing.T) {
			ci, err := ParseConnectionInfo([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(ci) {
				t.Fatalf("unexpected %+v", ci)
			}
		})
	}

	ports := `"shell_port":1,"iopub_port":2,"control_port":3,"hb_port":4`
	bad := []struct {
		name, in, want string
	}{
		{"empty", ``, "empty"},
		{"blank", "  \n", "empty"},
		{"not json", `kernel`, "not a JSON object"},
		{"array", `[1,2]`, "not a JSON object"},
		{"null", `null`, "not a JSON object"},
		{"truncated", validConn[:60], "invalid JSON"},
		{"trailing garbage", validConn + "}", "invalid JSON"},
		{"curve", `{"ip":"127.0.0.1","curve_publickey":"x","curve_secretkey":"y",` + ports + `}`, "CURVE encryption is not supported"},
		{"curve empty", `{"ip":"127.0.0.1","curve_serverkey":"",` + ports + `}`, "CURVE encryption is not supported"},
		{"md5", `{"ip":"127.0.0.1","signature_scheme":"hmac-md5",` + ports + `}`, `signature_scheme "hmac-md5" is not supported`},
		{"sha1", `{"ip":"127.0.0.1","signature_scheme":"hmac-sha1",` + ports + `}`, "hmac-sha256 only"},
		{"empty scheme", `{"ip":"127.0.0.1","signature_scheme":"",` + ports + `}`, "not supported"},
		{"udp", `{"ip":"127.0.0.1","transport":"udp",` + ports + `}`, `transport "udp" is not supported`},
		{"transport number", `{"ip":"127.0.0.1","transport":5,` + ports + `}`, "transport: want a string"},
		{"key number", `{"ip":"127.0.0.1","key":5,` + ports + `}`, "key: want a string"},
		{"no ip", `{` + ports + `}`, "ip is missing"},
		{"bad ip", `{"ip":"tcp://x/y",` + ports + `}`, "neither an IP address nor a host name"},
		{"ipc no ip", `{"transport":"ipc",` + ports + `}`, "ipc socket path prefix"},
		{"ipc nul", `{"transport":"ipc","ip":"a\u0000b",` + ports + `}`, "NUL"},
		{"missing shell", `{"ip":"127.0.0.1","iopub_port":2,"control_port":3,"hb_port":4}`, "shell_port is missing"},
		{"missing hb", `{"ip":"127.0.0.1","shell_port":1,"iopub_port":2,"control_port":3}`, "hb_port is missing"},
		{"port zero", `{"ip":"127.0.0.1","shell_port":0,"iopub_port":2,"control_port":3,"hb_port":4}`, "shell_port: port 0 out of range"},
		{"port negative", `{"ip":"127.0.0.1","shell_port":-5,"iopub_port":2,"control_port":3,"hb_port":4}`, "out of range"},
		{"port too big", `{"ip":"127.0.0.1","shell_port":70000,"iopub_port":2,"control_port":3,"hb_port":4}`, "out of range 1..65535"},
		{"port huge", `{"ip":"127.0.0.1","shell_port":1e400,"iopub_port":2,"control_port":3,"hb_port":4}`, "shell_port"},
		{"port float", `{"ip":"127.0.0.1","shell_port":1.5,"iopub_port":2,"control_port":3,"hb_port":4}`, "want an integer port"},
		{"port string", `{"ip":"127.0.0.1","shell_port":"50001","iopub_port":2,"control_port":3,"hb_port":4}`, "want an integer port"},
		{"port null", `{"ip":"127.0.0.1","shell_port":null,"iopub_port":2,"control_port":3,"hb_port":4}`, "want an integer port"},
		{"port object", `{"ip":"127.0.0.1","stdin_port":{},"shell_port":1,"iopub_port":2,"control_port":3,"hb_port":4}`, "stdin_port"},
		{"deep nesting", `{"x":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`, "invalid JSON"},
		{"too large", `{"x":"` + strings.Repeat("a", maxConnectionFileBytes) + `"}`, "larger than"},
		{"invalid utf8 key", "{\"ip\":\"127.0.0.1\",\"key\":\"\xff\"," + ports + "}", ""},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConnectionInfo([]byte(tc.in))
			if tc.want == "" {
				return // must only not panic
			}
			if err == nil {
				t.Fatalf("no error for %.80q", tc.in)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
			var cfe *ConnectionFileError
			if !errors.As(err, &cfe) {
				t.Fatalf("error %v is not a *ConnectionFileError", err)
			}
			if strings.Contains(tc.want, "CURVE") && !errors.Is(err, ErrCurveNotSupported) {
				t.Fatalf("error %v does not wrap ErrCurveNotSupported", err)
			}
		})
	}
}

func TestReadConnectionFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	p := write("kernel-ok.json", validConn)
	ci, err := ReadConnectionFile(p)
	if err != nil || ci.Path != p || ci.ShellPort != 50001 {
		t.Fatalf("got %+v, %v", ci, err)
	}

	// Relative ipc paths are resolved against the file's directory.
	p = write("kernel-ipc.json", `{"transport":"ipc","ip":"kernel-ipc","shell_port":1,"iopub_port":2,"control_port":3,"hb_port":4}`)
	if ci, err = ReadConnectionFile(p); err != nil || ci.IP != filepath.Join(dir, "kernel-ipc") {
		t.Fatalf("got %+v, %v", ci, err)
	}

	missing := filepath.Join(dir, "kernel-gone.json")
	_, err = ReadConnectionFile(missing)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("missing file: %v", err)
	}

	for name, content := range map[string]string{
		"kernel-curve.json": `{"ip":"127.0.0.1","curve_secretkey":"s","shell_port":1,"iopub_port":2,"control_port":3,"hb_port":4}`,
		"kernel-trunc.json": validConn[:100],
		"kernel-big.json":   strings.Repeat(" ", maxConnectionFileBytes+10) + "{}",
	} {
		p := write(name, content)
		_, err := ReadConnectionFile(p)
		if err == nil || !strings.Contains(err.Error(), "kernel connection file "+p+": ") {
			t.Errorf("%s: error %v does not name the file", name, err)
		}
	}

	// A directory is not a connection file.
	if _, err := ReadConnectionFile(dir); err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("directory: %v", err)
	}
}

func FuzzParseConnectionInfo(f *testing.F) {
	f.Add([]byte(validConn))
	f.Add([]byte(`{"transport":"ipc","ip":"x","shell_port":1,"iopub_port":2,"control_port":3,"hb_port":4}`))
	f.Add([]byte(`{"curve_secretkey":""}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ci, err := ParseConnectionInfo(data)
		if err != nil {
			return
		}
		if err := ci.validate(); err != nil {
			t.Fatalf("parsed info fails validate: %v", err)
		}
		_ = ci.endpoint(ci.ShellPort)
	})
}
