package kube

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/gpumem/gpumem/internal/syncutil"
	"github.com/gpumem/gpumem/internal/testenv"
)

// controlPlane is a real Kubernetes control plane: etcd and kube-apiserver,
// built from the modules controlplane/go.mod pins (tools.sh, cached), run
// by the test on 127.0.0.1 with certificates it makes, and ended at its
// cleanup. Clients authenticate with a client certificate (the admin, in
// system:masters) or with service account tokens the API server signs.
type controlPlane struct {
	t         *testing.T
	dir       string
	apiserver string // its binary
	apiArgs   []string
	api       *server
	etcd      *server
	etcdURL   string
	URL       string // https://127.0.0.1:port
	// Service is the API server as pods reach it, through the kubernetes
	// Service: only while it is ready (serviceProxy).
	Service *serviceProxy
	CA      []byte // PEM
	admin   *http.Client
	audit   string // the audit log: every request of the daemon's user agent
	// Kubeconfig is an admin's kubeconfig file, for helm.
	Kubeconfig string
}

// server is a control plane process and its log.
type server struct {
	name   string
	cmd    *exec.Cmd
	log    *syncutil.Buffer
	exited chan struct{}
}

// controlPlaneTools are the binaries and files tools.sh made for the
// versions controlplane/ pins.
type controlPlaneTools struct {
	apiserver, etcd, serviceMonitorCRD string
	kubeVersion                        string
}

func findControlPlaneTools(t *testing.T) controlPlaneTools {
	t.Helper()
	gomod, err := os.ReadFile("controlplane/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	version := func(module string) string {
		m := regexp.MustCompile(`(?m)^(?:require)?\s*` + regexp.QuoteMeta(module) + ` (v\S+)`).FindSubmatch(gomod)
		if m == nil {
			t.Fatalf("controlplane/go.mod requires no %s", module)
		}
		return string(m[1])
	}
	operator, err := os.ReadFile("controlplane/prometheus-operator-version")
	if err != nil {
		t.Fatal(err)
	}
	const build = "bash tests/kube/tools.sh controlplane"
	kube := version("k8s.io/kubernetes")
	return controlPlaneTools{
		apiserver:         filepath.Join(cachedTool(t, "kube-apiserver", kube, build), "kube-apiserver"),
		etcd:              filepath.Join(cachedTool(t, "etcd", version("go.etcd.io/etcd/server/v3"), build), "etcd"),
		serviceMonitorCRD: filepath.Join(cachedTool(t, "prometheus-operator-crds", strings.TrimSpace(string(operator)), build), "monitoring.coreos.com_servicemonitors.yaml"),
		kubeVersion:       kube,
	}
}

