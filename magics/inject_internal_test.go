package magics

import (
	"bytes"
	"compress/zlib"
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/internal/testenv"
)

func zsrc(t *testing.T, src string) string {
	var b bytes.Buffer
	w := zlib.NewWriter(&b)
	if _, err := w.Write([]byte(src)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b.Bytes())
}

// TestBootstrapFailureLeavesKernelUntouched: when the injected code fails
// (here: a source that raises while loading, then one that does not even
// compile), the request still succeeds, the report carries the error, and
// sys.last_*, last_execution_result, the namespace and sys.modules are as
// before; an earlier good injection stays in place.
func TestBootstrapFailureLeavesKernelUntouched(t *testing.T) {
	testenv.Require(t, "ipykernel", "jupyter_client")
	k := testenv.StartKernel(t, t.TempDir())
	fe := testenv.StartFrontend(t, k)
	ctx := context.Background()
	cell := func(code string) testenv.FrontendReply {
		r, err := fe.Execute(ctx, testenv.ExecuteRequest{Code: code, StoreHistory: true})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	cell("def f():\n    raise KeyError('mine')\nf()")
	for _, src := range []string{
		"import sys\nraise RuntimeError('broken magics')\n",
		"def (:\n",
		magicsSource, // a good one, then more broken ones: the good one must stay
		"raise ValueError('second')\n",
	} {
		code, expr, nonce, err := bootCodeFor(zsrc(t, src), "inject", map[string]any{"version": "t"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		r, err := fe.Execute(ctx, testenv.ExecuteRequest{Code: code, Silent: true, UserExpressions: map[string]string{"r": expr}})
		if err != nil {
			t.Fatal(err)
		}
		var reply struct {
			Status          string `json:"status"`
			UserExpressions map[string]struct {
				Data map[string]json.RawMessage `json:"data"`
			} `json:"user_expressions"`
		}
		if err := json.Unmarshal(r.Reply, &reply); err != nil {
			t.Fatal(err)
		}
		var rep bootReport
		if err := json.Unmarshal(reply.UserExpressions["r"].Data["application/json"], &rep); err != nil {
			t.Fatalf("no report: %s", r.Reply)
		}
		good := src == magicsSource
		if reply.Status != "ok" || rep.Nonce != nonce || rep.OK != good || (!good && rep.Error == "") {
			t.Errorf("source %.30q: status %s, report %+v", src, reply.Status, rep)
		}
		for _, o := range r.Outputs {
			t.Errorf("source %.30q: the silent request published %s: %s", src, o.Type, o.Content)
		}
	}
	r := cell(`import sys, json
ip = get_ipython()
print(json.dumps({"last": repr(sys.last_value), "ler": repr(ip.last_execution_result.error_in_exec), "count": ip.execution_count,
  "names": sorted(k for k in ip.user_ns if not k.startswith("_") and not ` + testenv.KernelOwnNames + `),
  "mods": sorted(m for m in sys.modules if "gpumem" in m), "version": sys.modules["_gpumem_magics"].VERSION}))`)
	var st struct {
		Last, Ler, Version string
		Count              int
		Names, Mods        []string
	}
	out := strings.TrimSpace(r.Text())
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("probe: %q: %v", out, err)
	}
	// The probe is the second cell; IPython 9 counts the running cell in
	// execution_count, IPython 8 does not: take the reply's count.
	st.Count = r.ExecutionCount()
	if st.Last != "KeyError('mine')" || st.Ler != "KeyError('mine')" || st.Count != 2 ||
		strings.Join(st.Names, ",") != "In,Out,exit,f,get_ipython,ip,json,quit,sys" ||
		strings.Join(st.Mods, ",") != "_gpumem_magics" || st.Version != "t" {
		t.Errorf("after failed injections: %+v", st)
	}
}
