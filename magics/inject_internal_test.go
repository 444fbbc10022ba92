package magics

import (
	"context"
	"encoding/json"
	"maps"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/internal/testenv"
)

// bundleWith is the embedded package with module replaced by src ("" =
// unchanged), compressed as it travels.
func bundleWith(t *testing.T, module, src string) string {
	t.Helper()
	m := sources()
	if src != "" {
		m = maps.Clone(m)
		m[module] = src
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return compress(b)
}

// TestBootstrapFailureLeavesKernelUntouched: when the injected code fails
// (a module that raises while loading, even KeyboardInterrupt or
// SystemExit, one that does not compile, a broken package __init__),
// the request still succeeds, the report carries the error, and
// execution_count, In, history, sys.last_*, last_execution_result,
// linecache, the namespace and sys.modules are as before; an earlier good
// injection stays in place.
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
	for _, c := range []struct{ module, src string }{
		{"render", "import sys\nraise RuntimeError('broken magics')\n"},
		{"units", "def (:\n"},
		{"probes", "raise KeyboardInterrupt\n"},
		{"daemon", "raise SystemExit(3)\n"},
		{"", ""}, // a good one, then more broken ones: the good one must stay
		{"holders", "raise ValueError('second')\n"},
		{"__init__", "raise ValueError('third')\n"},
	} {
		src := c.module + ": " + c.src
		code, expr, nonce, err := bootCodeFor(bundleWith(t, c.module, c.src), "inject", map[string]any{"version": "t"}, nil)
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
		good := c.module == ""
		if reply.Status != "ok" || rep.Nonce != nonce || rep.OK != good || (!good && rep.Error == "") {
			t.Errorf("source %.30q: status %s, report %+v", src, reply.Status, rep)
		}
		for _, o := range r.Outputs {
			t.Errorf("source %.30q: the silent request published %s: %s", src, o.Type, o.Content)
		}
	}
	r := cell(`import sys, json, linecache
ip = get_ipython()
print(json.dumps({"last": repr(sys.last_value), "ler": repr(ip.last_execution_result.error_in_exec), "count": ip.execution_count,
  "names": sorted(k for k in ip.user_ns if not k.startswith("_") and not ` + testenv.KernelOwnNames + `),
  "n_in": len(In), "n_hist": len(ip.history_manager.input_hist_raw),
  "inject_in_linecache": [k for k, e in list(linecache.cache.items()) if len(e) > 2 and e[2] and "gpumem-" "inject" in e[2][0]],
  "mods": sorted(m for m in sys.modules if "gpumem" in m),
  "version": sys.modules["_gpumem_magics"].magic.version()}))`)
	var st struct {
		Last, Ler, Version string
		Count              int
		NIn                int `json:"n_in"`
		NHist              int `json:"n_hist"`
		Names, Mods        []string
		InjectInLinecache  []string `json:"inject_in_linecache"`
	}
	out := strings.TrimSpace(r.Text())
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("probe: %q: %v", out, err)
	}
	// The probe is the second cell; IPython 9 counts the running cell in
	// execution_count, IPython 8 does not: take the reply's count.
	st.Count = r.ExecutionCount()
	if st.Last != "KeyError('mine')" || st.Ler != "KeyError('mine')" || st.Count != 2 || st.NIn != 3 || st.NHist != 3 ||
		len(st.InjectInLinecache) != 0 ||
		strings.Join(st.Names, ",") != "In,Out,exit,f,get_ipython,ip,json,linecache,quit,sys" ||
		strings.Join(st.Mods, ",") != "_gpumem_magics" || st.Version != "t" {
		t.Errorf("after failed injections: %+v", st)
	}
}
