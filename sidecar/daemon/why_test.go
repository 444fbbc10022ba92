package daemon

import (
	"encoding/json"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// A kernel's why data is read by field: what the join needs, typed; the
// rest kept as the kernel wrote it; anything else refused (422).
func TestDecodeWhy(t *testing.T) {
	for _, c := range []struct {
		name, data string
		err        string // "" for none
		rows       int
		devices    int
	}{
		{"a kernel's data", `{"kind":"why","schema":1,"text":"t","rows":[{"category":"variables","chain":["x"]}],` +
			`"devices":[{"device":"cuda:0","framework":"torch","held":5}],"children_known":{"7":"pool"}}`, "", 1, 1},
		{"no rows", `{"kind":"why"}`, "", 0, 0},
		{"not an object", `[1,2]`, "not a JSON object", 0, 0},
		{"null", `null`, "not a JSON object", 0, 0},
		{"another kind", `{"kind":"vars","rows":[]}`, "of kind", 0, 0},
		{"no kind", `{"rows":[]}`, "of kind", 0, 0},
		{"rows not a list", `{"kind":"why","rows":{"a":1}}`, "rows are not a list", 0, 0},
		{"devices not a list", `{"kind":"why","devices":"cuda:0"}`, "why data", 0, 0},
	} {
		fields, k, rows, err := decodeWhy([]byte(c.data))
		if c.err != "" {
			if !errors.Is(err, api.ErrRefused) || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %v, want a refusal saying %q", c.name, err, c.err)
			}
			continue
		}
		var list []json.RawMessage
		if json.Unmarshal(rows, &list) != nil {
			t.Errorf("%s: rows %s", c.name, rows)
		}
		if err != nil || len(list) != c.rows || len(k.Devices) != c.devices || string(fields["kind"]) != `"why"` {
			t.Errorf("%s: %d rows, %d devices, %v", c.name, len(list), len(k.Devices), err)
		}
		if c.name == "a kernel's data" && (string(fields["text"]) != `"t"` || k.ChildrenKnown["7"] != "pool") {
			t.Errorf("%s: fields %v, children %v: the kernel's fields are not kept as written", c.name, fields, k.ChildrenKnown)
		}
	}
}

// The body the API admits at most, of the smallest rows (the costliest to
// decode generically), costs a few times its size to read, not tens.
func TestDecodeWhyCostsAFewTimesItsSize(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"kind":"why","rows":[{"a":1}`)
	for b.Len() < 255<<10 {
		b.WriteString(`,{"a":1}`)
	}
	b.WriteString("]}")
	data := []byte(b.String())
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, _, rows, err := decodeWhy(data)
	runtime.ReadMemStats(&after)
	if err != nil || len(rows) < len(data)-100 {
		t.Fatalf("%d bytes of rows, %v", len(rows), err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 4*uint64(len(data)) {
		t.Errorf("decoding %d bytes of why data allocated %d bytes: more than 4 times its size", len(data), got)
	}
}

// The join's rows follow the kernel's, in one valid list.
func TestAppendRows(t *testing.T) {
	more := []attribution.WhyRow{{Category: "child", Name: "w", Bytes: 1}}
	for _, c := range []struct{ rows, want string }{
		{`[]`, `[{"category":"child"`},
		{`[ ]`, `[{"category":"child"`},
		{`[{"a":1}]`, `[{"a":1},{"category":"child"`},
		{` [ {"a":1} , {"b":2} ] `, `[{"a":1} , {"b":2},{"category":"child"`},
	} {
		rows := []byte(strings.TrimSpace(c.rows))
		got, err := appendRows(rows, more)
		var list []map[string]any
		if err != nil || !strings.HasPrefix(string(got), c.want) || json.Unmarshal(got, &list) != nil {
			t.Errorf("appendRows(%s) = %s, %v", c.rows, got, err)
		}
	}
	if got, _ := appendRows([]byte(`[{"a":1}]`), nil); string(got) != `[{"a":1}]` {
		t.Errorf("appendRows of nothing = %s", got)
	}
}
