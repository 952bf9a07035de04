package benchkit

import (
	"fmt"
	"io"
)

// Check prints one acceptance line, [PASS] or [FAIL], and returns ok.
func Check(w io.Writer, ok bool, format string, a ...any) bool {
	mark := "PASS"
	if !ok {
		mark = "FAIL"
	}
	fmt.Fprintf(w, "  [%s] %s\n", mark, fmt.Sprintf(format, a...))
	return ok
}
