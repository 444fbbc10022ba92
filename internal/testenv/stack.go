package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
)

// Stack is a Jupyter stack the integration tests run against, chosen by
// GPUMEM_TEST_STACK:
//
//   - debian12 (the default): Debian 12's packages under /usr/bin/python3
//     (Notebook 6.4, jupyter_server 1.23, jupyter_client 7.4, ipykernel 6.17,
//     IPython 8.5).
//   - current: the virtualenv .venv/current built by scripts/test.sh from
//     requirements/current.txt (JupyterLab 4, Notebook 7, jupyter_server 2,
//     jupyter_client 8, ipykernel 7, IPython 9), seeing Debian's CPU torch
//     through --system-site-packages.
//   - ipykernel6: .venv/ipykernel6 (ipykernel 6.29, IPython 8), for the
//     protocol and magics tests.
//
// GPUMEM_TEST_PYTHON, when set, overrides the stack's interpreter.
type Stack string

// The stacks scripts/test.sh runs.
const (
	Debian12   Stack = "debian12"
	Current    Stack = "current"
	IPykernel6 Stack = "ipykernel6"
)

var (
	stackOnce sync.Once
	stack     Stack
	stackErr  error
)

// CurrentStack is the stack GPUMEM_TEST_STACK selects. An unknown name
// panics at the first use: a typo must not silently test Debian's stack.
func CurrentStack() Stack {
	stackOnce.Do(func() {
		stack = Stack(os.Getenv("GPUMEM_TEST_STACK"))
		switch stack {
		case "":
			stack = Debian12
		case Debian12, Current, IPykernel6:
		default:
			stackErr = fmt.Errorf("GPUMEM_TEST_STACK=%q: want debian12, current or ipykernel6", string(stack))
		}
	})
	if stackErr != nil {
		panic(stackErr)
	}
	return stack
}

// RepoRoot is the repository's root (where .venv lives), found from this
// file's place in the source tree.
func RepoRoot() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		panic("testenv: cannot locate its own source file")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Python is the interpreter of the stack under test: kernels, servers and
// test frontends all run under it.
func Python() string {
	if p := os.Getenv("GPUMEM_TEST_PYTHON"); p != "" {
		return p
	}
	if s := CurrentStack(); s != Debian12 {
		return filepath.Join(RepoRoot(), ".venv", string(s), "bin", "python")
	}
	return "/usr/bin/python3"
}

// BinDir is where the stack's console scripts (jupyter, papermill,
// jupyter-console) live.
func BinDir() string { return filepath.Dir(Python()) }

// stackHint tells what to run when the stack's interpreter or a module is
// missing.
func stackHint() string {
	if CurrentStack() == Debian12 {
		return "run the README's test command (it installs them with apt-get)"
	}
	return fmt.Sprintf("run the README's test command (it builds .venv/%s from requirements/%s.txt)", CurrentStack(), CurrentStack())
}

// NotebookServer is the stack's `jupyter notebook`: Notebook 7 on
// jupyter_server 2 on the current stack (jpserver-*.json), Debian's Notebook
// 6 elsewhere (nbserver-*.json; the ipykernel6 virtualenv sees it).
func NotebookServer() ServerKind {
	if CurrentStack() == Current {
		return Notebook7
	}
	return Notebook6
}

// ServerKinds is every server the stack offers: Notebook 6 and
// jupyter_server on Debian 12; JupyterLab 4, Notebook 7 and jupyter_server 2
// on the current stack.
func ServerKinds() []ServerKind {
	switch CurrentStack() {
	case Debian12:
		return []ServerKind{Notebook6, JupyterServer}
	case Current:
		return []ServerKind{JupyterLab, Notebook7, JupyterServer}
	default:
		return []ServerKind{JupyterServer}
	}
}
