package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var updateSeeds = flag.Bool("update-seeds", false, "rewrite testdata/fuzz/FuzzDecode seed corpus")

func TestSignKnownVector(t *testing.T) {
	// Computed with Python's hmac.new(key, digestmod=sha256) over the parts,
	// as jupyter_client's Session.sign does.
	header := `{"msg_id":"1","msg_type":"kernel_info_request","session":"s","username":"u","date":"","version":"5.3"}`
	got := Sign([]byte("secret-key"), []byte(header), []byte("{}"), []byte("{}"), []byte("{}"))
	if want := "0d04362837324596ae3cf306c60fbd64992bf81372e32383ac104b3c6f77bb7e"; got != want {
		t.Fatalf("got %s want %s", got, want)
	}
	if Sign(nil, []byte(header), nil, nil, nil) != "" {
		t.Fatal("empty key must not sign")
	}
}

func testMessage() *Message {
	return &Message{
		Identities: [][]byte{[]byte("id-1"), {0, 1, 2}},
		Header:     NewHeader("execute_request", "sess", "gpumem"),
		Parent:     Header{MsgID: "p1", MsgType: "kernel_info_request", Session: "other"},
		Metadata:   json.RawMessage(`{"a": 1}`),
		Content:    json.RawMessage(`{"code": "pass", "silent": true}`),
		Buffers:    [][]byte{[]byte("buf")},
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	key := []byte("k3y")
	for _, k := range [][]byte{key, nil} {
		in := testMessage()
		frames, err := Encode(in, k)
		if err != nil {
			t.Fatal(err)
		}
		if string(frames[2]) != Delimiter {
			t.Fatalf("delimiter at %q", frames[2])
		}
		if len(k) > 0 && (len(frames[3]) != 64 || strings.ToLower(string(frames[3])) != string(frames[3])) {
			t.Fatalf("signature %q is not 64 lowercase hex digits", frames[3])
		}
		out, err := Decode(frames, k, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if out.Header != in.Header || out.Parent != in.Parent ||
			!bytes.Equal(out.Content, in.Content) || !bytes.Equal(out.Metadata, in.Metadata) ||
			len(out.Identities) != 2 || len(out.Buffers) != 1 || string(out.Buffers[0]) != "buf" {
			t.Fatalf("round trip changed the message:\n%+v\n%+v", in, out)
		}
	}
}

func TestEncodeDefaults(t *testing.T) {
	m := &Message{Header: NewHeader("kernel_info_request", "s", "u")}
	frames, err := Encode(m, []byte("k"))
	if err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"parent", "metadata", "content"} {
		if got := string(frames[3+i]); got != "{}" {
			t.Errorf("%s encodes as %q, want {}", name, got)
		}
	}
	for _, bad := range []string{"null", "[]", `"x"`, "{"} {
		m.Metadata = json.RawMessage(bad)
		if _, err := Encode(m, nil); err == nil {
			t.Errorf("metadata %s accepted", bad)
		}
	}
	if _, err := Encode(&Message{}, nil); err == nil {
		t.Error("header without msg_id accepted")
	}
}

func TestNewHeaderFreshMsgID(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		h := NewHeader("x", "s", "u")
		if seen[h.MsgID] {
			t.Fatalf("msg_id %s repeated", h.MsgID)
		}
		seen[h.MsgID] = true
		if h.Version != "5.3" || h.Time().IsZero() {
			t.Fatalf("bad header %+v", h)
		}
	}
}

func signedFrames(t testing.TB, key []byte, header, parent, metadata, content string) [][]byte {
	t.Helper()
	sig := Sign(key, []byte(header), []byte(parent), []byte(metadata), []byte(content))
	return [][]byte{[]byte(Delimiter), []byte(sig), []byte(header), []byte(parent), []byte(metadata), []byte(content)}
}

