package attribution

import (
	"testing"
)

func intp(i int) *int       { return &i }
func strp(s string) *string { return &s }

func TestGPUIndexOf(t *testing.T) {
	gpus := []GPU{{Index: 0, UUID: "GPU-aaaa-0000"}, {Index: 1, UUID: "GPU-bbbb-1111"}, {Index: 2, UUID: "GPU-cccc-2222"}}
	tests := []struct {
		name    string
		dev     WhyDevice
		visible *string
		want    int
		ok      bool
	}{
		{"by UUID, whatever CUDA's number", WhyDevice{Device: "cuda:0", UUID: "bbbb-1111"}, strp("0"), 1, true},
		{"CUDA's number", WhyDevice{Device: "cuda:2"}, nil, 2, true},
		{"through CUDA_VISIBLE_DEVICES indexes", WhyDevice{Device: "cuda:1", Index: intp(1)}, strp("2,0"), 0, true},
		{"through CUDA_VISIBLE_DEVICES UUIDs", WhyDevice{Device: "cuda:0"}, strp("GPU-cccc"), 2, true},
		{"past CUDA_VISIBLE_DEVICES", WhyDevice{Device: "cuda:3"}, strp("1"), 0, false},
		{"no such GPU", WhyDevice{Device: "cuda:7"}, nil, 0, false},
		{"not a CUDA device", WhyDevice{Device: "cpu"}, nil, 0, false},
	}
	for _, tt := range tests {
		got, ok := GPUIndexOf(tt.dev, tt.visible, gpus)
		if got != tt.want || ok != tt.ok {
			t.Errorf("%s: got %d, %v; want %d, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}

func TestJoinWhyAddsUp(t *testing.T) {
	gpus := []GPU{{Index: 0, UUID: "GPU-a"}, {Index: 1, UUID: "GPU-b"}}
	nb := Notebook{KernelID: "k", PIDs: []int{100, 101, 102}, GPUMemoryBytes: 6*gib + 518*mib + 800*mib + 3*gib,
		Processes: []ProcessBytes{
			on(100, g(0, 6*gib), g(1, 518*mib)),
			on(101, g(0, 800*mib)),
			on(102, g(1, 3*gib)),
		}}
	rep := Report{Notebooks: []Notebook{nb}}
	FlagStrayContexts(&rep, nil)
	nb = rep.Notebooks[0]
	k := WhyKernel{
		Devices: []WhyDevice{
			{Device: "cuda:0", Framework: "torch", Index: intp(0), UUID: "a", Held: 5 * gib, Used: 4 * gib},
			{Device: "cuda:0", Framework: "cupy", Held: 512 * mib},
		},
		ChildrenKnown: map[string]string{"101": "DataLoader worker 0 (persistent_workers)"},
	}
	j := JoinWhy(k, nb, gpus, map[int]string{102: "python3 -c spawn_main"})
	var sum int64 = 5*gib + 512*mib // the kernel's own rows add up to what the frameworks hold
	byCat := map[string][]WhyRow{}
	for _, r := range j.Rows {
		sum += r.Bytes
		byCat[r.Category] = append(byCat[r.Category], r)
	}
	if sum != int64(j.Driver.Bytes) || j.Driver.Unexplained != 0 {
		t.Fatalf("rows add up to %d, the driver's figure is %d (unexplained %d): %+v", sum, j.Driver.Bytes, j.Driver.Unexplained, j.Rows)
	}
	if o := byCat["outside"]; len(o) != 2 || o[0].Bytes != 512*mib || o[0].Device != "GPU 0" || o[1].Bytes != 518*mib {
		t.Errorf("outside rows: %+v", o)
	}
	if len(byCat["outside"]) == 2 && byCat["outside"][1].Name != "stray context (≈ 518 MiB)" {
		t.Errorf("the kernel's context on GPU 1 is not named as a stray context: %q", byCat["outside"][1].Name)
	}
	c := byCat["child"]
	if len(c) != 2 || c[0].Name != "pid 101: DataLoader worker 0 (persistent_workers)" || c[1].Name != "pid 102: python3 -c spawn_main" || c[1].Note != "" {
		t.Errorf("child rows: %+v", c)
	}
	if j.Evidence.PID != 100 || j.Evidence.Held[0] != 5*gib+512*mib || j.Evidence.DriverAt[1] != 518*mib {
		t.Errorf("evidence: %+v", j.Evidence)
	}
}

func TestJoinWhyUnexplained(t *testing.T) {
	gpus := []GPU{{Index: 0, UUID: "GPU-a"}}
	nb := Notebook{KernelID: "k", PIDs: []int{100}, GPUMemoryBytes: 2 * gib, Processes: []ProcessBytes{on(100, g(0, 2*gib))}}
	// The frameworks say they hold more than the driver counts, and some
	// of it on a device that matches no GPU.
	k := WhyKernel{Devices: []WhyDevice{
		{Device: "cuda:0", Framework: "torch", Held: 2*gib + 64*mib},
		{Device: "cuda:5", Framework: "torch", Held: 32 * mib},
	}}
	j := JoinWhy(k, nb, gpus, nil)
	if j.Driver.Unexplained != -96*mib {
		t.Fatalf("unexplained %d, want %d", j.Driver.Unexplained, -96*mib)
	}
	last := j.Rows[len(j.Rows)-1]
	if last.Category != "unexplained" || last.Bytes != -96*mib {
		t.Errorf("no unexplained row shown plainly: %+v", j.Rows)
	}
}