// startControlPlane starts etcd, then kube-apiserver on it, and waits (90
// s: a first start on a loaded 2-core machine takes a while) until the API
// server says it is ready.
func startControlPlane(t *testing.T, tools controlPlaneTools) *controlPlane {
	t.Helper()
	// Short: etcd's and the API server's sockets and files live here.
	dir, err := os.MkdirTemp("", "gpumem-k8s-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cp := &controlPlane{t: t, dir: dir, apiserver: tools.apiserver}
	pki := newPKI(t, dir)
	cp.CA = pki.caPEM

	// A port free a moment ago may be taken by another test's server by
	// the time etcd binds it: then etcd exits at once, and is tried again
	// on others.
	plain := &http.Client{Timeout: 5 * time.Second}
	for attempt := 1; ; attempt++ {
		cp.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t))
		peer := fmt.Sprintf("http://127.0.0.1:%d", testenv.FreePort(t))
		cp.etcd = startServer(t, "etcd", tools.etcd,
			"--name=test", "--data-dir="+filepath.Join(dir, fmt.Sprintf("etcd-%d", attempt)),
			"--listen-client-urls="+cp.etcdURL, "--advertise-client-urls="+cp.etcdURL,
			"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer, "--initial-cluster=test="+peer,
			// A test's data: losing it in a crash loses nothing.
			"--unsafe-no-fsync", "--log-level=warn")
		if cp.waitUp(cp.etcd, "etcd's /health", attempt < 3, func() bool {
			resp, err := plain.Get(cp.etcdURL + "/health")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			var h struct{ Health string }
			return json.NewDecoder(resp.Body).Decode(&h) == nil && h.Health == "true"
		}) {
			break
		}
	}

	// Only the daemon's requests are audited (its user agent, whatever
	// it authenticates as, refused ones too): what it asked, and what the
	// API server answered.
	policy := filepath.Join(dir, "audit-policy.yaml")
	writeFile(t, policy, []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n  - level: Metadata\n"))
	cp.audit = filepath.Join(dir, "audit.log")
	apiPort := testenv.FreePort(t)
	cp.URL = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	cp.apiArgs = []string{
		"--etcd-servers=" + cp.etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=" + strconv.Itoa(apiPort),
		"--tls-cert-file=" + pki.serverCert, "--tls-private-key-file=" + pki.serverKey,
		"--client-ca-file=" + pki.caFile, "--cert-dir=" + filepath.Join(dir, "certs"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + pki.saPub, "--service-account-signing-key-file=" + pki.saKey,
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=RBAC",
		// No node runs here to serve the kubernetes Service's endpoints.
		"--endpoint-reconciler-type=none",
		"--audit-policy-file=" + policy, "--audit-log-path=" + cp.audit,
		"--profiling=false",
	}
	cert, err := tls.LoadX509KeyPair(pki.adminCert, pki.adminKey)
	if err != nil {
		t.Fatal(err)
	}
	cp.admin = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pki.pool, Certificates: []tls.Certificate{cert}}}}
	cp.startAPIServer()
	cp.Service = newServiceProxy(t, fmt.Sprintf("127.0.0.1:%d", apiPort))
	t.Cleanup(func() { cp.Service.down(); cp.api.stop(t) })

	cp.Kubeconfig = filepath.Join(dir, "kubeconfig")
	writeFile(t, cp.Kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: admin, user: {client-certificate: %q, client-key: %q}}]