func TestDecodeErrors(t *testing.T) {
	key := []byte("k")
	good := frames(t, key)
	if _, err := Decode(good, key, Limits{}); err != nil {
		t.Fatalf("good message: %v", err)
	}
	hdr := `{"msg_id":"m","msg_type":"status"}`
	replace := func(i int, b string) [][]byte {
		f := append([][]byte(nil), good...)
		f[i] = []byte(b)
		return f
	}
	big := bytes.Repeat([]byte("x"), 1025)
	tests := []struct {
		name   string
		frames [][]byte
		key    []byte
		lim    Limits
		want   error
	}{
		{"nil", nil, key, Limits{}, ErrMalformed},
		{"empty frames", [][]byte{{}, {}, {}}, key, Limits{}, ErrMalformed},
		{"no delimiter", good[1:], key, Limits{}, ErrMalformed},
		{"delimiter only", [][]byte{[]byte(Delimiter)}, key, Limits{}, ErrMalformed},
		{"truncated", good[:5], key, Limits{}, ErrMalformed},
		{"wrong key", good, []byte("other"), Limits{}, ErrBadSignature},
		{"no signature", replace(1, ""), key, Limits{}, ErrBadSignature},
		{"short signature", replace(1, "abcd"), key, Limits{}, ErrBadSignature},
		{"uppercase signature", replace(1, strings.ToUpper(string(good[1]))), key, Limits{}, ErrBadSignature},
		{"tampered content", replace(5, `{"execution_state":"busy"}`), key, Limits{}, ErrBadSignature},
		{"header not json", signedFrames(t, key, "{", "{}", "{}", "{}"), key, Limits{}, ErrMalformed},
		{"header array", signedFrames(t, key, "[]", "{}", "{}", "{}"), key, Limits{}, ErrMalformed},
		{"header null", signedFrames(t, key, "null", "{}", "{}", "{}"), key, Limits{}, ErrMalformed},
		{"header no msg_id", signedFrames(t, key, `{"msg_type":"status"}`, "{}", "{}", "{}"), key, Limits{}, ErrMalformed},
		{"header wrong types", signedFrames(t, key, `{"msg_id":1,"msg_type":"status"}`, "{}", "{}", "{}"), key, Limits{}, ErrMalformed},
		{"parent not object", signedFrames(t, key, hdr, "null", "{}", "{}"), key, Limits{}, ErrMalformed},
		{"metadata null", signedFrames(t, key, hdr, "{}", "null", "{}"), key, Limits{}, ErrMalformed},
		{"content array", signedFrames(t, key, hdr, "{}", "{}", "[1]"), key, Limits{}, ErrMalformed},
		{"content invalid", signedFrames(t, key, hdr, "{}", "{}", `{"a":}`), key, Limits{}, ErrMalformed},
		{"content deep", signedFrames(t, key, hdr, "{}", "{}", `{"a":`+strings.Repeat("[", 20000)+strings.Repeat("]", 20000)+`}`), key, Limits{}, ErrMalformed},
		{"frame too large", append(good, big), key, Limits{MaxFrameBytes: 1024}, ErrMalformed},
		{"too many frames", append(good, make([][]byte, 10)...), key, Limits{MaxFrames: 12}, ErrMalformed},
		{"message too large", append(good, big[:1000], big[:1000], big[:1000]), key, Limits{MaxFrameBytes: 1024}, ErrMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Decode(tc.frames, tc.key, tc.lim)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, %v; want %v", m, err, tc.want)
			}
		})
	}

	// Unsigned: the signature is not checked.
	unsigned := signedFrames(t, nil, hdr, "{}", "{}", "{}")
	unsigned[1] = []byte("anything")
	if _, err := Decode(unsigned, nil, Limits{}); err != nil {
		t.Fatalf("unsigned: %v", err)
	}
	// Identities before the delimiter, buffers after the content.
	f := append([][]byte{[]byte("kernel.x.status")}, good...)
	f = append(f, []byte("b1"), []byte("b2"))
	m, err := Decode(f, key, Limits{})
	if err != nil || len(m.Identities) != 1 || len(m.Buffers) != 2 {
		t.Fatalf("got %+v, %v", m, err)
	}
}

