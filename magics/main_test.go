package magics_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// TestMain fails the run if a protocol client's or a test frontend's
// goroutine outlives the tests (every one is closed in t.Cleanup).
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if left := testenv.WaitGoroutinesGone(10*time.Second, "gpumem/protocol.", "testenv.StartFrontend", "net/http.(*Server).Serve"); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "%d goroutines leaked:\n\n%s\n", len(left), strings.Join(left, "\n\n"))
			code = 1
		}
	}
	os.Exit(code)
}
