package magics_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/magics"
	"github.com/gpumem/gpumem/protocol"
)

// feExecutor is a magics.Executor over a testenv.Frontend (jupyter_client):
// the tests drive real kernels through it, independent of package protocol's
// client.
type feExecutor struct{ fe *testenv.Frontend }

var _ magics.Executor = feExecutor{}

func (e feExecutor) Execute(ctx context.Context, code string, opts protocol.ExecuteOptions) (protocol.ExecuteReply, error) {
	r, err := e.fe.Execute(ctx, testenv.ExecuteRequest{Code: code, Silent: !opts.NotSilent,
		StoreHistory: opts.StoreHistory, UserExpressions: opts.UserExpressions})
	if err != nil {
		return protocol.ExecuteReply{}, err
	}
	var c struct {
		Status          string   `json:"status"`
		ExecutionCount  int      `json:"execution_count"`
		EName           string   `json:"ename"`
		EValue          string   `json:"evalue"`
		Traceback       []string `json:"traceback"`
		UserExpressions map[string]struct {
			Status string                     `json:"status"`
			Data   map[string]json.RawMessage `json:"data"`
			EName  string                     `json:"ename"`
			EValue string                     `json:"evalue"`
		} `json:"user_expressions"`
	}
	if err := json.Unmarshal(r.Reply, &c); err != nil {
		return protocol.ExecuteReply{}, fmt.Errorf("decode execute_reply: %w", err)
	}
	rep := protocol.ExecuteReply{Status: c.Status, ExecutionCount: c.ExecutionCount, EName: c.EName,
		EValue: c.EValue, Traceback: c.Traceback, UserExpressions: map[string]protocol.ExpressionResult{}}
	for k, v := range c.UserExpressions {
		rep.UserExpressions[k] = protocol.ExpressionResult{Status: v.Status, Data: v.Data, EName: v.EName, EValue: v.EValue}
	}
	return rep, nil
}

func (e feExecutor) KernelInfo(ctx context.Context) (protocol.KernelInfo, error) {
	content, header, err := e.fe.KernelInfo(ctx)
	if err != nil {
		return protocol.KernelInfo{}, err
	}
	var c struct {
		ProtocolVersion string `json:"protocol_version"`
		Implementation  string `json:"implementation"`
		Banner          string `json:"banner"`
		LanguageInfo    struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		} `json:"language_info"`
	}
	if err := json.Unmarshal(content, &c); err != nil {
		return protocol.KernelInfo{}, fmt.Errorf("decode kernel_info_reply: %w", err)
	}
	var h struct {
		Session string `json:"session"`
	}
	_ = json.Unmarshal(header, &h)
	return protocol.KernelInfo{ProtocolVersion: c.ProtocolVersion, Implementation: c.Implementation,
		Language: c.LanguageInfo.Name, LanguageVersion: c.LanguageInfo.Version, Banner: c.Banner, Session: h.Session}, nil
}

// session is one real kernel with a notebook-like frontend.
type session struct {
	t  testing.TB
	k  *testenv.Kernel
	fe *testenv.Frontend
	ex feExecutor
}

func newSession(t testing.TB, extraEnv ...string) *session {
	t.Helper()
	testenv.Require(t, "ipykernel", "jupyter_client")
	k := testenv.StartKernel(t, t.TempDir(), extraEnv...)
	fe := testenv.StartFrontend(t, k)
	return &session{t: t, k: k, fe: fe, ex: feExecutor{fe}}
}

func (s *session) inject(opts magics.InjectOptions) magics.InjectResult {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := magics.Inject(ctx, s.ex, opts)
	if err != nil {
		s.t.Fatalf("inject: %v (result %+v)", err, res)
	}
	return res
}

// cell runs code as a notebook cell and fails on a request error; with
// wantOK it also fails when the cell raised.
func (s *session) cell(code string, wantOK bool) testenv.FrontendReply {
	s.t.Helper()
	// A cell that may raise keeps the kernel's queue: the next request must
	// run, not be aborted.
	r, err := s.fe.Execute(context.Background(), testenv.ExecuteRequest{Code: code, StoreHistory: true, KeepQueue: !wantOK})
	if err != nil {
		s.t.Fatalf("cell %q: %v", code, err)
	}
	if wantOK && r.Status() != "ok" {
		s.t.Fatalf("cell %q: status %s: %s", code, r.Status(), r.Text())
	}
	return r
}

// probe runs code that prints one JSON object, decodes it into out, and
// returns the cell's reply.
func (s *session) probe(code string, out any) testenv.FrontendReply {
	s.t.Helper()
	r := s.cell(code, true)
	text := strings.TrimSpace(r.Text())
	if i := strings.LastIndex(text, "\n"); i >= 0 {
		text = text[i+1:]
	}
	if err := json.Unmarshal([]byte(text), out); err != nil {
		s.t.Fatalf("probe %q printed %q: %v", code, r.Text(), err)
	}
	return r
}

// magic runs a %gpumem line as a cell and returns its data dict (the
// vendor mime type) and text/plain; it fails if the cell raised or showed
// no gpumem output.
func (s *session) magic(line string) (map[string]any, string) {
	s.t.Helper()
	r := s.cell(line, true)
	var data map[string]any
	if !r.Data("application/vnd.gpumem.v1+json", &data) {
		s.t.Fatalf("%s: no gpumem output; outputs: %s", line, r.Text())
	}
	var text string
	r.Data("text/plain", &text)
	for _, o := range r.Outputs {
		if o.Type == "stream" || o.Type == "error" {
			s.t.Fatalf("%s: unexpected %s output: %s", line, o.Type, o.Content)
		}
	}
	return data, text
}

// runPlainPython runs code in a plain python3 (no IPython shell: what a
// non-IPython Python kernel would be) and evaluates the user expressions
// as ipykernel would, through _repr_json_.
func runPlainPython(ctx context.Context, code string, opts protocol.ExecuteOptions) (protocol.ExecuteReply, error) {
	const driver = `import json, sys
req = json.load(sys.stdin)
ns = {"__name__": "__main__"}
exec(req["code"], ns)
out = {}
for k, e in req["exprs"].items():
    v = eval(e, ns)
    d = {"text/plain": repr(v)}
    if hasattr(v, "_repr_json_"):
        d["application/json"] = v._repr_json_()
    out[k] = {"status": "ok", "data": d}
print(json.dumps(out))`
	in, err := json.Marshal(map[string]any{"code": code, "exprs": opts.UserExpressions})
	if err != nil {
		return protocol.ExecuteReply{}, err
	}
	cmd := exec.CommandContext(ctx, testenv.Python(), "-c", driver)
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.Output()
	if err != nil {
		return protocol.ExecuteReply{}, fmt.Errorf("plain python: %w", err)
	}
	var ue map[string]protocol.ExpressionResult
	if err := json.Unmarshal(out, &ue); err != nil {
		return protocol.ExecuteReply{}, fmt.Errorf("plain python: %q: %w", out, err)
	}
	return protocol.ExecuteReply{Status: "ok", UserExpressions: ue}, nil
}

func jsonUnmarshal(b []byte, out any) error { return json.Unmarshal(b, out) }