func frames(t testing.TB, key []byte) [][]byte {
	t.Helper()
	f, err := Encode(&Message{
		Header:  NewHeader("status", "s", "u"),
		Parent:  Header{MsgID: "p", MsgType: "execute_request"},
		Content: json.RawMessage(`{"execution_state":"idle"}`),
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// fuzzSep splits a fuzz input into frames.
var fuzzSep = []byte("|\x00|")

func joinFrames(frames [][]byte) []byte { return bytes.Join(frames, fuzzSep) }

const fuzzKey = "fuzz-key"

func fuzzSeeds() map[string][]byte {
	key := []byte(fuzzKey)
	fixed := func(msgType string) Header {
		return Header{MsgID: "00000000-0000-4000-8000-000000000001", MsgType: msgType, Session: "s",
			Username: "u", Date: "2026-01-02T03:04:05.000006Z", Version: Version}
	}
	m := testMessage()
	m.Header = fixed("execute_request")
	valid, _ := Encode(m, key)
	status, _ := Encode(&Message{
		Identities: [][]byte{[]byte("kernel.abc.status")},
		Header:     fixed("status"),
		Content:    json.RawMessage(`{"execution_state":"busy"}`),
	}, key)
	unsigned, _ := Encode(m, nil)
	hdr := `{"msg_id":"m","msg_type":"status"}`
	return map[string][]byte{
		"valid":          joinFrames(valid),
		"status":         joinFrames(status),
		"unsigned":       joinFrames(unsigned),
		"truncated":      joinFrames(valid[:5]),
		"no-delimiter":   joinFrames(valid[3:]),
		"bad-signature":  joinFrames(append([][]byte{valid[0], valid[1], valid[2], []byte(strings.Repeat("0", 64))}, valid[4:]...)),
		"metadata-null":  joinFrames([][]byte{[]byte(Delimiter), []byte(Sign(key, []byte(hdr), []byte("{}"), []byte("null"), []byte("{}"))), []byte(hdr), []byte("{}"), []byte("null"), []byte("{}")}),
		"header-array":   joinFrames([][]byte{[]byte(Delimiter), []byte(Sign(key, []byte("[]"), []byte("{}"), []byte("{}"), []byte("{}"))), []byte("[]"), []byte("{}"), []byte("{}"), []byte("{}")}),
		"empty":          {},
		"delimiter-only": []byte(Delimiter),
		"many-frames":    bytes.Repeat(fuzzSep, 50),
	}
}

// TestFuzzSeedCorpus keeps the committed corpus in sync with fuzzSeeds;
// run with -update-seeds to rewrite it.
func TestFuzzSeedCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDecode")
	for name, data := range fuzzSeeds() {
		content := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", data)
		p := filepath.Join(dir, name)
		if *updateSeeds {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("%v (run go test -run TestFuzzSeedCorpus -update-seeds)", err)
		}
		if string(got) != content {
			t.Errorf("%s differs from fuzzSeeds (run with -update-seeds)", p)
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, data := range fuzzSeeds() {
		f.Add(data)
	}
	lim := Limits{MaxFrameBytes: 1 << 16, MaxFrames: 64}
	f.Fuzz(func(t *testing.T, data []byte) {
		frames := bytes.Split(data, fuzzSep)
		for _, key := range [][]byte{[]byte(fuzzKey), nil} {
			m, err := Decode(frames, key, lim)
			if err != nil {
				if m != nil {
					t.Fatal("message and error")
				}
				continue
			}
			// Whatever decodes re-encodes and decodes to the same message.
			again, err := Encode(m, key)
			if err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			m2, err := Decode(again, key, Limits{})
			if err != nil {
				t.Fatalf("decode of re-encoded: %v", err)
			}
			if m2.Header != m.Header || m2.Parent != m.Parent || !bytes.Equal(m2.Content, m.Content) {
				t.Fatalf("re-encode changed the message")
			}
		}
	})
}
