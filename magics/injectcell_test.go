package magics_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/magics"
	"github.com/gpumem/gpumem/protocol"
)

// codeRecorder is a Python 3 kernel that records the cell it is sent and
// answers nothing.
type codeRecorder struct{ code, expr string }

func (r *codeRecorder) KernelInfo(context.Context) (protocol.KernelInfo, error) {
	return protocol.KernelInfo{Language: "python", LanguageVersion: "3.12.1", Implementation: "ipython"}, nil
}

func (r *codeRecorder) Execute(_ context.Context, code string, opts protocol.ExecuteOptions) (protocol.ExecuteReply, error) {
	r.code, r.expr = code, opts.UserExpressions["gpumem"]
	return protocol.ExecuteReply{}, errors.New("recorder: no kernel")
}

// TestInjectCellIsWhatInjectSends: the cell a GPU-host script takes from
// `gpumem inject-cell` is byte for byte Inject's, nonce aside, for every
// option Inject has; and two cells never share a nonce.
func TestInjectCellIsWhatInjectSends(t *testing.T) {
	for _, opts := range []magics.InjectOptions{
		{},
		{SidecarSocket: "/run/gpumem/gpumem.sock", KernelID: "k-1", AlertFile: "/run/gpumem/gpumem-alerts.json"},
	} {
		rec := &codeRecorder{}
		if _, err := magics.Inject(context.Background(), rec, opts); err == nil || rec.code == "" {
			t.Fatalf("Inject through the recorder: %v, sent %d bytes", err, len(rec.code))
		}
		cell, err := magics.InjectCell(opts)
		if err != nil {
			t.Fatal(err)
		}
		if cell.Version != magics.Version() {
			t.Errorf("cell version %q, want %q", cell.Version, magics.Version())
		}
		sentNonce := strings.Fields(strings.SplitN(rec.code, "\n", 2)[0])[2]
		if sentNonce == cell.Nonce || len(cell.Nonce) != 32 {
			t.Fatalf("nonces: Inject's %q, the cell's %q: want two different fresh ones", sentNonce, cell.Nonce)
		}
		same := func(s, nonce string) string { return strings.ReplaceAll(s, nonce, "NONCE") }
		if same(cell.Code, cell.Nonce) != same(rec.code, sentNonce) {
			t.Errorf("opts %+v: the cell's code differs from what Inject sends", opts)
		}
		if same(cell.Expr, cell.Nonce) != same(rec.expr, sentNonce) {
			t.Errorf("opts %+v: expression %q, Inject's %q", opts, cell.Expr, rec.expr)
		}
	}
}

// TestInjectCellInKernel: the cell, sent by another client as a GPU-host
// script sends it (a silent execute with the expression), registers the
// magics: the report is ok and carries the cell's nonce, and GetStatus
// then finds the cell's version.
func TestInjectCellInKernel(t *testing.T) {
	s := newSession(t)
	cell, err := magics.InjectCell(magics.InjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	before, err := magics.GetStatus(ctx, s.ex)
	if err != nil || before.Injected {
		t.Fatalf("status before the cell: %+v, %v: want not injected", before, err)
	}
	reply, err := s.ex.Execute(ctx, cell.Code, protocol.ExecuteOptions{UserExpressions: map[string]string{"gpumem": cell.Expr}})
	if err != nil || reply.Status != "ok" {
		t.Fatalf("execute the cell: %+v, %v", reply, err)
	}
	var rep struct {
		OK    bool   `json:"ok"`
		Nonce string `json:"nonce"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(reply.UserExpressions["gpumem"].Data["application/json"], &rep); err != nil {
		t.Fatalf("the cell's report: %v (%+v)", err, reply.UserExpressions)
	}
	if !rep.OK || rep.Nonce != cell.Nonce {
		t.Fatalf("report %+v: want ok with nonce %s", rep, cell.Nonce)
	}
	after, err := magics.GetStatus(ctx, s.ex)
	if err != nil || !after.Injected || after.Version != cell.Version {
		t.Fatalf("status after the cell: %+v, %v: want injected, version %s", after, err, cell.Version)
	}
}