contexts: [{name: test, context: {cluster: test, user: admin}}]
current-context: test
`, cp.URL, pki.caFile, pki.adminCert, pki.adminKey)))
	return cp
}

// startAPIServer starts kube-apiserver and waits for its /readyz: every
// post-start hook done, RBAC's bootstrap roles among them.
func (cp *controlPlane) startAPIServer() {
	cp.t.Helper()
	cp.api = startServer(cp.t, "kube-apiserver", cp.apiserver, cp.apiArgs...)
	cp.waitUp(cp.api, "kube-apiserver's /readyz", false, func() bool {
		code, _ := cp.do("", http.MethodGet, "/readyz", nil, nil)
		return code == http.StatusOK
	})
}

// restartAPIServer stops the API server (its clients' watches break)
// and, once between (the API server down), runs between, then starts it
// again on the same port with the same arguments. Its Service routes to it
// again once it is ready.
func (cp *controlPlane) restartAPIServer(between func()) {
	cp.t.Helper()
	cp.Service.down()
	cp.api.stop(cp.t)
	if between != nil {
		between()
	}
	cp.startAPIServer()
	cp.Service.up()
}

// serviceProxy plays the kubernetes Service in front of the API server,
// as a pod reaches it: a TCP port whose connections are passed on to the
// API server while it is ready, and that refuses connections while it is
// not (a Service without a ready endpoint). A restarted API server answers
// before its caches (RBAC's among them) are filled, and the Service keeps
// pods from it until then.
type serviceProxy struct {
	t       *testing.T
	backend string
	addr    string // where pods connect: 127.0.0.1:port

	mu    sync.Mutex
	l     net.Listener
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

func newServiceProxy(t *testing.T, backend string) *serviceProxy {
	p := &serviceProxy{t: t, backend: backend, addr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), conns: map[net.Conn]bool{}}
	p.up()
	return p
}

// URL is the Service's address, as https://host:port.
func (p *serviceProxy) URL() string { return "https://" + p.addr }

// up opens the Service's port again (the same port: its clients keep it).
func (p *serviceProxy) up() {
	p.t.Helper()
	var l net.Listener
	if !testenv.Eventually(10*time.Second, func() bool {
		var err error
		l, err = net.Listen("tcp", p.addr)
		return err == nil
	}) {
		p.t.Fatalf("the API server's Service cannot listen on %s again", p.addr)
	}
	p.mu.Lock()
	p.l = l
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return // closed by down
			}
			p.wg.Go(func() { p.pass(c) })
		}
	})
}

func (p *serviceProxy) pass(c net.Conn) {
	b, err := net.DialTimeout("tcp", p.backend, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.l == nil { // down meanwhile
		p.mu.Unlock()
		c.Close()
		b.Close()
		return
	}
	p.conns[c], p.conns[b] = true, true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(b, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, b); done <- struct{}{} }()
	<-done
	c.Close()
	b.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, b)
	p.mu.Unlock()
}

// down closes the Service's port and every connection through it, and
// waits until each is done.
func (p *serviceProxy) down() {
	p.mu.Lock()
	if p.l != nil {
		p.l.Close()
		p.l = nil
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// waitUp waits until ready says s is; false when s exited first because
// its port was taken and retry allows another try.
func (cp *controlPlane) waitUp(s *server, what string, retry bool, ready func() bool) bool {
	cp.t.Helper()
	ok := testenv.Eventually(90*time.Second, func() bool {
		select {
		case <-s.exited:
			return true
		default:
		}
		return ready()
	})
	select {
	case <-s.exited:
		if retry && strings.Contains(s.log.String(), "address already in use") {
			return false
		}
		cp.t.Fatalf("%s exited before %s answered:\n%s", s.name, what, tail(s.log.String(), 4000))
	default:
	}
	if !ok {
		cp.t.Fatalf("%s did not answer within 90s:\n%s", what, tail(s.log.String(), 4000))
	}
	return true
}

func startServer(t *testing.T, name, bin string, args ...string) *server {
	t.Helper()
	s := &server{name: name, cmd: exec.Command(bin, args...), log: &syncutil.Buffer{}, exited: make(chan struct{})}
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	// Its own process group: a ^C to the test is not its signal to stop
	// before the test's cleanup does. A test binary killed before its
	// cleanup leaves it to TestMain's subreaper.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() { s.stop(t) })
	return s
}

// stop ends the server: SIGTERM, then SIGKILL after 20 s. Stopping a
// stopped server does nothing.
func (s *server) stop(t *testing.T) {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		t.Errorf("%s did not end within 20s of SIGTERM: killed; its log:\n%s", s.name, tail(s.log.String(), 3000))
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// do sends one request to the API server, as the admin (token "") or with
// a bearer token, and decodes a JSON answer into out (when not nil). It
// returns the HTTP status and the body.
func (cp *controlPlane) do(token, method, path string, in, out any) (int, []byte) {
	cp.t.Helper()
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			cp.t.Fatal(err)
		}
		body = bytes.NewReader(data)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, cp.URL+path, body)
	if err != nil {
		cp.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if method == http.MethodPatch {
		req.Header.Set("Content-Type", "application/merge-patch+json")
	}
	client := cp.admin
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
		client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: cp.admin.Transport.(*http.Transport).TLSClientConfig.RootCAs}}}
		defer client.CloseIdleConnections()
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(data, out); err != nil {
			cp.t.Fatalf("%s %s: %v\n%s", method, path, err, data)
		}
	}
	return resp.StatusCode, data
}

// must is do as the admin, failing the test unless the answer is 2xx.
func (cp *controlPlane) must(method, path string, in, out any) {
	cp.t.Helper()
	if code, body := cp.do("", method, path, in, out); code/100 != 2 {
		cp.t.Fatalf("%s %s: %d %s", method, path, code, body)
	}
}

// etcdRevision is etcd's current revision, through its JSON gateway.
func (cp *controlPlane) etcdRevision() int64 {
	cp.t.Helper()
	var out struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	cp.etcdCall("/v3/kv/range", map[string]string{"key": base64.StdEncoding.EncodeToString([]byte("/"))}, &out)
	rev, err := strconv.ParseInt(out.Header.Revision, 10, 64)
	if err != nil {
		cp.t.Fatalf("etcd's revision %q: %v", out.Header.Revision, err)
	}
	return rev
}

// compactEtcd writes a key (so that the revision moves past every
// client's) and compacts etcd's history to it: a watch from any earlier
// resource version is then expired (410 Gone).
func (cp *controlPlane) compactEtcd() int64 {
	cp.t.Helper()
	cp.etcdCall("/v3/kv/put", map[string]string{
		"key":   base64.StdEncoding.EncodeToString([]byte("/gpumem-test/compaction")),
		"value": base64.StdEncoding.EncodeToString([]byte("x")),
	}, nil)
	rev := cp.etcdRevision()
	cp.etcdCall("/v3/kv/compaction", map[string]any{"revision": strconv.FormatInt(rev, 10), "physical": true}, nil)
	return rev
}

func (cp *controlPlane) etcdCall(path string, in, out any) {
	cp.t.Helper()
	data, err := json.Marshal(in)
	if err != nil {
		cp.t.Fatal(err)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Post(cp.etcdURL+path, "application/json", bytes.NewReader(data))
	if err != nil {
		cp.t.Fatalf("etcd %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		cp.t.Fatalf("etcd %s: %s %s", path, resp.Status, body)
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			cp.t.Fatalf("etcd %s: %v\n%s", path, err, body)
		}
	}
}

// auditEvent is the part of an audit.k8s.io/v1 Event the tests read.
type auditEvent struct {
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	UserAgent  string `json:"userAgent"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	Stage string `json:"stage"`
}

