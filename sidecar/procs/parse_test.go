package procs

import (
	"net"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParseStat(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    statFields
		wantErr string
	}{
		{
			name: "real line",
			in:   "16472 (cat) R 16467 16467 8630 0 -1 4194304 99 0 0 0 0 0 0 0 20 0 1 0 57190 3133440 412 18446744073709551615 93998765264896 93998765284777 140723207413744 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 93998765300784 93998765302400 93999412461568 140723207416317 140723207416337 140723207416337 140723207417835 0\n",
			want: statFields{PID: 16472, Comm: "cat", State: 'R', PPID: 16467, PGID: 16467, SID: 8630, StartTime: 57190},
		},
		{
			name: "comm with spaces and parentheses",
			in:   "7 (a) b (c)) S 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 123 0 0",
			want: statFields{PID: 7, Comm: "a) b (c)", State: 'S', PPID: 1, PGID: 7, SID: 7, StartTime: 123},
		},
		{
			name: "empty comm, kernel thread with ppid 0",
			in:   "2 () S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 18446744073709551615 0 0",
			want: statFields{PID: 2, State: 'S', PPID: 0, StartTime: 18446744073709551615},
		},
		{
			name: "zombie",
			in:   "99 (defunct) Z 98 98 98 0 -1 4227084 0 0 0 0 0 0 0 0 20 0 1 0 4242 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0",
			want: statFields{PID: 99, Comm: "defunct", State: 'Z', PPID: 98, PGID: 98, SID: 98, StartTime: 4242},
		},
		{name: "empty", in: "", wantErr: "no (comm)"},
		{name: "no closing paren", in: "5 (abc S 1 2 3", wantErr: "no (comm)"},
		{name: "bad pid", in: "x5 (a) S 1 2 3 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1", wantErr: "pid"},
		{name: "truncated before starttime", in: "5 (a) S 1 5 5 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0\n", wantErr: "fields after comm"},
		{name: "bad ppid", in: "5 (a) S x 5 5 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1", wantErr: "field 4"},
		{name: "bad starttime", in: "5 (a) S 1 5 5 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 -1", wantErr: "field 22"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStat([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestParseStatus(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    statusFields
		wantErr bool
	}{
		{"host process", "Name:\tcat\nPid:\t5\nUid:\t1000\t1001\t1001\t1001\nGid:\t0\t0\t0\t0\nNSpid:\t5\n", statusFields{UID: 1001, NSpid: []int{5}}, false},
		{"nested namespaces", "Uid:\t0\t0\t0\t0\nNSpid:\t51234\t812\t1\n", statusFields{UID: 0, NSpid: []int{51234, 812, 1}}, false},
		{"old kernel without NSpid", "Name:\tx\nUid:\t7\t7\t7\t7\n", statusFields{UID: 7}, false},
		{"NSpid before Uid, no trailing newline", "NSpid:\t9\t2\nUid:\t3\t4\t5\t6", statusFields{UID: 4, NSpid: []int{9, 2}}, false},
		{"NStgid is not NSpid", "Uid:\t1\t1\t1\t1\nNStgid:\t8\nNSpid:\t9\n", statusFields{UID: 1, NSpid: []int{9}}, false},
		{"no Uid", "Name:\tx\n", statusFields{}, true},
		{"short Uid", "Uid:\t1\n", statusFields{}, true},
		{"bad uid", "Uid:\t1\tx\t1\t1\n", statusFields{}, true},
		{"bad NSpid", "Uid:\t1\t1\t1\t1\nNSpid:\tx\n", statusFields{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStatus([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if !tt.wantErr && !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseCmdline(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"\x00", nil},
		{"python3\x00-m\x00ipykernel_launcher\x00-f\x00/k.json\x00", []string{"python3", "-m", "ipykernel_launcher", "-f", "/k.json"}},
		{"a\x00\x00b\x00", []string{"a", "", "b"}},
		{"nginx: worker process", []string{"nginx: worker process"}}, // setproctitle: no NULs
	}
	for _, tt := range tests {
		if got := parseCmdline([]byte(tt.in)); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("parseCmdline(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestEnvironValue(t *testing.T) {
	tests := []struct {
		in, key, want string
		ok            bool
	}{
		{"A=1\x00JPY_SESSION_NAME=/home/a/b c.ipynb\x00Z=2\x00", "JPY_SESSION_NAME", "/home/a/b c.ipynb", true},
		{"JPY_SESSION_NAME=x", "JPY_SESSION_NAME", "x", true},
		{"JPY_SESSION_NAME=\x00", "JPY_SESSION_NAME", "", true},
		{"XJPY_SESSION_NAME=x\x00JPY_SESSION_NAMES=y\x00", "JPY_SESSION_NAME", "", false},
		{"", "JPY_SESSION_NAME", "", false},
	}
	for _, tt := range tests {
		got, ok := environValue([]byte(tt.in), tt.key)
		if got != tt.want || ok != tt.ok {
			t.Errorf("environValue(%q) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestParseNetTCP(t *testing.T) {
	const header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
	tests := []struct {
		name    string
		in      string
		want    map[int][]Listener
		wantErr bool
	}{
		{
			name: "tcp: listen on loopback and any, skip established and time-wait",
			in: header +
				"   0: 0100007F:CB21 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1234567 1 0000000000000000 100 0 0 10 0\n" +
				"   1: 00000000:22B8 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1234568 1 0000000000000000 100 0 0 10 0\n" +
				"   2: 0100007F:CB21 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1000        0 1234569 1 0000000000000000 20 4 30 10 -1\n" +
				"   3: 0100007F:1F90 0100007F:9C41 06 00000000:00000000 03:00000BB8 00000000     0        0 0 3 0000000000000000\n",
			want: map[int][]Listener{0xCB21: {{IP: net.IPv4(127, 0, 0, 1).To4(), Inode: 1234567, UID: 1000}}, 0x22B8: {{IP: net.IPv4zero.To4(), Inode: 1234568, UID: 1000}}},
		},
		{
			name: "tcp6",
			in: header +
				"   0: 00000000000000000000000001000000:CB22 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 7654321 1 0000000000000000 100 0 0 10 0\n",
			want: map[int][]Listener{0xCB22: {{IP: net.IPv6loopback, Inode: 7654321, UID: 1000}}},
		},
		{name: "header only", in: header, want: map[int][]Listener{}},
		{name: "bad address", in: header + "   0: 0100:CB21 00000000:0000 0A 0:0 0:0 0 0 0 5\n", wantErr: true},
		{name: "no header", in: "garbage\n", wantErr: true},
		{name: "short line", in: header + "   0: 0100007F:CB21 00000000:0000 0A\n", wantErr: true},
		{name: "bad port", in: header + "   0: 0100007F:XYZW 00000000:0000 0A 0:0 0:0 0 0 0 5\n", wantErr: true},
		{name: "bad uid", in: header + "   0: 0100007F:0050 00000000:0000 0A 0:0 0:0 0 u 0 5\n", wantErr: true},
		{name: "bad inode", in: header + "   0: 0100007F:0050 00000000:0000 0A 0:0 0:0 0 0 0 x\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := map[int][]Listener{}
			err := parseNetTCP([]byte(tt.in), got)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if !tt.wantErr && !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestParseSocketLink(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"socket:[12345]", 12345, true},
		{"socket:[]", 0, false},
		{"socket:[12a]", 0, false},
		{"pipe:[12345]", 0, false},
		{"/dev/null", 0, false},
		{"socket:[1", 0, false},
	}
	for _, tt := range tests {
		got, ok := parseSocketLink(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseSocketLink(%q) = %d, %v", tt.in, got, ok)
		}
	}
}

func FuzzParseStat(f *testing.F) {
	f.Add([]byte("16472 (cat) R 16467 16467 8630 0 -1 4194304 99 0 0 0 0 0 0 0 20 0 1 0 57190 3133440 412"))
	f.Add([]byte("1 ((() S"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = parseStat(data) // must not panic
	})
}

func TestCommandLine(t *testing.T) {
	tests := []struct {
		argv []string
		comm string
		max  int
		want string
	}{
		{[]string{"python", "-m", "ipykernel_launcher"}, "", 80, "python -m ipykernel_launcher"},
		{[]string{"python", "-c", "import x\nx.run()"}, "", 80, "python -c import x x.run()"},
		{[]string{"abcdefgh"}, "", 6, "abc…"},
		{[]string{"éééé"}, "", 6, "é…"}, // never half a character
		{nil, "kworker/0:1", 80, "[kworker/0:1]"},
		{nil, "", 5, ""},
	}
	for _, tc := range tests {
		if got := CommandLine(tc.argv, tc.comm, tc.max); got != tc.want || !utf8.ValidString(got) || len(got) > max(tc.max, 0) {
			t.Errorf("CommandLine(%q, %d) = %q, want %q", tc.argv, tc.max, got, tc.want)
		}
	}
}
