package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// version is the release, set at build time with
// -ldflags "-X main.version=v1.2.3"; without it the module version the Go
// toolchain recorded is used ("(devel)" for a build from a checkout).
var version = ""

// versionString describes the build: release, commit (and whether the tree
// was modified), Go version.
func versionString() string {
	v, rev, modified := version, "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	var parts []string
	if rev != "" {
		c := "commit " + rev[:min(len(rev), 12)]
		if modified {
			c += ", modified"
		}
		parts = append(parts, c)
	}
	parts = append(parts, runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH)
	return fmt.Sprintf("kvgate %s (%s)", v, strings.Join(parts, ", "))
}