// auditOf is every request the audit log holds from user agents starting
// with agent, in order, once each.
func (cp *controlPlane) auditOf(agent string) []auditEvent {
	cp.t.Helper()
	data, err := os.ReadFile(cp.audit)
	if err != nil {
		cp.t.Fatal(err)
	}
	var events []auditEvent
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e auditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			cp.t.Fatalf("audit log line %q: %v", sc.Text(), err)
		}
		// A watch is logged when its answer starts and when it ends; a
		// request refused authentication only when its answer starts.
		if strings.HasPrefix(e.UserAgent, agent) && (e.Stage != "ResponseStarted" || e.ResponseStatus.Code == http.StatusUnauthorized) {
			events = append(events, e)
		}
	}
	return events
}

// pki is the control plane's certificates and keys, in files under dir.
type pki struct {
	caPEM                 []byte
	pool                  *x509.CertPool
	caFile                string
	serverCert, serverKey string
	adminCert, adminKey   string
	saKey, saPub          string
}

// newPKI makes a CA, the API server's serving certificate (127.0.0.1), an
// admin's client certificate (in system:masters) and the service accounts'
// signing key, all ECDSA P-256.
func newPKI(t *testing.T, dir string) *pki {
	t.Helper()
	p := &pki{}
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	writeKey := func(name string, k *ecdsa.PrivateKey) string {
		der, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		writeFile(t, path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))
		return path
	}
	serial := int64(1)
	now := time.Now()
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "gpumem-test-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	p.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	p.pool = x509.NewCertPool()
	p.pool.AddCert(ca)
	p.caFile = filepath.Join(dir, "ca.crt")
	writeFile(t, p.caFile, p.caPEM)
	issue := func(name string, tmpl *x509.Certificate) (string, string) {
		serial++
		k := key()
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(24*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		certFile := filepath.Join(dir, name+".crt")
		writeFile(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
		return certFile, writeKey(name+".key", k)
	}
	p.serverCert, p.serverKey = issue("apiserver", &x509.Certificate{Subject: pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.ParseIP("10.96.0.1")},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"}})
	p.adminCert, p.adminKey = issue("admin", &x509.Certificate{Subject: pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	saKey := key()
	p.saKey = writeKey("sa.key", saKey)
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	p.saPub = filepath.Join(dir, "sa.pub")
	writeFile(t, p.saPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))
	return p
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// yamlToJSON converts a YAML document to the JSON the API takes.
func yamlToJSON(t *testing.T, doc []byte) json.RawMessage {
	t.Helper()
	out, err := yaml.YAMLToJSON(doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
