package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/magics"
)

// TestInjectCellCommand: inject-cell prints the magics' cell as JSON, a
// fresh nonce each time, takes no arguments, and the usage does not list it.
func TestInjectCellCommand(t *testing.T) {
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Run(context.Background(), args, Env{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }})
		return code, out.String(), errb.String()
	}
	var nonces []string
	for range 2 {
		code, out, errs := run("inject-cell")
		var cell magics.Cell
		if err := json.Unmarshal([]byte(out), &cell); code != 0 || err != nil || errs != "" {
			t.Fatalf("inject-cell: exit %d, %v, stderr %q", code, err, errs)
		}
		if !strings.HasPrefix(cell.Code, "# gpumem-inject "+cell.Nonce+"\n") || !strings.Contains(cell.Expr, cell.Nonce) ||
			cell.Version != magics.Version() {
			t.Errorf("inject-cell: nonce %q, version %q, expr %q, code starts %.40q", cell.Nonce, cell.Version, cell.Expr, cell.Code)
		}
		nonces = append(nonces, cell.Nonce)
	}
	if nonces[0] == nonces[1] {
		t.Errorf("two cells share the nonce %s", nonces[0])
	}
	if code, _, errs := run("inject-cell", "extra"); code != 2 || !strings.Contains(errs, "takes no arguments") {
		t.Errorf("inject-cell extra: exit %d, stderr %q; want 2, takes no arguments", code, errs)
	}
	if _, help, _ := run("help"); strings.Contains(help, "inject-cell") {
		t.Errorf("the usage lists the hidden inject-cell:\n%s", help)
	}
}
