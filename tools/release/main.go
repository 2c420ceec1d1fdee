// Command release cuts and checks releases of Ferry's modules: the
// repository holds one module per heavy integration, tied for development
// by go.work, and a release tags every module path at one version.
//
//	release set VERSION        every sibling require, and go.work's replaces, name VERSION
//	release proxy DIR                         a file module proxy of this tree at its version in DIR
//	                                         (GOPROXY=file://DIR, GOWORK=off: build as a user would)
//	release tidy               go mod tidy every module against a proxy of this tree
//	release check              no replace in a go.mod, one version for every sibling, no import of another module's internal/
//	release release VERSION [-dry-run]
//	                                         set, tidy, check, build, commit and tag every module path
//	                                         (-dry-run: all of it in a scratch clone, nothing here changes)
//	release prove [-keep]      from a scratch clone of HEAD, a module proxy of its tagged
//	                                         modules, and the proofs a user needs: go install of the
//	                                         command, the programs/ built with go get, an upgrade by go get -u
//
// It runs from its own module, outside the workspace (make release,
// make release/dry-run, make release/prove do: cd tools/release &&
// GOWORK=off go run . ...); it works on the repository above it.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

const usage = `usage: release set VERSION | proxy DIR | tidy | check | release VERSION [-dry-run] | prove [-keep]
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	dryRun := fs.Bool("dry-run", false, "release: do everything in a scratch clone; change nothing here")
	keep := fs.Bool("keep", false, "prove: keep the scratch directory and say where it is")
	var args []string
	rest := os.Args[2:]
	for len(rest) > 0 {
		if err := fs.Parse(rest); err != nil {
			os.Exit(2)
		}
		rest = fs.Args()
		if len(rest) > 0 {
			args, rest = append(args, rest[0]), rest[1:]
		}
	}
	root, err := repoRoot()
	if err != nil {
		fail(err)
	}
	ws, err := loadWorkspace(root)
	if err != nil {
		fail(err)
	}
	switch os.Args[1] {
	case "set":
		if len(args) != 1 {
			fail(fmt.Errorf("set needs a VERSION (v0.1.0)"))
		}
		err = ws.setVersion(args[0])
	case "tidy":
		err = ws.tidy()
	case "proxy":
		if len(args) != 1 {
			fail(fmt.Errorf("proxy needs a DIR"))
		}
		err = ws.proxy(args[0])
	case "check":
		var problems []string
		problems, err = ws.check()
		if err == nil && len(problems) > 0 {
			err = fmt.Errorf("%d problem(s):\n  %s", len(problems), joinLines(problems))
		}
	case "release":
		if len(args) != 1 {
			fail(fmt.Errorf("release needs a VERSION (v0.1.0)"))
		}
		err = release(ws, args[0], *dryRun)
	case "prove":
		err = prove(ws, *keep)
	default:
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	if err != nil {
		fail(err)
	}
}

// repoRoot is the nearest directory up from here with a go.work: the tool
// runs from its own module (GOWORK=off: the workspace's go.mod files may
// name versions no proxy has), the repository's root above it.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.work above the current directory: run from Ferry's repository")
		}
		dir = parent
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "release: %v\n", err)
	os.Exit(1)
}
