package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Issue 12, item 10: kvgate --version says which build this is.
func TestVersion(t *testing.T) {
	for _, arg := range []string{"--version", "-version", "version"} {
		code, out, _ := runCLI(t, arg)
		if code != exitOK || !strings.HasPrefix(out, "kvgate ") || !strings.Contains(out, runtime.Version()) {
			t.Errorf("%s: exit %d: %q", arg, code, out)
		}
	}
}

// Issue 12, item 10: the load tester's reports, written where the README's
// example writes them, are not picked up by git.
func TestRunOutputsAreIgnored(t *testing.T) {
	data, err := os.ReadFile("../../.gitignore")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"run.json", "run.csv", "run.html"} {
		ignored := false
		for _, line := range strings.Split(string(data), "\n") {
			pat := strings.TrimPrefix(strings.TrimSpace(line), "/")
			if ok, _ := filepath.Match(pat, f); ok && pat != "" && !strings.HasPrefix(pat, "#") {
				ignored = true
			}
		}
		if !ignored {
			t.Errorf(".gitignore does not cover %s", f)
		}
	}
}

// Issue 12, item 13: the repository speaks of the product alone — no notes
// on how its authors work, no paths of the machine it was built on.
func TestRepositorySpeaksOfTheProduct(t *testing.T) {
	root := "../.."
	if _, err := os.Stat(filepath.Join(root, "docs", "HELPERS.md")); err == nil {
		t.Error("docs/HELPERS.md describes the team's way of working, not the product")
	}
	// Spelled in pieces so that this file does not match itself.
	marks := []string{"/" + "work/", "bash" + "_jobs", "." + "library/", "work" + "tree"}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == ".git" || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(p) {
		case ".go", ".md", ".yaml", ".yml", ".sh", "":
		default:
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.ContainsRune(string(data), 0) {
			return nil // a built binary, not the repository's text
		}
		for _, m := range marks {
			if strings.Contains(string(data), m) {
				t.Errorf("%s mentions %q", p, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
